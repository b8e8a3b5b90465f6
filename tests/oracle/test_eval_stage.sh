#!/bin/bash
# The pipeline's "evaluate" stage through `autocompress run`: stories260K scored on two
# built-in tasks (3 items) and two user JSONL tasks, one of them malformed. The job must
# succeed, eval.json must be published with every task, the malformed one carrying its
# file:line: field error, and the report must hold parent.accuracy for the good ones. A
# built-in task whose files the server lacks (piqa) fails alone, and neither its error nor
# the other tasks' sources name the server's data folder: they name files under it.
set -eu
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/data/eval"
ln -s "$AC_SHARED/data/eval/arc_easy" "$AC_SHARED/data/eval/lambada" "$tmp/data/eval/"
export AC_EVAL_DATA=$tmp/data
printf '%s\n' '{"context": "Once upon a time, there was a little", "choices": [" girl", " table"], "gold": 0}' \
    '{"context": "Lily liked to play in the", "choices": [" park", " math"], "gold": 0}' > "$tmp/mine.jsonl"
printf '%s\n' '{"context": "a", "choices": [" b", " c"], "gold": 0}' '{"context": "a", "choices": [" b"], "gold": 0}' \
    > "$tmp/broken.jsonl"
cat > "$tmp/spec.json" <<JSON
{"model": {"path": "$AC_SHARED/data/models/stories260K/stories260K.bin"}, "constraints": {"params": 1000},
 "evaluation": {"tasks": ["arc_easy", "lambada_openai", "piqa", {"name": "mine", "path": "$tmp/mine.jsonl"},
                          {"name": "broken", "path": "$tmp/broken.jsonl"}], "limit": 3, "seed": 1234},
 "x_test_pipeline": ["evaluate"]}
JSON
out=$(AC_TEST_STAGES=1 "$AC_BIN" run "$tmp/spec.json" --out "$tmp/run")
echo "$out" | grep -q '"status": "succeeded"' || { echo "job did not succeed: $out"; exit 1; }
"$AC_PYTHON" - "$tmp/run/eval.json" "$out" "$tmp/data" <<'PY'
import json, sys
ev = json.load(open(sys.argv[1]))
job = json.loads(sys.argv[2])
data = sys.argv[3]
tasks = ev["parent"]["tasks"]
assert ev["limit"] == 3 and ev["seed"] == 1234
for t, n in (("arc_easy", 3), ("lambada_openai", 3), ("mine", 2)):
    assert tasks[t]["ok"] and tasks[t]["n"] == n, tasks[t]
assert not tasks["broken"]["ok"]
assert not tasks["piqa"]["ok"]
assert "eval/piqa/" in tasks["piqa"]["error"] and data not in tasks["piqa"]["error"], tasks["piqa"]["error"]
assert tasks["arc_easy"]["source"].startswith("eval/arc_easy/"), tasks["arc_easy"]["source"]
assert "broken.jsonl:2: field 'choices'" in tasks["broken"]["error"], tasks["broken"]["error"]
acc = job["report"]["parent"]["accuracy"]
assert set(acc) == {"arc_easy", "lambada_openai", "mine"}, acc
assert acc["mine"]["acc"] == 1.0   # stories260K knows Lily plays in the park
assert job["report"]["parent"]["perplexity"]["lambada_openai"] > 1
print("ok")
PY
