#!/bin/bash
# docker/check.sh — build the CPU image (docker/Dockerfile) and check it the way a user
# runs it, with Docker or Podman:
#   1. the build, timed, and the image's size;
#   2. what the run stage holds: the unprivileged user (uid 10001), no Python, the
#      ac-llama helper loading the llama.cpp it was built with;
#   3. the container started with a data folder mounted at its volume: HEALTHCHECK's
#      command answers, GET /v1/engines lists llama.cpp as present;
#   4. scripts/demo.sh against it (make run's demo: a stories260K job whose checkpoint is
#      downloaded and verified by sha-256);
#   5. a stories260K job with llama.cpp as the target engine (calibrated, measured and
#      exported as an F16 GGUF inside the container; its widths do not quantize to q8_0);
#   6. the container killed (SIGKILL to every process in it) while a job distils, then
#      started again: the job resumes at the distillation, not from the start, and succeeds;
#   7. the container stopped (SIGTERM, as `docker stop` sends it) while a job distils: it
#      exits 0 within the grace period, and after a start the job succeeds;
#   8. a worker killed while its llama.cpp helper serves: the helper does not outlive it,
#      PID 1 (tini) reaps it, the job is retried and succeeds; no zombie is left.
# Prints one line per check and exits 1 if any failed.
#
# Environment: ENGINE (docker or podman; default the first whose `info` answers), IMAGE (the tag to
# build or check; default localhost/autocompress:check), NO_BUILD=1 (check IMAGE as it
# is), BUILD_OPTS (more options for the build, e.g. podman's -v to pass a proxy's CA
# bundle), PORT (host port, default 18080), AC_SHARED (the shared data folder, default
# ../shared), KEEP=1 (leave the container and its data folder for inspection).
set -uo pipefail
cd "$(dirname "$0")/.."
if [ -z "${ENGINE:-}" ]; then   # the first that answers: a docker client without a daemon does not
    for e in docker podman; do
        command -v "$e" >/dev/null && "$e" info >/dev/null 2>&1 && { ENGINE=$e; break; }
    done
fi
[ -n "${ENGINE:-}" ] || { echo "docker/check.sh: no container engine answers (docker info, podman info)" >&2; exit 2; }
IMAGE=${IMAGE:-localhost/autocompress:check}
PORT=${PORT:-18080}
SHARED=${AC_SHARED:-$(cd .. && pwd)/shared}
URL=http://127.0.0.1:$PORT
NAME=ac-check-$$
WORK=$(mktemp -d)
failures=0

ok() { printf 'ok    %s\n' "$*"; }
bad() { printf 'FAIL  %s\n' "$*"; failures=$((failures + 1)); }
die() { bad "$*"; finish; }
finish() {
    if [ "${KEEP:-0}" = 1 ]; then
        echo "kept: container $NAME, data folder $WORK"
    else
        "$ENGINE" rm -f "$NAME" >/dev/null 2>&1
        # the data folder belongs to the image's user: remove it from inside a container
        "$ENGINE" run --rm --user 0 --entrypoint sh -v "$WORK:/w" "$IMAGE" -c 'rm -rf /w/* /w/.[!.]*' >/dev/null 2>&1
        rm -rf "$WORK"
    fi
    echo "$failures failed"
    [ "$failures" = 0 ]
    exit
}
trap finish INT TERM
api() { curl -sS --max-time 70 "$@"; }
job_field() { api "$URL/v1/jobs/$1" | jq -r "$2"; }
# wait_job ID SECONDS: until the job ends; prints its status
wait_job() {
    local t=0 st
    while [ "$t" -lt "$2" ]; do
        st=$(job_field "$1" .status 2>/dev/null)
        case $st in succeeded|failed|cancelled) echo "$st"; return ;; esac
        sleep 1; t=$((t + 1))
    done
    echo "timeout"
}
# wait_distill ID: until the job's distillation is a quarter done (it checkpoints every tenth)
wait_distill() {
    local t=0
    while [ "$t" -lt 1200 ]; do
        api "$URL/v1/jobs/$1/events?limit=1000" |
            jq -e '[.data[] | select(.type == "distill.progress" and .data.step * 4 >= .data.steps)] | length > 0' \
            >/dev/null 2>&1 && return 0
        sleep 0.5; t=$((t + 1))
    done
    return 1
}
resumed_from() { api "$URL/v1/jobs/$1/report" | jq -r '.distillation | "\(.resumed_from_step // 0) of \(.steps)"'; }
started_stages() { api "$URL/v1/jobs/$1/events?limit=1000" | jq -c '[.data[] | select(.type == "stage.started") | .data.stage]'; }
start_container() {
    "$ENGINE" start "$NAME" >/dev/null || return 1
    wait_ready
}
wait_ready() {
    local t=0
    while [ "$t" -lt 60 ]; do
        "$ENGINE" exec "$NAME" autocompress healthcheck --ready >/dev/null 2>&1 && return 0
        sleep 1; t=$((t + 1))
    done
    return 1
}

# 1. build
if [ "${NO_BUILD:-0}" != 1 ]; then
    t0=$(date +%s)
    # shellcheck disable=SC2086
    if "$ENGINE" build ${BUILD_OPTS:-} -f docker/Dockerfile -t "$IMAGE" . >"$WORK/build.log" 2>&1; then
        ok "build: $((($(date +%s) - t0))) s ($ENGINE)"
    else
        tail -20 "$WORK/build.log"; die "build (log above)"
    fi
fi
size=$("$ENGINE" image inspect "$IMAGE" --format '{{.Size}}' 2>/dev/null) || die "no image $IMAGE"
ok "image $IMAGE: $((size / 1048576)) MiB"

# 2. the run stage
u=$("$ENGINE" run --rm --entrypoint id "$IMAGE" -u)
[ "$u" = 10001 ] && ok "runs as uid 10001" || bad "runs as uid '$u', not 10001"
if "$ENGINE" run --rm --entrypoint sh "$IMAGE" -c 'command -v python3 || command -v python' >/dev/null 2>&1; then
    bad "the run stage has a Python"
else
    ok "no Python in the run stage"
fi
info=$("$ENGINE" run --rm --entrypoint ac-llama "$IMAGE" info 2>&1)
if [ $? = 0 ] && grep -q 'llama.cpp' <<<"$info"; then
    ok "ac-llama info: $(head -1 <<<"$info" | cut -c1-100)"
else
    bad "ac-llama info: $info"
fi
libs=$("$ENGINE" run --rm --entrypoint sh "$IMAGE" -c 'ldd /usr/local/bin/ac-llama' 2>&1)
if grep -q 'libllama.so[.0-9]* => /usr/local/lib/autocompress/llama.cpp/' <<<"$libs" && ! grep -q 'not found' <<<"$libs"; then
    ok "ac-llama loads libllama from /usr/local/lib/autocompress/llama.cpp"
else
    bad "ac-llama's libraries: $libs"
fi

# 3. the server, with a data folder holding stories260K and its text at the volume
mkdir -p "$WORK/models/stories260K" "$WORK/data"
cp "$SHARED/data/models/stories260K/stories260K.bin" "$SHARED/data/models/stories260K/tok512.bin" \
    "$WORK/models/stories260K/" || die "stories260K not found under $SHARED"
cp -r "$SHARED/data/text/tinystories" "$WORK/data/tinystories" || die "TinyStories not found under $SHARED"
chmod -R a+rwX "$WORK"
"$ENGINE" run -d --name "$NAME" -p "127.0.0.1:$PORT:8080" -v "$WORK:/var/lib/autocompress" \
    -v "$SHARED:/shared:ro" -e AC_SHARED=/shared "$IMAGE" >/dev/null || die "the container did not start"
if wait_ready; then ok "HEALTHCHECK's command (autocompress healthcheck --ready) answers"; else
    "$ENGINE" logs "$NAME" 2>&1 | tail -5; die "not ready within 60 s"; fi
api "$URL/v1/engines" | jq -e '.engines[] | select(.name == "llama.cpp") | .present' >/dev/null \
    && ok "GET /v1/engines: llama.cpp present ($(api "$URL/v1/engines" | jq -r '.engines[1].version'))" \
    || bad "GET /v1/engines: $(api "$URL/v1/engines")"

# 4. make run's demo
t0=$(date +%s)
if scripts/demo.sh "$URL" >"$WORK/demo.log" 2>&1; then
    ok "scripts/demo.sh: job succeeded, checkpoint verified ($(($(date +%s) - t0)) s)"
else
    tail -15 "$WORK/demo.log"; bad "scripts/demo.sh (log above)"
fi

# 5. llama.cpp as the target engine
base='"model": {"path": "models/stories260K/stories260K.bin", "tokenizer": "models/stories260K/tok512.bin"},
  "search_space": {"hidden": true, "heads": false, "ffn": false, "depth": false},
  "data": {"calibration": "data/tinystories/validation_100.txt", "distillation": "data/tinystories/validation_100.txt"},
  "evaluation": {"tasks": ["lambada_openai"], "limit": 20}'
spec='{"name": "check-llama.cpp", '"$base"',
  "target": {"device": "cpu", "engine": "llama.cpp", "precision": "f16", "threads": 2,
             "workload": {"batch_size": 1, "prompt_tokens": 32, "output_tokens": 8}},
  "constraints": {"params": 200000},
  "budgets": {"search_tokens": 8192, "distill_tokens": 16384},
  "export": ["gguf"]}'
t0=$(date +%s)
id=$(api -X POST "$URL/v1/jobs" -H 'Content-Type: application/json' -d "$spec" | jq -r '.id // empty')
st=$(wait_job "$id" 900)
if [ "$st" = succeeded ]; then
    took=$(($(date +%s) - t0))
    ok "llama.cpp target job: succeeded in $took s; $(api "$URL/v1/jobs/$id/report" | jq -r '"measured in \(.engine.name) \(.engine.version) at \(.engine.precision): \(.result.measured.latency_ms * 100 | round / 100) ms a request (\(.result.measured.method | split(";")[0]))"')"
    want=$(api "$URL/v1/jobs/$id/artifacts" | jq -r '.data[] | select(.name == "model.gguf") | .sha256')
    api -o "$WORK/model.gguf" "$URL/v1/jobs/$id/artifacts/model.gguf"
    [ "$(head -c 4 "$WORK/model.gguf")" = GGUF ] && [ "$(sha256sum <"$WORK/model.gguf" | cut -d' ' -f1)" = "$want" ] \
        && ok "model.gguf downloaded: a GGUF file, sha-256 as recorded" || bad "model.gguf: not the GGUF file recorded"
else
    bad "llama.cpp target job: $st $(job_field "$id" '.error')"
fi

# 6. SIGKILL to the whole container while a job distils, then start it again
spec='{"name": "check-kill", '"$base"',
  "target": {"device": "cpu", "precision": "fp32", "workload": {"batch_size": 1, "prompt_tokens": 32, "output_tokens": 8}},
  "constraints": {"params": 200000},
  "budgets": {"search_tokens": 8192, "distill_tokens": 1048576},
  "export": ["gguf"]}'
id=$(api -X POST "$URL/v1/jobs" -H 'Content-Type: application/json' -d "$spec" | jq -r '.id // empty')
if [ -n "$id" ] && wait_distill "$id"; then
    before=$(started_stages "$id")
    "$ENGINE" kill --signal KILL "$NAME" >/dev/null
    start_container || die "the container did not come back after SIGKILL"
    st=$(wait_job "$id" 900)
    after=$(started_stages "$id")
    att=$(job_field "$id" .attempts)
    from=$(resumed_from "$id")
    # the stages started before the kill, then the distillation again (from its checkpoint)
    # and the stages after it
    if [ "$st" = succeeded ] && [ "$att" = 2 ] && jq -n -e --argjson b "$before" --argjson a "$after" \
        '$b[-1] == "distill" and $a[:($b | length)] == $b and $a[$b | length] == "distill"' >/dev/null &&
        [ "${from%% *}" -gt 0 ]; then
        ok "SIGKILL mid-distillation: resumed (stages started $after; distillation from step $from), attempts 2, succeeded"
    else
        bad "SIGKILL mid-distillation: $st, attempts $att, stages before $before, after $after, from step $from"
    fi
else
    bad "SIGKILL check: the job did not reach its distillation ($(job_field "$id" '{status, stage, error}' 2>&1))"
fi

# 7. SIGTERM (docker stop) while a job distils
id=$(api -X POST "$URL/v1/jobs" -H 'Content-Type: application/json' \
     -d "$(jq -c '.name = "check-stop"' <<<"$spec")" | jq -r '.id // empty')
if [ -n "$id" ] && wait_distill "$id"; then
    t0=$(date +%s)
    "$ENGINE" stop -t 60 "$NAME" >/dev/null
    code=$("$ENGINE" inspect "$NAME" --format '{{.State.ExitCode}}')
    took=$(($(date +%s) - t0))
    [ "$code" = 0 ] && [ "$took" -lt 30 ] && ok "docker stop mid-distillation: exit 0 in $took s" \
        || bad "docker stop mid-distillation: exit $code in $took s"
    start_container || die "the container did not come back after stop"
    st=$(wait_job "$id" 900)
    from=$(resumed_from "$id")
    [ "$st" = succeeded ] && [ "${from%% *}" -gt 0 ] &&
        ok "after the stop: the job resumed (distillation from step $from) and succeeded" \
        || bad "after the stop: $st $(job_field "$id" '.error')"
else
    bad "stop check: the job did not reach its distillation"
fi
# 8. a worker killed while its llama.cpp helper serves (as the OOM killer would): the helper
# dies with it, and PID 1 reaps it
id=$(api -X POST "$URL/v1/jobs" -H 'Content-Type: application/json' \
     -d "$(jq -c '.name = "check-orphan" | .target = {"device": "cpu", "engine": "llama.cpp", "precision": "f16",
                  "threads": 2, "workload": {"batch_size": 1, "prompt_tokens": 32, "output_tokens": 8}}' <<<"$spec")" |
     jq -r '.id // empty')
found=""
for _ in $(seq 600); do
    found=$("$ENGINE" exec "$NAME" sh -c 'for s in /proc/[0-9]*/stat; do
        read -r pid comm state ppid rest < "$s" 2>/dev/null && [ "$comm" = "(ac-llama)" ] && [ "$state" != Z ] &&
        echo "$pid $ppid" && break; done' 2>/dev/null)
    [ -n "$found" ] && break
    sleep 0.1
done
if [ -n "$found" ]; then
    "$ENGINE" exec "$NAME" sh -c "kill -KILL ${found#* }" || bad "could not kill the worker ${found#* }"
    sleep 2
    # the helper the worker was running then (not necessarily the one seen: they last a
    # fraction of a second) is an orphan of PID 1, alive or unreaped, unless it died and was reaped
    left=$("$ENGINE" exec "$NAME" sh -c 'cat /proc/[0-9]*/stat' | awk '$2 == "(ac-llama)" && $4 == 1 {print $1, $3}')
    st=$(wait_job "$id" 900)
    att=$(job_field "$id" .attempts)
    if [ -z "$left" ] && [ "$st" = succeeded ] && [ "$att" = 2 ]; then
        ok "worker killed while its llama.cpp helper served: no helper left under PID 1; the job retried and succeeded"
    else
        bad "worker killed while its llama.cpp helper served: helpers under PID 1 (pid, state): ${left:-none}; the job $st after $att attempts"
    fi
else
    bad "the llama.cpp job's helper was never seen running ($(job_field "$id" .status))"
fi
zombies=$("$ENGINE" exec "$NAME" sh -c 'cat /proc/[0-9]*/stat' | awk '$3 == "Z" {print $1, $2}')
[ -z "$zombies" ] && ok "no zombie processes left in the container" || bad "zombies in the container: $zombies"
finish
