#!/bin/bash
# Oracle: stories260K (llama2.c .bin + tok512.bin) through the real binary.
#  - greedy from BOS reproduces the text PROVENANCE.md documents (Karpathy's stories260K.md);
#  - the mean NLL of that 44-token sentence is 0.324 nats/token (sliding-window perplexity);
#  - inspect reports the arch and parameter count; hostile copies of the file fail cleanly.
set -euo pipefail
M=$AC_SHARED/data/models/stories260K/stories260K.bin
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

out=$("$AC_BIN" generate "$M" --max-tokens 44 --threads 1)
echo "generate: $out"
want="Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she saw a big, red ball."
[ "$out" = "$want" ] || { echo "FAIL: greedy text differs"; exit 1; }

# sampling: the seed makes it reproducible, and it is not simply the greedy text
a=$("$AC_BIN" generate "$M" --max-tokens 40 --temperature 1.0 --top-p 0.95 --seed 11 --threads 1 2>/dev/null)
b=$("$AC_BIN" generate "$M" --max-tokens 40 --temperature 1.0 --top-p 0.95 --seed 11 --threads 1 2>/dev/null)
c=$("$AC_BIN" generate "$M" --max-tokens 40 --temperature 1.0 --top-p 0.95 --seed 12 --threads 1 2>/dev/null)
echo "sampled: $a"
[ "$a" = "$b" ] || { echo "FAIL: same seed, different text"; exit 1; }
[ "$a" != "$want" ] && [ "$a" != "$c" ] || { echo "FAIL: sampling looks greedy or ignores the seed"; exit 1; }

printf '%s' "$want" > "$tmp/s.txt"
j=$("$AC_BIN" perplexity "$M" --text "$tmp/s.txt" --ctx 512 --stride 512 --json --threads 1)
echo "perplexity: $j"
"$AC_PYTHON" - "$j" <<'PY'
import json, sys
r = json.loads(sys.argv[1])
assert r["tokens_scored"] == 44, r
assert abs(r["mean_nll"] - 0.324) < 0.0015, r
PY

"$AC_BIN" inspect "$M" > "$tmp/inspect.txt"
grep -q "parameters:  260032" "$tmp/inspect.txt" || { cat "$tmp/inspect.txt"; echo "FAIL: parameter count"; exit 1; }
"$AC_BIN" inspect "$M" --json > "$tmp/arch.json"
"$AC_PYTHON" - "$tmp/arch.json" <<'PY'
import json, sys
a = json.load(open(sys.argv[1]))
assert a["hidden_size"] == 64 and a["vocab_size"] == 512 and len(a["layers"]) == 5, a
assert all(l["attention"] == {"n_heads": 8, "n_kv_heads": 4} and l["mlp"] == {"ffn_dim": 172} for l in a["layers"]), a
PY

# hostile copies: truncated, trailing bytes, header lying about sizes -> exit 1 with a message, no crash
head -c 100000 "$M" > "$tmp/trunc.bin"
cp "$M" "$tmp/trail.bin"; printf 'xxxx' >> "$tmp/trail.bin"
cp "$M" "$tmp/lie.bin"; printf '\xff\xff\xff\x7f' | dd of="$tmp/lie.bin" bs=1 seek=4 conv=notrunc status=none
for f in trunc trail lie; do
    cp "$AC_SHARED/data/models/stories260K/tok512.bin" "$tmp/tok512.bin"
    set +e; msg=$("$AC_BIN" generate "$tmp/$f.bin" --max-tokens 2 2>&1); rc=$?; set -e
    echo "$f: rc=$rc $msg"
    [ $rc -eq 1 ] || { echo "FAIL: $f should exit 1"; exit 1; }
    echo "$msg" | grep -Eq "truncated|trailing|implausible" || { echo "FAIL: $f message"; exit 1; }
done
echo "ok"
