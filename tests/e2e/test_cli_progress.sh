#!/bin/bash
# The progress display of long CLI work on real runs (server/progress.c): `eval` on
# stories260K and `run` with the test stages under a pseudo-terminal (script(1)) draw a
# bar ("\r", percent, ETA, clear-to-EOL, never wider than the terminal) with notes intact
# on their own lines; with stderr to a file, `eval`, `run` (also failed and cancelled
# jobs), `distill` and `calibrate` write plain timestamped lines (no "\r", no escapes),
# and stdout (tables, JSON) is clean.
# Env: AC_BIN, AC_SHARED.
set -euo pipefail
BIN=${AC_BIN:?}
DATA=${AC_SHARED:?}/data
MODEL=$DATA/models/stories260K/stories260K.bin
TEXT=$DATA/text/tinystories/validation_100.txt
W=$(mktemp -d)
trap '[ -n "${KEEP:-}" ] || rm -rf "$W"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
command -v script >/dev/null || fail "script (util-linux) is needed for the terminal half of this test"
export AC_SHARED
unset AC_PROGRESS

# Under a 100-column pseudo-terminal: stdout to a file, stderr (the bar) to the terminal.
on_tty() {   # on_tty OUT_TTY OUT_STDOUT CMD...
    local tty=$1 out=$2
    shift 2
    TERM=xterm script -qfec "stty cols 100 rows 30; $* >$out" /dev/null </dev/null >"$tty"
}

# ---- eval ---------------------------------------------------------------------------
EVAL="$BIN eval $MODEL --tasks arc_easy,piqa --limit 40 --threads 1"
on_tty "$W/eval.tty" "$W/eval.out" "$EVAL" || { cat "$W/eval.tty"; fail "eval under a terminal"; }
$EVAL >"$W/eval.plain.out" 2>"$W/eval.plain.err" || { cat "$W/eval.plain.err"; fail "eval"; }

python3 - "$W" <<'PY' || fail "eval progress output"
import re, sys
w = sys.argv[1]
tty = open(w + "/eval.tty", encoding="utf-8", errors="replace", newline="").read()
assert "\r" in tty and "\x1b[K" in tty, "no in-place redraw"
bars = re.findall(r"\r([^\r]*?)\x1b\[K", tty)
assert bars, tty
for b in bars:
    assert len(b) <= 99 and "\n" not in b, "bar wider than the terminal or wrapped: %r" % b
assert any(re.match(r"arc_easy \[#+\] 100\.0% 40/40 item  ETA ", b) for b in bars), bars
assert any(re.match(r"piqa \[#+\] 100\.0% 40/40 item .* in [0-9.]+s", b) for b in bars), bars
assert re.search(r"\rarc_easy \[#+\] 100\.0% 40/40 item .* in [0-9.]+s[^\r\n]*\x1b\[K\r?\n", tty), \
    "arc_easy's finished line did not stay"
out = open(w + "/eval.out", newline="").read()
assert "\r" not in out and "\x1b" not in out and re.search(r"^arc_easy +40 ", out, re.M), out

err = open(w + "/eval.plain.err", newline="").read()
assert "\r" not in err and "\x1b" not in err, "escape codes in a log file"
assert re.search(r"^\[\d\d:\d\d:\d\d\] arc_easy task 1/2$", err, re.M), err
assert re.search(r"^\[\d\d:\d\d:\d\d\] arc_easy 100% 40/40 item .*task 1/2$", err, re.M), err
assert re.search(r"^\[\d\d:\d\d:\d\d\] piqa done 100% 40/40 item in [0-9.]+s \([0-9.]+ item/s\) task 2/2$", err, re.M), err
out = open(w + "/eval.plain.out", newline="").read()
assert re.search(r"^piqa +40 ", out, re.M), out
print("eval: %d bar redraws on the terminal, %d plain lines" % (len(bars), err.count("\n")))
PY

# ---- run (test stages: no model work) -----------------------------------------------
# the smallest llama2.c checkpoint the model probe takes (dim 8, 1 layer, vocab 32)
python3 -c 'import struct,sys; open(sys.argv[1],"wb").write(struct.pack("<7i",8,16,1,2,2,32,4)+bytes(3744))' "$W/tiny.bin"
cat >"$W/spec.json" <<JSON
{"model": {"path": "$W/tiny.bin"}, "constraints": {"params": 1000},
 "x_test_pipeline": ["test_artifact", "test_sleep"], "x_test_sleep_ms": 1500, "x_test_artifact_bytes": 1000}
JSON
export AC_TEST_STAGES=1
on_tty "$W/run.tty" "$W/run.out" "$BIN run $W/spec.json --out $W/r1" || { cat "$W/run.tty"; fail "run under a terminal"; }
"$BIN" run "$W/spec.json" --out "$W/r2" >"$W/run.plain.out" 2>"$W/run.plain.err" || { cat "$W/run.plain.err"; fail "run"; }
# a stage that fails without reporting, after one that did; and a job cancelled with Ctrl-C
sed 's/"test_artifact", "test_sleep"\]/"test_sleep", "test_fail"]/; s/1500/200/' "$W/spec.json" >"$W/fail.json"
sed 's/"test_artifact", "test_sleep"\]/"test_sleep"]/; s/1500/20000/' "$W/spec.json" >"$W/long.json"
"$BIN" run "$W/fail.json" --out "$W/r3" >/dev/null 2>"$W/fail.err" && fail "a failing job exited 0"
"$BIN" run "$W/long.json" --out "$W/r4" >/dev/null 2>"$W/cancel.err" &
pid=$!
for _ in $(seq 1 100); do grep -q " 1/400 " "$W/cancel.err" 2>/dev/null && break; sleep 0.1; done
kill -INT $pid
wait $pid && fail "a cancelled job exited 0"
unset AC_TEST_STAGES

python3 - "$W" <<'PY' || fail "run progress output"
import json, re, sys
w = sys.argv[1]
tty = open(w + "/run.tty", newline="").read()
bars = re.findall(r"\r([^\r]*?)\x1b\[K", tty)
assert any(re.match(r"test_sleep \[#+\.*\] +\d+\.\d% \d+/30  [0-9.]+/s  ETA \d+s  stage 2/2$", b) for b in bars), bars
assert any(re.match(r"test_sleep \[#+\] 100\.0% 30/30 .* in [0-9.]+s  stage 2/2$", b) for b in bars), bars
# the event is a log line of its own: the bar cleared before it, redrawn after it
assert re.search(r"\r\x1b\[Ktest\.sleep: sleeping\r?\n\r", tty), repr(tty)
for name in ("run.out", "run.plain.out"):
    job = json.load(open(w + "/" + name))
    assert job["status"] == "succeeded", job
err = open(w + "/run.plain.err", newline="").read()
assert "\r" not in err and "\x1b" not in err, err
assert re.search(r"^test\.sleep: sleeping$", err, re.M), err
assert re.search(r"^\[\d\d:\d\d:\d\d\] test_sleep 3% 1/30 ETA -- stage 2/2$", err, re.M), err
assert re.search(r"^\[\d\d:\d\d:\d\d\] test_sleep done 100% 30/30 in [0-9.]+s \([0-9.]+/s\) stage 2/2$", err, re.M), err
err = open(w + "/fail.err", newline="").read()
assert re.search(r"^\[[0-9:]{8}\] test_sleep done 100% 4/4 in .* stage 1/2$", err, re.M), err
assert re.search(r"^autocompress run: job job_\w+ failed in stage test_fail: .*test_fail always fails$", err, re.M), err
err = open(w + "/cancel.err", newline="").read()
assert re.search(r"^\[[0-9:]{8}\] test_sleep cancelled \d+% \d+/400 in [0-9.]+s", err, re.M), err
assert re.search(r"^autocompress run: job job_\w+ cancelled in stage test_sleep$", err, re.M), err
PY

# ---- distill and calibrate: plain lines on stderr, JSON on stdout ---------------------
python3 - "$W" <<'PY'
import json, sys
base = {"family": "llama", "vocab_size": 512, "hidden_size": 64, "head_dim": 8, "max_position_embeddings": 512,
        "rope_theta": 10000.0, "rope_scaling": None, "norm_eps": 1e-5, "tie_word_embeddings": True}
lay = lambda s: {"source_layer": s, "attention": {"n_heads": 8, "n_kv_heads": 4}, "mlp": {"ffn_dim": 86}}
json.dump(dict(base, layers=[lay(s) for s in (0, 1, 3, 4)]), open(sys.argv[1] + "/target.json", "w"))
PY
"$BIN" prune "$MODEL" --arch "$W/target.json" --out "$W/s" --calib "$TEXT" --calib-tokens 1024 --layer-tokens 512 \
    --seq 64 --threads 1 >/dev/null 2>"$W/prune.err" || { cat "$W/prune.err"; fail "prune"; }
"$BIN" distill --parent "$MODEL" --student "$W/s" --data "$TEXT" --tokens 1024 --batch 4 --seq 64 --ckpt-every 2 \
    --eval-every 2 --val-tokens 256 --threads 1 >"$W/distill.json" 2>"$W/distill.err" || { cat "$W/distill.err"; fail "distill"; }
"$BIN" calibrate --arch "$W/s/arch.json" --validate 1 --reps 1 --models 1 --threads 1 --no-cache \
    --data-dir "$W/var" --json >"$W/cal.json" 2>"$W/cal.err" || { cat "$W/cal.err"; fail "calibrate"; }
python3 - "$W" <<'PY' || fail "distill/calibrate progress output"
import json, re, sys
w = sys.argv[1]
d = json.load(open(w + "/distill.json"))
assert d["complete"] and d["tokens"] == 1024, d
err = open(w + "/distill.err", newline="").read()
assert "\r" not in err and "\x1b" not in err, err
assert re.search(r"^\[\d\d:\d\d:\d\d\] distill 25% 256/1024 tok ETA -- step 1/4 loss [0-9.]+ lr ", err, re.M), err
assert re.search(r"^\[\d\d:\d\d:\d\d\] distill done 100% 1024/1024 tok in [0-9.]+s \([0-9.]+ tok/s\) step 4/4 ", err, re.M), err
assert re.search(r"^distill: step 2 validation loss [0-9.]+ \[checkpoint\]$", err, re.M), err
c = json.load(open(w + "/cal.json"))
assert c["status"] == "succeeded" and c["entries"] > 0, c
err = open(w + "/cal.err", newline="").read()
assert "\r" not in err and "\x1b" not in err, err
assert re.search(r"^\[\d\d:\d\d:\d\d\] calibrate \d+% 1/\d+ req ETA -- workspace probe$", err, re.M), err
assert re.search(r"^\[\d\d:\d\d:\d\d\] calibrate done \d+% \d+/\d+ req in [0-9.]+s", err, re.M), err
PY
echo ok
