#!/bin/bash
# ac-llama (llamacpp/ac_llama.c, docs/llamacpp.md), the llama.cpp helper beside $AC_BIN,
# on the real stories260K exported to GGUF by the product:
#  - info names ggml's version;
#  - bench gives every rep its N positive decode steps, llama.cpp's model, KV and compute
#    buffers from its log, and a peak RSS above the one before loading; --cold the same,
#    with its flush buffer left out of the RSS;
#  - quantize to q8_0 writes the file whole (no temporary left), reports the tensors that
#    fell back (stories260K's FFN width 172 is no multiple of 32), and bench loads it;
#  - a missing file, a FIFO, a text file named .gguf, --reps 0, --threads abc and an
#    unknown type fail with exit status 1 or 2 and an "error" naming the problem, no crash.
# Builds nothing. Env: AC_BIN, AC_SHARED, AC_PYTHON.
set -euo pipefail
HELPER=$(dirname "${AC_BIN:?}")/ac-llama
M=${AC_SHARED:?}/data/models/stories260K/stories260K.bin
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
[ -x "$HELPER" ] || fail "$HELPER is missing (make llamacpp; needs scripts/llamacpp.sh install)"
cd "$W"   # a core file would land here

"$AC_BIN" export "$M" --out "$W/s.gguf" --format gguf --dtype fp32 >/dev/null || fail "export to GGUF"

"$HELPER" info >info.json || fail "info"
echo "info: $(cat info.json)"
"$AC_PYTHON" - info.json <<'PY' || fail "info JSON"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["engine"] == "llama.cpp" and d["ggml_version"] and d["package"] == "llama-cpp-python", d
assert d["package_version"] and d["system_info"].startswith("CPU"), d
PY

# One thread: the timings stay sane on a machine busy with other work.
BENCH="--threads 1 --prompt 32 --output 8 --reps 2"
"$HELPER" bench s.gguf $BENCH >f32.json 2>bench.log || { cat bench.log; fail "bench"; }
check_bench() {
    "$AC_PYTHON" - "$1" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert (d["threads"], d["batch"], d["prompt"], d["output"], d["kv_type"]) == (1, 1, 32, 8, "f16"), d
assert d["n_vocab"] == 512 and d["n_params"] == 260032 and d["n_ctx"] >= 40, d
assert len(d["reps"]) == 2, d["reps"]
for r in d["reps"]:
    assert r["prefill_ms"] > 0 and len(r["decode_ms"]) == 8 and all(x > 0 for x in r["decode_ms"]), r
b = d["buffers"]
assert b["model"] > 0 and b["kv"] > 0 and b["compute"] > 0 and b["output"] >= 0, b
assert d["model_bytes"] > 0 and d["load_ms"] > 0, d
assert d["rss_peak"] > d["rss_before_load"] > 0 and d["rss_after_load"] > 0, d
med = sorted(x for r in d["reps"] for x in r["decode_ms"])[8]
print("%s: model %d bytes, buffers %s, rss %d -> %d (peak %d), prefill %.3f ms, decode median %.3f ms"
      % (sys.argv[1], d["model_bytes"], b, d["rss_before_load"], d["rss_after_load"], d["rss_peak"],
         d["reps"][0]["prefill_ms"], med))
PY
}
check_bench f32.json || fail "bench JSON (f32)"

# --cold: the same model with the caches flushed before each timed step; the flush
# buffer (twice the last-level cache) is left out of the RSS figures.
"$HELPER" bench s.gguf $BENCH --cold >cold.json 2>bench.log || { cat bench.log; fail "bench --cold"; }
check_bench cold.json || fail "bench JSON (--cold)"
"$AC_PYTHON" - f32.json cold.json <<'PY' || fail "bench --cold: flush buffer"
import json, sys
w, c = (json.load(open(f)) for f in sys.argv[1:])
assert w["flush_bytes"] == 0 and c["flush_bytes"] >= 8 << 20, (w["flush_bytes"], c["flush_bytes"])
# without the subtraction the cold peak would sit flush_bytes (>= 8 MiB) above the warm one
assert abs(c["rss_peak"] - w["rss_peak"]) < 4 << 20, (w["rss_peak"], c["rss_peak"], c["flush_bytes"])
assert abs(c["rss_after_load"] - w["rss_after_load"]) < 4 << 20, (w["rss_after_load"], c["rss_after_load"])
PY
# --flush BYTES: a buffer of exactly that size (page-rounded), also left out of the RSS;
# 0 reads nothing; with --cold, or a count that is not one, a usage error
"$HELPER" bench s.gguf $BENCH --flush 20000000 >fl.json 2>bench.log || { cat bench.log; fail "bench --flush"; }
check_bench fl.json || fail "bench JSON (--flush)"
"$HELPER" bench s.gguf $BENCH --flush 0 >fl0.json 2>bench.log || { cat bench.log; fail "bench --flush 0"; }
"$AC_PYTHON" - f32.json fl.json fl0.json <<'PY' || fail "bench --flush: buffer"
import json, sys
w, f, z = (json.load(open(x)) for x in sys.argv[1:])
assert f["flush_bytes"] == (20000000 + 4095) // 4096 * 4096 and z["flush_bytes"] == 0, (f["flush_bytes"], z["flush_bytes"])
assert abs(f["rss_peak"] - w["rss_peak"]) < 4 << 20, (w["rss_peak"], f["rss_peak"])
PY
for bad in "--flush 1 --cold" "--flush -1" "--flush 1x" "--flash-attn maybe" "--flash-attn off --kv-type q8_0"; do
    "$HELPER" bench s.gguf $BENCH $bad >bad.json 2>bad.log && fail "bench $bad was accepted"
    [ $? = 2 ] && grep -q "fl" bad.log || fail "bench $bad: $(cat bad.log)"
done
# a context beyond llama.cpp's counts (batch x tokens past 2^31) is refused, not overflowed
"$HELPER" bench s.gguf --batch 4096 --prompt 1048576 --output 1 >bad.json 2>bad.log && fail "an overflowing context was accepted"
[ $? = 2 ] && grep -q "a context of more than" bad.log || fail "overflowing context: $(cat bad.log)"
for fa in on off; do
    "$HELPER" bench s.gguf $BENCH --flash-attn $fa >fa.json 2>bench.log || { cat bench.log; fail "bench --flash-attn $fa"; }
    check_bench fa.json || fail "bench JSON (--flash-attn $fa)"
done

"$HELPER" quantize s.gguf s-q8_0.gguf q8_0 --threads 1 >q8.json 2>q8.log || { cat q8.log; fail "quantize"; }
echo "quantize: $(cat q8.json)"
ls s-q8_0.gguf.tmp-* >/dev/null 2>&1 && fail "quantize left its temporary file"
"$AC_PYTHON" - q8.json s-q8_0.gguf s.gguf <<'PY' || fail "quantize JSON"
import json, os, sys
d = json.load(open(sys.argv[1]))
assert d["type"] == "q8_0" and d["bytes"] == os.path.getsize(sys.argv[2]), d
assert d["bytes"] < os.path.getsize(sys.argv[3]) / 2, d
assert d["fallbacks"] == 5, d          # the five ffn_down.weight: 172 columns, q8_0 blocks of 32
assert d["seconds"] >= 0, d
PY
"$HELPER" bench s-q8_0.gguf $BENCH >q8b.json 2>bench.log || { cat bench.log; fail "bench of the q8_0 file"; }
check_bench q8b.json || fail "bench JSON (q8_0)"
"$AC_PYTHON" -c "import json,sys; a, b = (json.load(open(f))['model_bytes'] for f in sys.argv[1:]); assert b < a, (a, b)" \
    f32.json q8b.json || fail "the q8_0 model is not smaller in llama.cpp"

# Refusals: status 1 or 2 (a signal would be 128+), an "error" naming the problem.
mkfifo fifo.gguf
echo "not a model" >text.gguf
refuse() {
    local want=$1 rc=0; shift
    timeout 60 "$HELPER" "$@" >err.json 2>err.log || rc=$?
    [ "$rc" = 1 ] || [ "$rc" = 2 ] || fail "ac-llama $* exited $rc (want 1 or 2)"
    "$AC_PYTHON" -c "import json,sys; e = json.load(open('err.json'))['error']; assert sys.argv[1] in e, e" "$want" \
        || fail "ac-llama $*: error does not name '$want': $(cat err.json)"
    grep -q "^ac-llama: .*$want" err.log || fail "ac-llama $*: stderr lacks the reason: $(cat err.log)"
    echo "refused ($rc): ac-llama $* -> $(cat err.json)"
}
refuse missing.gguf bench missing.gguf
refuse fifo.gguf bench fifo.gguf
refuse text.gguf bench text.gguf
refuse --reps bench s.gguf --reps 0
refuse --threads bench s.gguf --threads abc
refuse q3_x quantize s.gguf out.gguf q3_x
refuse text.gguf quantize text.gguf out.gguf q8_0
[ ! -e out.gguf ] || fail "a refused quantize wrote out.gguf"
ls core* >/dev/null 2>&1 && fail "a core file was written"
echo "ok"
