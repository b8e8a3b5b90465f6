#!/bin/bash
# What `make run` runs: start `autocompress serve` with its embedded defaults (SQLite and
# artifacts under ./var, CPU backend, 127.0.0.1:8080), then a demo against it: register
# stories260K (copied from the shared data folder into ./var/models if present), submit a
# compression job, long-poll it to the end and print its outcome and events. While a
# compression stage is missing from the build the job fails with "stage X is not
# available in this build" — the demo shows that rather than a fake success.
# The server keeps running afterwards; Ctrl-C stops it (gracefully).
set -u
BIN=${1:-build/autocompress}
ADDR=${AC_LISTEN:-127.0.0.1:8080}
URL=http://$ADDR
SHARED=${AC_SHARED:-$(cd "$(dirname "$0")/../.." && pwd)/shared}
mkdir -p var/models/stories260K var/data
for f in stories260K.bin tok512.bin; do
    src=$SHARED/data/models/stories260K/$f
    [ -f "$src" ] && [ ! -f var/models/stories260K/$f ] && cp "$src" var/models/stories260K/
done
src=$SHARED/data/text/tinystories
[ -d "$src" ] && [ ! -e var/data/tinystories ] && cp -r "$src" var/data/tinystories

"$BIN" serve --listen "$ADDR" --data-dir ./var 2>>var/server.log &
pid=$!
echo "server log (one JSON line per request): var/server.log"
trap 'kill -TERM $pid 2>/dev/null; wait $pid; exit 0' INT TERM
for _ in $(seq 100); do
    curl -fs "$URL/healthz" >/dev/null 2>&1 && break
    kill -0 $pid 2>/dev/null || { echo "run.sh: the server did not start (is $ADDR in use?)" >&2; exit 1; }
    sleep 0.1
done

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
say "devices"
curl -s "$URL/v1/devices"; echo
if [ -f var/models/stories260K/stories260K.bin ]; then
    calib=""
    txt=$(ls var/data/tinystories/* 2>/dev/null | head -1)
    [ -n "$txt" ] && calib=",\"data\":{\"calibration\":\"data/tinystories/$(basename "$txt")\",\"distillation\":\"data/tinystories/$(basename "$txt")\"}"
    spec='{"name":"demo-stories260K",
           "model":{"path":"models/stories260K/stories260K.bin","tokenizer":"models/stories260K/tok512.bin"},
           "target":{"device":"cpu","precision":"fp32","workload":{"batch_size":1,"prompt_tokens":64,"output_tokens":32}},
           "constraints":{"params":150000},
           "budgets":{"search_tokens":20000,"distill_tokens":50000}'"$calib"',
           "export":["gguf"]}'
    say "POST /v1/jobs (stories260K under a 150k-parameter limit)"
    job=$(curl -s -X POST "$URL/v1/jobs" -H 'Content-Type: application/json' -H "Idempotency-Key: demo-$(date +%s)" -d "$spec")
    echo "$job"
    id=$(printf '%s' "$job" | sed -n 's/^{"id":"\([a-z_0-9]*\)".*/\1/p')
    if [ -n "$id" ]; then
        say "GET /v1/jobs/$id?wait=60 (long-poll until it ends)"
        for _ in $(seq 30); do
            j=$(curl -s "$URL/v1/jobs/$id?wait=60")
            case $j in *'"status":"succeeded"'*|*'"status":"failed"'*|*'"status":"cancelled"'*) break ;; esac
        done
        echo "$j" | sed 's/"spec":.*//'
        say "events"
        curl -s "$URL/v1/jobs/$id/events?limit=1000" | tr '{' '\n' | sed -n 's/.*"type":"\([^"]*\)","message":"\([^"]*\)".*/  \1: \2/p'
        say "artifacts"
        curl -s "$URL/v1/jobs/$id/artifacts"; echo
    fi
else
    echo "run.sh: $SHARED/data/models/stories260K not found; skipping the demo job" >&2
fi
say "server running at $URL (pid $pid); try: curl $URL/v1/jobs — Ctrl-C stops it"
wait $pid
