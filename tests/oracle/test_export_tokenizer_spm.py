"""A llama2.c parent's SentencePiece-style tokenizer (stories260K's tok512.bin) exported
as HF tokenizer files, read by HF `tokenizers` (PyPI), the independent reader here:

1. `autocompress export stories260K.bin --format hf`: the manifest says tokenizer true,
   MODEL_CARD.md says the files are included, tokenizer_config.json and
   special_tokens_map.json name BOS/EOS/UNK, config.json carries their ids.
2. On every TinyStories story of data/text/tinystories plus edge cases (leading, trailing
   and repeated spaces, tabs, newlines, accents, CJK and emoji through byte fallback, the
   empty text), HF's ids equal the engine's ids from tok512.bin and from the exported
   tokenizer.json (tools/ac_tokenize), and HF decodes them back to the text. With special
   tokens HF adds the BOS the engine adds.
3. The same vocabulary as a GGUF "llama" tokenizer (stories260K exported to GGUF, then
   that GGUF exported to HF) gives the same tokenizer.json behaviour.
4. The HF export used as a parent for a GGUF export: the GGUF "llama" vocabulary built
   from tokenizer.json (scores from the merge order) tokenizes as tok512.bin does.
"""
import json
import os
import subprocess
import sys
import tempfile

from tokenizers import Tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
AC_BIN = os.environ.get("AC_BIN", os.path.join(ROOT, "build", "autocompress"))
TOOL = os.path.join(os.path.dirname(AC_BIN), "tools", "ac_tokenize")
SHARED = os.environ.get("AC_SHARED", os.path.join(os.path.dirname(ROOT), "shared"))
MODEL = os.path.join(SHARED, "data", "models", "stories260K", "stories260K.bin")
TOK = os.path.join(SHARED, "data", "models", "stories260K", "tok512.bin")
STORIES = os.path.join(SHARED, "data", "text", "tinystories", "validation_100.txt")


def run(args):
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit("FAIL: %s: %s" % (" ".join(args), r.stderr.strip()))
    return r.stdout


def ours(args, corpus):
    r = subprocess.run([TOOL] + args, input=json.dumps(corpus), capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit("FAIL: ac_tokenize %s: %s" % (" ".join(args), r.stderr.strip()))
    return [x["ids"] for x in json.loads(r.stdout)]


def check_dir(d, corpus, reference, label, failures):
    tj = os.path.join(d, "tokenizer.json")
    if not os.path.exists(tj):
        failures.append("%s: no tokenizer.json in the export" % label)
        return
    hf = Tokenizer.from_file(tj)
    with open(os.path.join(d, "tokenizer_config.json")) as f:
        tc = json.load(f)
    with open(os.path.join(d, "special_tokens_map.json")) as f:
        stm = json.load(f)
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    for k in ("bos_token", "eos_token", "unk_token"):
        if stm.get(k) != tc.get(k) or hf.token_to_id(tc[k]) is None:
            failures.append("%s: %s %r / %r not a token" % (label, k, tc.get(k), stm.get(k)))
    if hf.token_to_id(tc["bos_token"]) != 1 or hf.token_to_id(tc["eos_token"]) != 2 or \
            cfg.get("bos_token_id") != 1 or cfg.get("eos_token_id") != 2:
        failures.append("%s: BOS/EOS ids %s/%s, config.json %s/%s (want 1/2)" % (
            label, hf.token_to_id(tc["bos_token"]), hf.token_to_id(tc["eos_token"]),
            cfg.get("bos_token_id"), cfg.get("eos_token_id")))
    if hf.get_vocab_size() != 512:
        failures.append("%s: HF vocab size %d" % (label, hf.get_vocab_size()))
    back = ours(["hf", tj], corpus)
    bad = ntok = 0
    for text, want, got in zip(corpus, reference, back):
        ids = hf.encode(text, add_special_tokens=False).ids
        ntok += len(ids)
        if ids != want or got != want:
            bad += 1
            if bad <= 5:
                print("MISMATCH %s %r\n  hf   %s\n  l2c  %s\n  json %s" % (label, text[:60], ids[:24], want[:24],
                                                                       got[:24]))
        dec = hf.decode(ids)
        if dec != text:
            bad += 1
            if bad <= 5:
                print("DECODE %s %r -> %r" % (label, text[:60], dec[:60]))
    with_bos = hf.encode("Once upon a time", add_special_tokens=True).ids
    if with_bos[:1] != [1] or with_bos[1:] != reference[-1]:
        failures.append("%s: with special tokens HF gives %s" % (label, with_bos))
    print("%s: %d texts, %d tokens, %d differences (HF tokenizers vs engine tok512.bin vs engine tokenizer.json)"
          % (label, len(corpus), ntok, bad))
    if bad:
        failures.append("%s: %d texts differ" % (label, bad))


def main():
    failures = []
    with open(STORIES, encoding="utf-8") as f:
        stories = [s.strip("\n") for s in f.read().split("<|endoftext|>") if s.strip()]
    corpus = stories + [
        "Once upon a time, there was a little girl named Lily.", " leading space", "trailing space ",
        "two  spaces   three", "\ttab\tand\n\nnewlines\r\n", "Zoë's café, naïve façade", "日本語のテキスト",
        "Emoji 🤗🚀 and ZWJ 👨‍👩‍👧", "1234567890 + 3.14", "", " ", "x", "Once upon a time"]
    reference = ours(["l2c", TOK, "512"], corpus)
    with tempfile.TemporaryDirectory() as tmp:
        hf_dir = os.path.join(tmp, "hf")
        man = json.loads(run([AC_BIN, "export", MODEL, "--format", "hf", "--dtype", "fp32", "--out", hf_dir]))
        if man.get("tokenizer") is not True or "note" in man:
            failures.append("manifest: tokenizer %s, note %s" % (man.get("tokenizer"), man.get("note")))
        with open(os.path.join(hf_dir, "MODEL_CARD.md")) as f:
            card = f.read()
        if "**Tokenizer:** included" not in card:
            failures.append("MODEL_CARD.md does not say the tokenizer is included")
        check_dir(hf_dir, corpus, reference, "llama2.c -> hf", failures)
        gguf = os.path.join(tmp, "stories.gguf")
        run([AC_BIN, "export", MODEL, "--format", "gguf", "--dtype", "fp32", "--out", gguf])
        g_dir = os.path.join(tmp, "hf-from-gguf")
        man = json.loads(run([AC_BIN, "export", gguf, "--format", "hf", "--dtype", "fp32", "--out", g_dir]))
        if man.get("tokenizer") is not True:
            failures.append("GGUF llama -> hf manifest: tokenizer %s" % man.get("tokenizer"))
        check_dir(g_dir, corpus, reference, "llama2.c -> gguf -> hf", failures)
        # The HF export as a parent in turn: its GGUF export's "llama" vocabulary (scores
        # rebuilt from the merge order) still tokenizes as tok512.bin does.
        re_gguf = os.path.join(tmp, "from-hf.gguf")
        run([AC_BIN, "export", hf_dir, "--format", "gguf", "--dtype", "fp32", "--out", re_gguf])
        got = ours(["gguf", re_gguf], corpus)
        bad = sum(1 for a, b in zip(got, reference) if a != b)
        print("llama2.c -> hf -> gguf: %d texts, %d differences" % (len(corpus), bad))
        if bad:
            failures.append("hf -> gguf: %d texts tokenize differently from tok512.bin" % bad)
    if failures:
        print("FAIL:\n  " + "\n  ".join(failures))
        sys.exit(1)
    print("ok")


if __name__ == "__main__":
    main()
