"""Write small valid seed inputs for the fuzz targets into tests/fuzz/corpus/<target>/,
and the hostile inputs kept as regressions (hostile_*). Run with the project venv (numpy,
safetensors, gguf, tokenizers). Seeds are generated, not copied."""
import json, os, struct, sys

import numpy as np
import gguf
from safetensors.numpy import save
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
def out(target, name, data):
    os.makedirs(os.path.join(root, target), exist_ok=True)
    with open(os.path.join(root, target, name), "wb") as f:
        f.write(data)

rng = np.random.default_rng(0)
out("safetensors", "seed_three_dtypes", save({"a": rng.standard_normal((2, 3)).astype(np.float32),
                                               "b": rng.standard_normal((4,)).astype(np.float16),
                                               "c": np.zeros((0, 5), np.float32)}, metadata={"format": "pt"}))

# llama2.c: dim 8, hidden 16, 1 layer, 2 heads, 1 kv head, vocab 6 (shared), seq_len 4
dim, hid, L, H, KV, V, S = 8, 16, 1, 2, 1, 6, 4
D = dim // H
n = V * dim + L * (dim + dim * dim + 2 * KV * D * dim + dim * dim + dim + 3 * hid * dim) + dim + S * D
out("llama2c", "seed_model", struct.pack("<7i", dim, hid, L, H, KV, V, S) + rng.standard_normal(n).astype("<f4").tobytes())
pieces = [b"<unk>", b"\n<s>\n", b"\n</s>\n"] + [b"<0x%02X>" % i for i in range(3)] + [b" ", b"a", b"b", b" ab"]
tok = struct.pack("<i", len(pieces) - 3)   # first byte drives n_vocab = 3 + data[0] in the target
for i, p in enumerate(pieces):
    tok += struct.pack("<fi", -float(i), len(p)) + p
out("llama2c", "seed_tokenizer", tok)

# GGUF: a 1-layer llama with byte-level tokenizer and one tensor of each supported type
path = os.path.join(root, "gguf_seed.tmp")
w = gguf.GGUFWriter(path, arch="llama")
w.add_block_count(1); w.add_embedding_length(32); w.add_context_length(16)
w.add_head_count(2); w.add_head_count_kv(1); w.add_feed_forward_length(32)
w.add_rope_freq_base(10000.0); w.add_layer_norm_rms_eps(1e-5)
bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
cs, k = bs[:], 0
for b in range(256):
    if b not in bs:
        bs.append(b); cs.append(256 + k); k += 1
toks = [chr(c) for c in cs] + ["he", "ll", "llo", "<|end|>"]
w.add_tokenizer_model("gpt2"); w.add_tokenizer_pre("smollm")
w.add_token_list(toks); w.add_token_types([1] * 259 + [3])
w.add_token_merges(["h e", "l l", "ll o"]); w.add_eos_token_id(259)
def q(name, arr, qt):
    w.add_tensor(name, gguf.quants.quantize(arr, qt), raw_dtype=qt)
q("token_embd.weight", rng.standard_normal((261, 32)).astype(np.float32), gguf.GGMLQuantizationType.Q8_0)
q("blk.0.attn_norm.weight", np.ones(32, np.float32), gguf.GGMLQuantizationType.F32)
q("blk.0.attn_q.weight", rng.standard_normal((32, 32)).astype(np.float32), gguf.GGMLQuantizationType.Q4_0)
q("blk.0.attn_k.weight", rng.standard_normal((16, 32)).astype(np.float32), gguf.GGMLQuantizationType.Q4_1)
q("blk.0.attn_v.weight", rng.standard_normal((16, 32)).astype(np.float32), gguf.GGMLQuantizationType.F16)
q("blk.0.attn_output.weight", rng.standard_normal((32, 32)).astype(np.float32), gguf.GGMLQuantizationType.BF16)
w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
with open(path, "rb") as f:
    out("gguf", "seed_llama_bytelevel", f.read())
os.remove(path)
# Hostile inputs found by fuzzing and by hand, kept as regressions (hostile_*): each must be
# refused cleanly (or load correctly) in bounded time and memory.
def st_image(header, data_len):
    h = json.dumps(header, separators=(",", ":")).encode()
    return struct.pack("<Q", len(h)) + h + bytes(data_len)
def st_t(shape, begin, end, dtype="F32"):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}
# a [0,256) and b [128,384) overlap; the empty z [64,64) sorted between them hid it
out("safetensors", "hostile_overlap_behind_empty",
    st_image({"a": st_t([64], 0, 256), "z": st_t([0], 64, 64), "b": st_t([64], 128, 384)}, 384))

# fuzz_safetensors reads several shards of one model separated by this line
SHARD_SEP = b"\n--next shard--\n"
out("safetensors", "seed_two_shards", st_image({"a": st_t([2], 0, 8), "__metadata__": {"format": "pt"}}, 8) +
    SHARD_SEP + st_image({"b": st_t([3], 0, 6, "BF16"), "c": st_t([0], 6, 6)}, 6))
out("safetensors", "hostile_same_name_two_shards", st_image({"a": st_t([2], 0, 8)}, 8) + SHARD_SEP +
    st_image({"a": st_t([2], 0, 8)}, 8))
# many empty tensors over two shards (the unit test opens 2 x 100k; checks were quadratic)
out("safetensors", "hostile_many_empty_two_shards",
    SHARD_SEP.join(st_image({"%s%d" % (p, i): st_t([0], 0, 0) for i in range(400)}, 0) for p in "ab"))

# metadata-only GGUF claiming a 1 GiB llama (loading it allocated the claim before the check)
path = os.path.join(root, "gguf_hostile.tmp")
w = gguf.GGUFWriter(path, arch="llama")
w.add_block_count(4); w.add_embedding_length(2048); w.add_head_count(16)
w.add_feed_forward_length(5632); w.add_vocab_size(32000)
w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
with open(path, "rb") as f:
    out("gguf", "hostile_metadata_only_1gib_claim", f.read())
os.remove(path)

# byte-level tokenizer whose bos_token_id is 2^32 + 5 (it was read as 5)
path = os.path.join(root, "gguf_hostile.tmp")
w = gguf.GGUFWriter(path, arch="llama")
w.add_tokenizer_model("gpt2"); w.add_token_list(["a", "b", "c", "d", "ab", "cd", "<s>", "</s>"])
w.add_token_merges(["a b", "c d"])
w.add_uint64("tokenizer.ggml.bos_token_id", 2**32 + 5)
w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
with open(path, "rb") as f:
    out("gguf", "hostile_bos_id_2p32_plus_5", f.read())
os.remove(path)

# a token one byte over the 1 MiB per-token limit (reported as "out of memory")
path = os.path.join(root, "gguf_hostile.tmp")
w = gguf.GGUFWriter(path, arch="llama")
w.add_tokenizer_model("gpt2"); w.add_token_list(["a", "b", "x" * ((1 << 20) + 1)]); w.add_token_merges([])
w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
with open(path, "rb") as f:
    out("gguf", "hostile_token_over_1mib", f.read())
os.remove(path)

out("tokenizer", "seed_text", "hello the  world\n\n 12345 <|x|> café 🤗 ab ba".encode("utf-8"))

# HF config.json (storage/hfconfig.c): the three families, rope scaling, and a valid claim of
# a 1 GiB model (with a 1 MB model.safetensors it used to be allocated before the check)
def cfg(name, **kw):
    out("hfconfig", name, json.dumps(kw, indent=2, sort_keys=True).encode())
cfg("seed_llama_smollm", architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=49152, hidden_size=576,
    intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, head_dim=64,
    max_position_embeddings=8192, rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
    rope_scaling=None, attention_bias=False)
cfg("seed_llama3_rope", architectures=["LlamaForCausalLM"], vocab_size=128256, hidden_size=64, intermediate_size=128,
    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, rope_theta=500000.0,
    rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192})
cfg("seed_mistral_linear", model_type="mistral", vocab_size=32000, hidden_size=64, intermediate_size=224,
    num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2, sliding_window=None,
    rope_scaling={"type": "linear", "factor": 2.0})
cfg("seed_qwen2_bias", architectures=["Qwen2ForCausalLM"], vocab_size=151936, hidden_size=64, intermediate_size=128,
    num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=4, use_sliding_window=False,
    sliding_window=4096, max_position_embeddings=4096, tie_word_embeddings=False,
    rope_scaling={"rope_type": "dynamic", "factor": 2.0})
cfg("seed_mamba2_hf", architectures=["Mamba2ForCausalLM"], model_type="mamba2", vocab_size=512, hidden_size=32,
    num_hidden_layers=2, num_heads=8, head_dim=4, expand=1, state_size=6, n_groups=2, conv_kernel=4,
    layer_norm_epsilon=1e-5, use_bias=False, use_conv_bias=True, rms_norm=True, tie_word_embeddings=False)
cfg("seed_mamba2_ssm", d_model=32, d_intermediate=0, n_layer=2, vocab_size=500, pad_vocab_size_multiple=16,
    ssm_cfg={"layer": "Mamba2", "d_state": 6, "headdim": 4, "ngroups": 1, "expand": 2}, attn_layer_idx=[],
    rms_norm=True, tie_embeddings=True)
cfg("seed_olmoe", architectures=["OlmoeForCausalLM"], model_type="olmoe", vocab_size=512, hidden_size=32,
    intermediate_size=12, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, num_experts=6,
    num_experts_per_tok=2, norm_topk_prob=False, clip_qkv=None, rms_norm_eps=1e-5, rope_theta=10000.0,
    tie_word_embeddings=False)
cfg("hostile_1gib_claim", architectures=["LlamaForCausalLM"], hidden_size=2048, intermediate_size=5632,
    num_hidden_layers=4, num_attention_heads=16, vocab_size=32000, tie_word_embeddings=True)

# HF tokenizer.json (storage/tokload.c), written by the tokenizers package: a byte-level
# BPE with digits split, special tokens and a BOS template; a SentencePiece-style BPE
# with byte fallback and the Llama-2 normalizer
bl = sorted(pre_tokenizers.ByteLevel.alphabet())
vocab = {c: i for i, c in enumerate(bl)}
merges = [("h", "e"), ("l", "l"), ("ll", "o"), ("\u0120", "t"), ("he", "llo")]
for a, b in merges:
    vocab[a + b] = len(vocab)
t = Tokenizer(models.BPE(vocab=vocab, merges=merges))
t.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                           pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
t.decoder = decoders.ByteLevel()
t.add_special_tokens(["<|endoftext|>", "<s>"])
t.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", t.token_to_id("<s>"))])
out("tokenizer_json", "seed_bytelevel", t.to_str().encode())
sp = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)] + ["\u2581", "a", "b", "ab", "\u2581a", "\u2581ab"]
vocab = {p: i for i, p in enumerate(sp)}
t = Tokenizer(models.BPE(vocab=vocab, merges=[("a", "b"), ("\u2581", "a"), ("\u2581a", "b")], byte_fallback=True,
                         unk_token="<unk>"))
t.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
t.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                               decoders.Strip(" ", 1, 0)])
t.add_special_tokens(["<unk>", "<s>", "</s>"])
t.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
out("tokenizer_json", "seed_spm_byte_fallback", t.to_str().encode())
def tok_json(vocab_members, added="[]"):
    return ('{"model":{"type":"BPE","vocab":{%s},"merges":[]},"added_tokens":%s,'
            '"pre_tokenizer":{"type":"ByteLevel"}}' % (vocab_members, added)).encode()
# 18 keys for one id: every key took a piece-table slot until lookups never ended
out("tokenizer_json", "hostile_18_keys_one_id", tok_json(",".join('"k%02d":2' % i for i in range(18))))
# a token one byte over the 1 MiB per-token limit (reported as "out of memory")
out("tokenizer_json", "hostile_token_over_1mib", tok_json('"a":0,"%s":1' % ("x" * ((1 << 20) + 1))))
print("seeds written under", root)
