#!/bin/bash
# `autocompress prune` and `autocompress distill` on the real stories260K: rank on
# TinyStories, prune to half the FFN width and one layer fewer, reuse the saved ranking
# (same bytes), reconstruct by least squares by default (errors per projection in
# prune.json, lower perplexity than the plain slice on stories it did not see, off with
# --no-reconstruct or without text), refuse impossible targets; distill with an exact token budget; a run
# killed with SIGKILL after a checkpoint and rerun ends with the same loss and the same
# weights as an uninterrupted run. Env: AC_BIN, AC_SHARED.
set -euo pipefail
BIN=${AC_BIN:?}
DATA=${AC_SHARED:?}/data
MODEL=$DATA/models/stories260K/stories260K.bin
TEXT=$DATA/text/tinystories/validation_100.txt
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
field() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$1" "$2"; }

python3 - "$W" <<'PY'
import json, sys
w = sys.argv[1]
base = {"family": "llama", "vocab_size": 512, "hidden_size": 64, "head_dim": 8, "max_position_embeddings": 512,
        "rope_theta": 10000.0, "rope_scaling": None, "norm_eps": 1e-5, "tie_word_embeddings": True}
lay = lambda s, f: {"source_layer": s, "attention": {"n_heads": 8, "n_kv_heads": 4}, "mlp": {"ffn_dim": f}}
json.dump(dict(base, layers=[lay(s, 86) for s in (0, 1, 3, 4)]), open(w + "/target.json", "w"))
json.dump(dict(base, layers=[lay(s, 200) for s in range(5)]), open(w + "/wide.json", "w"))
json.dump(dict(base, layers=[lay(s, 86) for s in (0, 7)]), open(w + "/badlayer.json", "w"))
PY

# rank + prune
"$BIN" prune "$MODEL" --arch "$W/target.json" --out "$W/s" --calib "$TEXT" --calib-tokens 2048 \
    --layer-tokens 1024 --seq 128 --threads 1 >"$W/prune.json" 2>"$W/prune.log" || { cat "$W/prune.log"; fail "prune"; }
for f in model.safetensors arch.json ranking.json prune.json config.json; do
    [ -s "$W/s/$f" ] || fail "prune output lacks $f"
done
[ "$(field "$W/prune.json" params)" -lt "$(field "$W/prune.json" parent_params)" ] || fail "student not smaller"
python3 - "$W/s" <<'PY' || fail "ranking/arch content"
import json, sys
d = sys.argv[1]
a = json.load(open(d + "/arch.json"))
assert [l["source_layer"] for l in a["layers"]] == [0, 1, 3, 4]
assert all(l["mlp"]["ffn_dim"] == 86 for l in a["layers"])
r = json.load(open(d + "/ranking.json"))
assert r["tokens"] >= 2048 and r["layer_tokens"] >= 1024
for L in r["layers"]:
    assert sorted(L["ffn"]["perm"]) == list(range(172))
    s = L["ffn"]["score"]
    assert all(s[L["ffn"]["perm"][i]] >= s[L["ffn"]["perm"][i + 1]] for i in range(171))
    assert L["skip"]["layer"] > 0      # removing any layer of a trained model hurts
PY

# the saved ranking is reused: same student bytes, no calibration text needed
# a heterogeneous target has no HF config form: a snapshot folder that generate and
# perplexity still read (tokenizer from the parent named in prune.json)
python3 - "$W" <<'PY'
import json, sys
t = json.load(open(sys.argv[1] + "/target.json"))
t["layers"][1]["mlp"]["ffn_dim"] = 172
t["layers"][2]["attention"] = None
json.dump(t, open(sys.argv[1] + "/het.json", "w"))
PY
"$BIN" prune "$MODEL" --arch "$W/het.json" --out "$W/h" --ranking "$W/s/ranking.json" --threads 1 >/dev/null \
    2>"$W/ph.log" || { cat "$W/ph.log"; fail "heterogeneous prune"; }
[ ! -e "$W/h/config.json" ] || fail "a heterogeneous arch got an HF config"
ppl() { "$BIN" perplexity "$1" --text "$TEXT" --ctx 128 --chunks 4 --threads 1 --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["ppl"])'; }
python3 -c "import sys; p, h = map(float, sys.argv[1:3]); assert 1 < p < h, (p, h)" "$(ppl "$MODEL")" "$(ppl "$W/h")" \
    || fail "perplexity of the heterogeneous snapshot"
"$BIN" generate "$W/h" --prompt "Once upon a time" --max-tokens 8 --threads 1 >/dev/null 2>"$W/gh.log" \
    || { cat "$W/gh.log"; fail "generate from the snapshot"; }
"$BIN" eval "$W/h" --tasks lambada_openai --limit 4 --data "$DATA" --threads 1 --json "$W/eh.json" >/dev/null \
    2>"$W/eh.log" || { cat "$W/eh.log"; fail "eval of the snapshot"; }
python3 -c "import json,sys; assert json.load(open(sys.argv[1]))['accuracy']['lambada_openai']['n'] == 4" "$W/eh.json" \
    || fail "eval of the snapshot scored nothing"

"$BIN" prune "$MODEL" --arch "$W/target.json" --out "$W/s2" --ranking "$W/s/ranking.json" --calib "$TEXT" \
    --threads 1 >/dev/null 2>"$W/prune2.log" || { cat "$W/prune2.log"; fail "prune with --ranking"; }
cmp -s "$W/s/model.safetensors" "$W/s2/model.safetensors" || fail "reused ranking gives other weights"
# reconstruction is on by default: prune.json has every refit projection's errors, none
# worse after than before; without it (or without text) the student is the plain slice
python3 - "$W/s/prune.json" "$W/prune.json" <<'PY' || fail "reconstruction outcome"
import json, sys
rec = json.load(open(sys.argv[1]))["reconstruction"]
ps = rec["projections"]
assert rec["tokens"] >= 512 and sum(p["proj"] in ("o_proj", "down_proj") for p in ps) == 8, rec
# layer 0 reads the parent's own stream; after its FFN was cut, later layers' inputs are refit too
assert [p["proj"] for p in ps if p["layer"] == 1][:3] == ["q_proj", "k_proj", "v_proj"], rec
assert all(p["error_after"] <= p["error_before"] for p in rec["projections"])
assert any(p["refit"] and p["error_after"] < p["error_before"] for p in rec["projections"])
assert json.load(open(sys.argv[2]))["reconstruction"]["projections"] == rec["projections"]
PY
"$BIN" prune "$MODEL" --arch "$W/target.json" --out "$W/s3" --ranking "$W/s/ranking.json" --calib "$TEXT" \
    --no-reconstruct --threads 1 >"$W/p3.json" 2>"$W/prune3.log" || { cat "$W/prune3.log"; fail "--no-reconstruct"; }
"$BIN" prune "$MODEL" --arch "$W/target.json" --out "$W/s4" --ranking "$W/s/ranking.json" --threads 1 \
    >/dev/null 2>"$W/prune4.log" || { cat "$W/prune4.log"; fail "prune without text"; }
grep -q "not reconstructed" "$W/prune4.log" || fail "no note that the slice is not reconstructed"
cmp -s "$W/s3/model.safetensors" "$W/s4/model.safetensors" || fail "--no-reconstruct is not the plain slice"
! cmp -s "$W/s/model.safetensors" "$W/s3/model.safetensors" || fail "reconstruction changed nothing"
python3 -c "import json,sys; assert json.load(open(sys.argv[1]))['reconstruction'] is False" "$W/s3/prune.json" \
    || fail "prune.json of a plain slice"
# on stories it did not see, the reconstructed student is closer to its parent than the
# slice: reconstruct on the first 70 stories, measure on the other 30
python3 - "$TEXT" "$W" <<'PY'
import sys
docs = open(sys.argv[1]).read().split("<|endoftext|>\n")
open(sys.argv[2] + "/seen.txt", "w").write("<|endoftext|>\n".join(docs[:70]))
open(sys.argv[2] + "/unseen.txt", "w").write("<|endoftext|>\n".join(docs[70:]))
PY
for r in "" --no-reconstruct; do
    "$BIN" prune "$MODEL" --arch "$W/target.json" --out "$W/u$r" --ranking "$W/s/ranking.json" --calib "$W/seen.txt" \
        $r --threads 1 >/dev/null 2>"$W/pu.log" || { cat "$W/pu.log"; fail "prune on seen.txt $r"; }
done
uppl() { "$BIN" perplexity "$1" --text "$W/unseen.txt" --ctx 128 --chunks 8 --threads 1 --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["ppl"])'; }
python3 -c "import sys; p, r, s = map(float, sys.argv[1:4]); print('unseen ppl: parent %.2f, slice %.2f, reconstructed %.2f' % (p, s, r)); assert p < r < s" \
    "$(uppl "$MODEL")" "$(uppl "$W/u")" "$(uppl "$W/u--no-reconstruct")" || fail "reconstruction does not lower perplexity"

# impossible targets are clear errors
if "$BIN" prune "$MODEL" --arch "$W/wide.json" --out "$W/x" --ranking "$W/s/ranking.json" 2>"$W/e1"; then
    fail "wider FFN accepted"; fi
grep -q "ffn_dim: 200 is wider" "$W/e1" || { cat "$W/e1"; fail "wide error message"; }
if "$BIN" prune "$MODEL" --arch "$W/badlayer.json" --out "$W/x" --ranking "$W/s/ranking.json" 2>"$W/e2"; then
    fail "unknown source layer accepted"; fi
grep -q "source_layer: 7" "$W/e2" || { cat "$W/e2"; fail "source layer message"; }
set +e
"$BIN" prune "$MODEL" --arch "$W/target.json" --out "$W/x" 2>"$W/e3"; rc=$?
set -e
[ $rc -eq 2 ] && grep -q -- "--calib" "$W/e3" || fail "missing calibration text not refused (rc $rc)"
# --out: never the model's own folder, nor a folder with other files in it; an earlier prune's
# output is replaced
"$BIN" prune "$MODEL" --arch "$W/target.json" --out "$W/s4" --ranking "$W/s/ranking.json" --threads 1 \
    >/dev/null 2>"$W/prune4b.log" || { cat "$W/prune4b.log"; fail "prune over an earlier prune's output"; }
cmp -s "$W/s3/model.safetensors" "$W/s4/model.safetensors" || fail "the second prune into s4 differs"
mkdir -p "$W/busy" "$W/own"
echo keep >"$W/busy/notes.txt"
cp "$MODEL" "$W/own/m.bin"
cp "$(dirname "$MODEL")/tok512.bin" "$W/own/"
for out in busy own; do
    set +e
    model=$MODEL; [ $out = own ] && model=$W/own/m.bin
    "$BIN" prune "$model" --arch "$W/target.json" --out "$W/$out" --ranking "$W/s/ranking.json" 2>"$W/e_$out"; rc=$?
    set -e
    [ $rc -eq 2 ] || fail "--out $out accepted (rc $rc)"
done
grep -q "other files in it" "$W/e_busy" || { cat "$W/e_busy"; fail "--out busy message"; }
grep -q "folder of the model being pruned" "$W/e_own" || { cat "$W/e_own"; fail "--out own message"; }
[ "$(cat "$W/busy/notes.txt")" = keep ] && [ ! -e "$W/busy/arch.json" ] && [ ! -e "$W/own/arch.json" ] \
    || fail "a refused --out was written to"

# distillation: straight, then killed and resumed
D=(--parent "$MODEL" --data "$TEXT" --batch 4 --seq 64 --ckpt-every 4 --eval-every 8 --val-tokens 512 --threads 1)
"$BIN" distill "${D[@]}" --student "$W/s" --tokens 6000 --ckpt-dir "$W/ckA" --out "$W/outA" \
    >"$W/a.json" 2>"$W/a.log" || { cat "$W/a.log"; fail "distill"; }
[ "$(field "$W/a.json" tokens)" = 6000 ] || fail "budget not exact: $(cat "$W/a.json")"
[ "$(field "$W/a.json" steps)" = 24 ] || fail "steps"
python3 - "$W/a.json" <<'PY' || fail "distillation did not improve validation loss: $(cat "$W/a.json")"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["val_loss_distilled"] < r["val_loss_pruned"], r
PY
# with the intermediate-state loss: the parent is put in the ranking's order, the loss shows in
# the progress, and the run improves on the slice; its checkpoints are not another run's
"$BIN" distill "${D[@]}" --student "$W/s" --tokens 2000 --ckpt-dir "$W/ckH" --out "$W/outH" --hidden-weight 1 \
    >"$W/h.json" 2>"$W/h.log" || { cat "$W/h.log"; fail "distill --hidden-weight"; }
grep -q "hidden 0\.[0-9]" "$W/h.log" || { cat "$W/h.log"; fail "no intermediate-state loss in the progress"; }
! grep -q "warning" "$W/h.log" || { cat "$W/h.log"; fail "the slice's channels were not the ranked parent's"; }
python3 - "$W/h.json" <<'PY' || fail "distillation with the intermediate-state loss: $(cat "$W/h.json")"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["hidden_weight"] == 1 and r["val_loss_distilled"] < r["val_loss_pruned"], r
PY
if "$BIN" distill "${D[@]}" --student "$W/s" --tokens 6000 --ckpt-dir "$W/ckA" --out "$W/outH2" --hidden-weight 1 \
    >/dev/null 2>"$W/h2.log"; then fail "a checkpoint without the intermediate-state loss resumed with it"; fi
grep -q "options" "$W/h2.log" || { cat "$W/h2.log"; fail "refusal of another run's checkpoint: no reason"; }
if "$BIN" distill "${D[@]}" --student "$W/outA" --tokens 2000 --ckpt-dir "$W/ckH3" --out "$W/outH3" \
    --hidden-weight 1 >/dev/null 2>"$W/h3.log"; then fail "--hidden-weight without a ranking accepted"; fi
grep -q "needs the ranking the student was cut with" "$W/h3.log" || { cat "$W/h3.log"; fail "no-ranking message"; }
# a student distilled before: its embeddings are no longer the ranked parent's, and it is told
cp "$W/s/ranking.json" "$W/outA/"
"$BIN" distill "${D[@]}" --student "$W/outA" --tokens 256 --ckpt-dir "$W/ckH4" --out "$W/outH4" --hidden-weight 1 \
    >/dev/null 2>"$W/h4.log" || { cat "$W/h4.log"; fail "distill --hidden-weight of a distilled student"; }
grep -q "warning: the student's embeddings are not the ranked parent's" "$W/h4.log" || { cat "$W/h4.log"; fail "no warning"; }
rm "$W/outA/ranking.json"

"$BIN" distill "${D[@]}" --student "$W/s" --tokens 6000 --ckpt-dir "$W/ckB" --out "$W/outB" \
    >"$W/b1.json" 2>"$W/b1.log" &
pid=$!
for _ in $(seq 1 600); do
    [ -e "$W/ckB/step-0000000008/DONE" ] && break
    kill -0 $pid 2>/dev/null || break
    sleep 0.1
done
kill -9 $pid 2>/dev/null && echo "killed distill (pid $pid) after checkpoint 8" || echo "distill finished before the kill"
wait $pid 2>/dev/null || true
if [ -e "$W/ckB/step-0000000024/DONE" ]; then
    # too fast to kill: stop it deterministically instead
    rm -rf "$W/ckB"
    "$BIN" distill "${D[@]}" --student "$W/s" --tokens 6000 --ckpt-dir "$W/ckB" --out "$W/outB" --max-steps 10 \
        >/dev/null 2>&1 || fail "stopped run"
fi
"$BIN" distill "${D[@]}" --student "$W/s" --tokens 6000 --ckpt-dir "$W/ckB" --out "$W/outB" \
    >"$W/b.json" 2>"$W/b.log" || { cat "$W/b.log"; fail "resumed distill"; }
[ "$(field "$W/b.json" resumed_from)" -gt 0 ] || fail "did not resume: $(cat "$W/b.json")"
[ "$(field "$W/a.json" final_loss)" = "$(field "$W/b.json" final_loss)" ] ||
    fail "loss at step 24 differs: straight $(field "$W/a.json" final_loss) resumed $(field "$W/b.json" final_loss)"
cmp -s "$W/outA/model.safetensors" "$W/outB/model.safetensors" || fail "resumed weights differ"
# the distilled student pruned again (iterative pruning): its parent is a snapshot folder, so
# the tokenizer is found through both manifests, for the ranking and for perplexity after
python3 - "$W" <<'PY'
import json, sys
a = json.load(open(sys.argv[1] + "/outA/arch.json"))
for i, l in enumerate(a["layers"]):
    l["source_layer"] = i
a["layers"][0]["mlp"]["ffn_dim"] //= 2
json.dump(a, open(sys.argv[1] + "/again.json", "w"))
PY
"$BIN" prune "$W/outA" --arch "$W/again.json" --out "$W/again" --calib "$TEXT" --calib-tokens 1024 --layer-tokens 0 \
    --seq 128 --no-reconstruct --threads 1 >/dev/null 2>"$W/again.log" || { cat "$W/again.log"; fail "prune of a distilled student"; }
python3 -c "import sys; p = float(sys.argv[1]); assert 1 < p < 1e4, p" "$(ppl "$W/again")" \
    || fail "perplexity of a student pruned twice"
# data parallel: 2 ranks (processes) share each step's 2 micro-batches; the same run as one
# process within fp32 reduction-order tolerance
P=(--parent "$MODEL" --data "$TEXT" --batch 4 --seq 64 --accum 2 --ckpt-every 4 --eval-every 8 --val-tokens 512
   --threads 1 --student "$W/s" --tokens 6000)
"$BIN" distill "${P[@]}" --ckpt-dir "$W/ckS" --out "$W/outS" >"$W/s1.json" 2>"$W/s1.log" ||
    { cat "$W/s1.log"; fail "distill --accum 2"; }
"$BIN" distill "${P[@]}" --ranks 2 --ckpt-dir "$W/ckR" --out "$W/outR" >"$W/r2.json" 2>"$W/r2.log" ||
    { cat "$W/r2.log"; fail "distill --ranks 2"; }
grep -q "2 ranks (processes)" "$W/r2.log" || fail "no ranks line: $(cat "$W/r2.log")"
python3 - "$W/s1.json" "$W/r2.json" <<'PY' || fail "2 ranks differ from one process"
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:3])
assert a["steps"] == b["steps"] == 12 and a["tokens"] == b["tokens"] == 6000, (a, b)
for k in ("final_loss", "val_loss_distilled"):
    assert abs(a[k] - b[k]) <= 1e-5 * abs(a[k]), (k, a[k], b[k])
print("distill --ranks 2: final loss %.7f vs %.7f alone; %.0f vs %.0f tok/s" %
      (b["final_loss"], a["final_loss"], b["tokens_per_s"], a["tokens_per_s"]))
PY
# the same with the intermediate-state loss: its weight comes from each micro-batch's own values,
# so two ranks still train as one process does
"$BIN" distill "${P[@]}" --hidden-weight 1 --ckpt-dir "$W/ckSH" --out "$W/outSH" >"$W/s1h.json" 2>"$W/s1h.log" ||
    { cat "$W/s1h.log"; fail "distill --accum 2 --hidden-weight 1"; }
"$BIN" distill "${P[@]}" --hidden-weight 1 --ranks 2 --ckpt-dir "$W/ckRH" --out "$W/outRH" >"$W/r2h.json" \
    2>"$W/r2h.log" || { cat "$W/r2h.log"; fail "distill --ranks 2 --hidden-weight 1"; }
python3 - "$W/s1h.json" "$W/r2h.json" "$W/s1.json" <<'PY' || fail "2 ranks differ from one process with --hidden-weight"
import json, sys
a, b, plain = (json.load(open(f)) for f in sys.argv[1:4])
for k in ("final_loss", "val_loss_distilled"):
    assert abs(a[k] - b[k]) <= 1e-5 * abs(a[k]), (k, a[k], b[k])
assert a["val_loss_distilled"] != plain["val_loss_distilled"], "the loss changed nothing"
print("distill --ranks 2 --hidden-weight 1: final loss %.7f vs %.7f alone" % (b["final_loss"], a["final_loss"]))
PY
# a rank killed mid-run: rank 0 stops within seconds naming it; a rerun resumes
"$BIN" distill "${P[@]}" --tokens 400000 --ranks 2 --ckpt-dir "$W/ckK" --out "$W/outK" >"$W/k.json" 2>"$W/k.log" &
pid=$!
for _ in $(seq 1 600); do
    [ -e "$W/ckK/step-0000000004/DONE" ] && break
    sleep 0.05
done
kid=$(pgrep -P $pid | head -1)
[ -n "$kid" ] || fail "no rank 1 process under $pid"
kill -9 "$kid"
t0=$(date +%s)
set +e
wait $pid; rc=$?
set -e
[ $rc -ne 0 ] || fail "rank 0 succeeded without its peer"
[ $(( $(date +%s) - t0 )) -le 10 ] || fail "rank 0 took over 10 s to notice"
grep -q "rank 1 (pid $kid) is gone" "$W/k.log" || { cat "$W/k.log"; fail "the failure does not name the dead rank"; }
"$BIN" distill "${P[@]}" --tokens 400000 --ranks 2 --max-steps 8 --ckpt-dir "$W/ckK" --out "$W/outK" \
    >"$W/k2.json" 2>"$W/k2.log" || { cat "$W/k2.log"; fail "rerun after a dead rank"; }
[ "$(field "$W/k2.json" steps)" -gt 4 ] || fail "rerun did not go on: $(cat "$W/k2.json")"
echo "a killed rank: rank 0 failed with \"$(grep -o 'rank 1 (pid [0-9]*) is gone' "$W/k.log")\"; the rerun went on to step $(field "$W/k2.json" steps)"
# a rank that cannot be started (fork fails for rank 2 of 3): the run fails at once, naming
# it, and rank 1, already started, gives up rather than wait for peers that never come
cat >"$W/nofork.c" <<'C'
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <unistd.h>
pid_t fork(void)
{
    static int n;
    if (++n == 2) {
        errno = EAGAIN;
        return -1;
    }
    pid_t (*real)(void) = (pid_t (*)(void))dlsym(RTLD_NEXT, "fork");
    return real();
}
C
cc -shared -fPIC -o "$W/nofork.so" "$W/nofork.c" -ldl || fail "building the fork shim"
t0=$(date +%s)
set +e
ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0 LD_PRELOAD="$W/nofork.so" timeout 120 \
    "$BIN" distill "${P[@]}" --ranks 3 --ckpt-dir "$W/ckF" --out "$W/outF" >"$W/f.json" 2>"$W/f.log"
rc=$?
set -e
took=$(( $(date +%s) - t0 ))
[ $rc -ne 124 ] || fail "distill --ranks 3 with rank 2 unstartable still ran after 120 s"
[ $rc -ne 0 ] || fail "distill --ranks 3 succeeded without rank 2"
grep -q "cannot start rank 2" "$W/f.log" || { cat "$W/f.log"; fail "the failure does not name rank 2"; }
[ $took -le 30 ] || fail "a failed rank start took $took s to end the run"
pgrep -f "$W/ckF" >/dev/null && fail "a rank of the failed run is still running"
echo "a rank that cannot start: the run failed in $took s naming it"

echo "prune/distill CLI: resumed from step $(field "$W/b.json" resumed_from), final loss $(field "$W/b.json" final_loss) in both runs;" \
     "val loss parent $(field "$W/a.json" val_loss_parent) pruned $(field "$W/a.json" val_loss_pruned) distilled $(field "$W/a.json" val_loss_distilled)"
