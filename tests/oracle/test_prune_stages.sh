#!/bin/bash
# The rank, prune and distill job stages as a real job (`autocompress run` through
# build/tools/stage_check, which registers them and a test stage standing in for the
# search): load -> rank -> (fixed arch) -> prune -> distill on stories260K with a few
# TinyStories documents. Checks the job succeeds, each stage's files, the published
# ranking, the events (rank.done, prune.done, one distill.progress per step,
# distill.done) and the report's exact distillation token count. Env: AC_BIN, AC_SHARED.
set -euo pipefail
TOOL=$(dirname "${AC_BIN:?}")/tools/stage_check
DATA=${AC_SHARED:?}/data
[ -x "$TOOL" ] || { echo "FAIL: missing $TOOL (make all builds it)"; exit 1; }
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# twelve stories: enough text for T=256 windows, small enough to rank in seconds
awk '/^<\|endoftext\|>$/{n++} n<12' "$DATA/text/tinystories/validation_100.txt" >"$W/calib.txt"
python3 - "$W" "$DATA" <<'PY'
import json, sys
w, data = sys.argv[1:]
json.dump({"name": "rank-prune-distill", "model": {"path": data + "/models/stories260K/stories260K.bin"},
           "target": {"device": "cpu", "precision": "fp32",
                      "workload": {"batch_size": 1, "prompt_tokens": 64, "output_tokens": 16}},
           "constraints": {"params": 200000}, "budgets": {"distill_tokens": 1500},
           "data": {"calibration": w + "/calib.txt"},
           "x_test_pipeline": ["load", "rank", "test_fixed_arch", "prune", "distill"]}, open(w + "/spec.json", "w"))
lay = lambda s: {"source_layer": s, "attention": {"n_heads": 8, "n_kv_heads": 4}, "mlp": {"ffn_dim": 86}}
json.dump({"family": "llama", "vocab_size": 512, "hidden_size": 64, "head_dim": 8, "max_position_embeddings": 512,
           "rope_theta": 10000.0, "rope_scaling": None, "norm_eps": 1e-5, "tie_word_embeddings": True,
           "layers": [lay(s) for s in (0, 1, 3, 4)]}, open(w + "/arch.json", "w"))
PY
AC_TEST_STAGES=1 AC_TEST_ARCH="$W/arch.json" OMP_NUM_THREADS=1 "$TOOL" "$W/spec.json" --out "$W/run" \
    >"$W/job.json" 2>"$W/job.log" || { cat "$W/job.log" "$W/job.json"; fail "job did not succeed"; }
J=$(ls -d "$W"/run/jobs/job_*)
for f in rank/ranking.json prune/student/arch.json prune/student/model.safetensors prune/student/prune.json \
         distill/student/model.safetensors distill/student/arch.json; do
    [ -s "$J/$f" ] || fail "missing $f"
done
# the checkpoints serve only a resume of the stage: gone once it is recorded done
[ ! -e "$J/distill/ckpt" ] || fail "the distillation's checkpoints outlived its stage"
[ -e "$W/run/ranking.json" ] || fail "ranking.json not published"
python3 - "$W/run/autocompress.db" <<'PY' || fail "events or report"
import json, sqlite3, sys
c = sqlite3.connect(sys.argv[1])
status, report = c.execute("select status, report from jobs").fetchone()
assert status == "succeeded", status
ev = [t for (t,) in c.execute("select type from events order by seq")]
for t in ("rank.done", "prune.done", "distill.done"):
    assert t in ev, (t, ev)
r = json.loads(report)
d = r["distillation"]
assert d["tokens"] == 1500, d                 # the budget, exactly
steps = (1500 + 511) // 512                   # 4 x 128 tokens per step, last step shortened
assert d["steps"] == steps and ev.count("distill.progress") == steps, (d, ev.count("distill.progress"))
assert r["ranking"]["tokens"] > 0 and len(r["ranking"]["layer_order"]) == 5
print("job stages: events %s; distilled %d tokens in %d steps, final loss %.4f"
      % (len(ev), d["tokens"], d["steps"], d["final_kd_loss"]))
PY

# budgets.distill_tokens 0 (the spec allows it: a latency-only result, or pruning with
# reconstruction alone): the distill stage is skipped, says so, and writes no student
python3 - "$W/spec.json" "$W/spec0.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1])); s["budgets"]["distill_tokens"] = 0; json.dump(s, open(sys.argv[2], "w"))
PY
AC_TEST_STAGES=1 AC_TEST_ARCH="$W/arch.json" OMP_NUM_THREADS=1 "$TOOL" "$W/spec0.json" --out "$W/run0" \
    >"$W/job0.json" 2>"$W/job0.log" || { tail -5 "$W/job0.log"; fail "a job with distill_tokens 0 did not succeed"; }
J0=$(ls -d "$W"/run0/jobs/job_*)
[ ! -e "$J0/distill/student" ] || fail "distill_tokens 0 wrote a distilled student"
python3 - "$W/run0/autocompress.db" <<'PY' || fail "distill_tokens 0: events or report"
import json, sqlite3, sys
c = sqlite3.connect(sys.argv[1])
status, report = c.execute("select status, report from jobs").fetchone()
assert status == "succeeded", status
ev = [t for (t,) in c.execute("select type from events order by seq")]
assert "distill.skipped" in ev and "distill.progress" not in ev, ev
d = json.loads(report)["distillation"]
assert d["tokens"] == 0 and "distill_tokens" in d["skipped"], d
print("distill_tokens 0: skipped (%s)" % d["skipped"])
PY
echo ok
