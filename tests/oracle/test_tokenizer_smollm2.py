"""Oracle for the tokenizers (engine/tokenizer.c via storage/tokload.c, driven through
tools/ac_tokenize) on a varied corpus (Unicode, runs of spaces and newlines, digits, code,
control bytes, special tokens, wikitext slices):
  - SmolLM2's GGUF byte-level BPE encodes id-for-id like an HF `tokenizers` BPE built from
    the same vocab, merges and pre-tokenizer (Digits(individual) + ByteLevel);
  - the same vocabulary behind the GPT-2, Llama-3 (Split + ignore_merges) and Qwen2
    pre-tokenizers, written as tokenizer.json and read by our HF loader, also matches HF, and
    as GGUF metadata under llama.cpp's names "qwen2" and "olmo" (Qwen2-MoE's, OLMoE's);
  - llama2.c's tok512.bin (and the same vocabulary as a GGUF "llama" tokenizer) encodes
    like a direct Python port of llama2.c's encode();
  - decode(encode(x)) == x for every kind (bytes a vocabulary lacks are dropped, as HF does)."""
import json, os, subprocess, sys

import gguf
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, AddedToken, Regex

build = os.path.dirname(os.environ["AC_BIN"])
tool = os.path.join(build, "tools", "ac_tokenize")
shared = os.environ["AC_SHARED"]
model = subprocess.run(["sh", "scripts/fetch-models.sh"], capture_output=True, text=True, check=True).stdout.strip()

corpus = [
    "Hello world", "Hello  world", "   leading spaces", "trailing spaces   ", "tabs\tand\t\ttabs",
    "newlines\n\nand\r\nCRLF\n", "\n\n\n", " ", "", "a", "12345678901234567890", "3.14159 and 2,718",
    "def f(x):\n    return x**2  # square\n", "for (int i = 0; i < n; i++) { a[i] += b[i]; }",
    "C'est déjà l'été à Paris — naïve café", "Ünïcödé: ñ, ß, ø, å, ç", "日本語のテキストです。", "中文文本，测试分词。",
    "Emoji: 🤗🚀👍🏽 and ZWJ 👨‍👩‍👧", "Greek: αβγδ ΑΒΓΔ, Cyrillic: привет мир", "Arabic: مرحبا بالعالم",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n", "mixed<|endoftext|>specials",
    "I'm sure they've done it, we'll see; you'd know. DON'T SHOUT", "http://example.com/path?q=1&r=2#frag",
    "ctrl\x04\x06\x13 chars\x1d and \x00\x1b[0m", "snake_case camelCase PascalCase kebab-case", "a\u00a0non-breaking\u2009thin\u3000ideographic space",
    "$$$ %%% ^^^ &&& *** ((( )))", "line1\n  indented\n\tline3", "x" * 300, "ab " * 50,
]
wiki = os.path.join(shared, "data/text/wikitext-2-raw/wiki.test.raw")
with open(wiki, encoding="utf-8", newline="") as f:
    text = f.read()
corpus += [text[i:i + 2000] for i in range(0, 60000, 6000)]

# HF tokenizer from the GGUF's own vocab and merges
r = gguf.GGUFReader(model)
def field(name):
    return r.fields[name]
def strings(name):
    fl = field(name)
    return [bytes(fl.parts[i]).decode("utf-8") for i in fl.data]
tokens = strings("tokenizer.ggml.tokens")
merges = strings("tokenizer.ggml.merges")
types = [int(field("tokenizer.ggml.token_type").parts[i][0]) for i in field("tokenizer.ggml.token_type").data]
pre = bytes(field("tokenizer.ggml.pre").parts[-1]).decode()
assert pre == "smollm", pre
vocab = {t: i for i, t in enumerate(tokens)}
hf = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m.split(" ", 1)) for m in merges]))
hf.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
hf.decoder = decoders.ByteLevel()
hf.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty == 3])

out = subprocess.run([tool, "gguf", model], input=json.dumps(corpus), capture_output=True, text=True)
assert out.returncode == 0, out.stderr
ours = json.loads(out.stdout)
fails = 0
total = 0
for text, got in zip(corpus, ours):
    want = hf.encode(text, add_special_tokens=False).ids
    total += len(want)
    if got["ids"] != want:
        fails += 1
        print("MISMATCH", repr(text[:80]), "\n  ours", got["ids"][:40], "\n  hf  ", want[:40])
    lacking = "\x04\x06\x13\x14\x16\x1d"   # bytes SmolLM2's vocabulary has no symbol for: dropped
    if got["decoded"] != "".join(c for c in text if c not in lacking):
        fails += 1
        print("ROUND TRIP", repr(text[:80]), "->", repr(got["decoded"][:80]))
print(f"smollm2 byte-level BPE: {len(corpus)} texts, {total} tokens, {fails} failures")

# The same vocabulary and merges behind the GPT-2 and Llama-3 pre-tokenizers (Llama-3 also
# with ignore_merges), written as tokenizer.json and read by our HF loader: checks those
# regexes under PCRE2 against HF's Oniguruma, and the Split / ByteLevel / ignore_merges paths.
import tempfile
llama3_re = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
qwen2_re = llama3_re.replace(r"\p{N}{1,3}", r"\p{N}")   # Qwen2's tokenizer.json: digits one at a time
variants = {
    "gpt2": (pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True), False),
    "llama3": (pre_tokenizers.Sequence([pre_tokenizers.Split(pattern=Regex(llama3_re),
                                                             behavior="isolated"),
                                        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]), True),
    "qwen2": (pre_tokenizers.Sequence([pre_tokenizers.Split(pattern=Regex(qwen2_re), behavior="isolated"),
                                       pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]), False),
}
hf_variants = {}
with tempfile.TemporaryDirectory() as tmp:
    for vname, (pt, ignore) in variants.items():
        v = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m.split(" ", 1)) for m in merges], ignore_merges=ignore))
        v.pre_tokenizer = pt
        v.decoder = decoders.ByteLevel()
        v.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty == 3])
        path = os.path.join(tmp, vname + ".json")
        v.save(path)
        out = subprocess.run([tool, "hf", path], input=json.dumps(corpus), capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        bad = 0
        for text, got in zip(corpus, json.loads(out.stdout)):
            want = v.encode(text, add_special_tokens=False).ids
            if got["ids"] != want or got["decoded"] != "".join(c for c in text if c not in "\x04\x06\x13\x14\x16\x1d"):
                bad += 1
                print(vname, "MISMATCH", repr(text[:80]), "\n  ours", got["ids"][:30], "\n  hf  ", want[:30])
        fails += bad
        hf_variants[vname] = v
        print(f"{vname} pre-tokenizer over the SmolLM2 vocabulary (tokenizer.json): {len(corpus)} texts, {bad} failures")
    # The same vocabulary as a GGUF byte-level BPE under llama.cpp's pre-tokenizer names
    # (Qwen2-MoE GGUFs say "qwen2", OLMoE's "olmo"): the engine's GGUF loader encodes as HF
    for pre, vname in (("qwen2", "qwen2"), ("olmo", "gpt2")):
        gpath = os.path.join(tmp, pre + ".gguf")
        w = gguf.GGUFWriter(gpath, arch="llama")
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(pre)
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_merges(merges)
        w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
        out = subprocess.run([tool, "gguf", gpath], input=json.dumps(corpus), capture_output=True, text=True)
        if out.returncode != 0:
            fails += 1
            print("GGUF pre %s: the engine cannot load it: %s" % (pre, out.stderr.strip()[-300:]))
            continue
        bad = 0
        for text, got in zip(corpus, json.loads(out.stdout)):
            if got["ids"] != hf_variants[vname].encode(text, add_special_tokens=False).ids:
                bad += 1
                print("GGUF pre", pre, "MISMATCH", repr(text[:80]), got["ids"][:30])
        fails += bad
        print(f"GGUF tokenizer.ggml.pre '{pre}' over the SmolLM2 vocabulary: {len(corpus)} texts, {bad} failures")

# llama2.c SentencePiece tokenizer: ids equal a direct port of llama2.c's encode()
# (run.c: dummy prefix, code points looked up or byte fallback, then repeatedly merge
# the adjacent pair whose concatenation has the highest score), and round trips.
import struct
tok = os.path.join(shared, "data/models/stories260K/tok512.bin")
with open(tok, "rb") as f:
    data = f.read()
pieces, scores, pos = [], [], 4
for _ in range(512):
    sc, n = struct.unpack_from("<fi", data, pos)
    pos += 8
    pieces.append(data[pos:pos + n]); scores.append(sc); pos += n
lookup = {}
for i, p in enumerate(pieces):
    lookup.setdefault(p, i)          # llama2.c's bsearch finds one of equal pieces; they are unique here
def l2c_encode(text):
    if not text:
        return []
    ids = [lookup[b" "]]
    for ch in text:
        b = ch.encode("utf-8")
        ids += [lookup[b]] if b in lookup else [x + 3 for x in b]
    while True:
        best, bi, bid = -1e10, -1, -1
        for i in range(len(ids) - 1):
            m = lookup.get(pieces[ids[i]] + pieces[ids[i + 1]])
            if m is not None and scores[m] > best:
                best, bi, bid = scores[m], i, m
        if bi < 0:
            return ids
        ids[bi:bi + 2] = [bid]
spm_corpus = [t for t in corpus if len(t) <= 2000]
out = subprocess.run([tool, "l2c", tok, "512"], input=json.dumps(spm_corpus), capture_output=True, text=True)
assert out.returncode == 0, out.stderr
for text, got in zip(spm_corpus, json.loads(out.stdout)):
    want = l2c_encode(text)
    if got["ids"] != want:
        fails += 1
        print("SPM MISMATCH", repr(text[:80]), "\n  ours", got["ids"][:40], "\n  ref ", want[:40])
    if got["decoded"] != text:
        fails += 1
        print("SPM ROUND TRIP", repr(text[:80]), "->", repr(got["decoded"][:80]))
print(f"tok512 SentencePiece: {len(spm_corpus)} texts vs llama2.c encode, round trips")

# The same vocabulary as a Llama-2 style GGUF tokenizer (tokenizer.ggml.model "llama",
# pieces spelled with U+2581, scores, token types) must encode exactly like tok512.bin.
with tempfile.TemporaryDirectory() as tmp:
    gpath = os.path.join(tmp, "tok512.gguf")
    w = gguf.GGUFWriter(gpath, arch="llama")
    w.add_tokenizer_model("llama")
    w.add_token_list([p.replace(b" ", "\u2581".encode()) for p in pieces])
    w.add_token_scores(scores)
    w.add_token_types([2, 3, 3] + [6] * 256 + [1] * (512 - 259))
    w.add_bos_token_id(1); w.add_eos_token_id(2); w.add_unk_token_id(0)
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    out = subprocess.run([tool, "gguf", gpath], input=json.dumps(spm_corpus), capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    for text, got in zip(spm_corpus, json.loads(out.stdout)):
        if got["ids"] != l2c_encode(text) or got["decoded"] != text:
            fails += 1
            print("GGUF SPM MISMATCH", repr(text[:80]), got["ids"][:30])
print(f"tok512 as a GGUF 'llama' tokenizer: {len(spm_corpus)} texts")
sys.exit(1 if fails else 0)
