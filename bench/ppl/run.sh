#!/bin/bash
# Perplexity of SmolLM2-135M-Instruct on wikitext-2 raw test: our engine vs llama.cpp
# (llama-cpp-python, same chunking computed in bench/ppl/llamacpp_ppl.py), on the Q4_1
# GGUF as shipped and on a copy dequantized to F32 (the exact weights our engine runs),
# plus a whole-file tokenization comparison. Writes bench/results/ppl.md.
# usage: bench/ppl/run.sh [BUILD] [CTX] [N_CHUNKS]   (slow on CPU: use nice, small N)
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build}; CTX=${2:-512}; N=${3:-8}; THREADS=${THREADS:-2}
source scripts/pyenv.sh >/dev/null
AC=$BUILD/autocompress
Q=$(sh scripts/fetch-models.sh)
TEXT=${AC_SHARED:-$(cd .. && pwd)/shared}/data/text/wikitext-2-raw/wiki.test.raw
F32=$AC_CACHE/models/SmolLM2-135M-Instruct.F32-dequant.gguf
"$AC_PYTHON" -c "import llama_cpp" 2>/dev/null || { echo "llama-cpp-python is not installed in $AC_PYTHON"; exit 1; }
[ -s "$F32" ] || "$AC_PYTHON" bench/ppl/gguf_dequant.py "$Q" "$F32"
row() {  # name model
    local ours ref
    ours=$(nice "$AC" perplexity "$2" --text "$TEXT" --ctx "$CTX" --chunks "$N" --threads "$THREADS" --json)
    ref=$(nice "$AC_PYTHON" bench/ppl/llamacpp_ppl.py "$2" "$TEXT" "$CTX" "$N" "$THREADS")
    "$AC_PYTHON" - "$1" "$ours" "$ref" <<'PY'
import json, sys
name, o, r = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
assert o["tokens_scored"] == r["tokens_scored"] and o["text_tokens"] == r["text_tokens"], (o, r)
d = 100 * (o["ppl"] - r["ppl"]) / r["ppl"]
print(f"| {name} | {o['ctx']} | {o['chunks']} | {o['tokens_scored']} | {o['ppl']:.4f} | {r['ppl']:.4f} | {d:+.3f}% | {o['seconds']:.0f} / {r['seconds']:.0f} |")
PY
}
tok=$("$AC_PYTHON" bench/ppl/tokcmp.py "$Q" "$TEXT" "$BUILD/tools/ac_tokenize")
{
    echo "# Perplexity: AutoCompress engine vs llama.cpp"
    echo
    echo "SmolLM2-135M-Instruct on wikitext-2 raw test (\`data/text/wikitext-2-raw/wiki.test.raw\`), llama.cpp's"
    echo "method: the whole file tokenized, the first N non-overlapping chunks of CTX tokens, the second half of"
    echo "each chunk scored. llama.cpp side: llama-cpp-python $("$AC_PYTHON" -c 'import llama_cpp; print(llama_cpp.__version__)')"
    echo "with logits_all and the same chunking in Python (bench/ppl/llamacpp_ppl.py). $THREADS threads on a shared"
    echo "2-core machine (seconds are wall time under load), $(date -u +%Y-%m-%d)."
    echo
    echo "Tokenization of the whole file, ours vs llama.cpp: \`$tok\`"
    echo
    echo "| weights | ctx | chunks | tokens scored | ours | llama.cpp | diff | seconds (ours / llama.cpp) |"
    echo "|---|---|---|---|---|---|---|---|"
    row "Q4_1 (as shipped)" "$Q"
    row "F32 (Q4_1 dequantized)" "$F32"
    echo
    echo "Our engine dequantizes Q4_1 weights to fp32 and multiplies in fp32; llama.cpp's Q4_1 kernels also"
    echo "quantize the activations to Q8_1, so on Q4_1 the two differ by that rounding. On the dequantized F32"
    echo "copy (bench/ppl/gguf_dequant.py) both run the same weights in fp32."
} > bench/results/ppl.md.tmp
mv bench/results/ppl.md.tmp bench/results/ppl.md
cat bench/results/ppl.md
