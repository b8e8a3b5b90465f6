#!/bin/bash
# What `make run` runs: start `autocompress serve` with its embedded defaults (SQLite and
# artifacts under ./var, CPU backend, 127.0.0.1:8080), then scripts/demo.sh against it: a
# real stories260K compression job submitted with curl, its events followed, its report
# printed and its checkpoint downloaded and verified (sha-256). stories260K and the
# TinyStories text are copied from the shared data folder ($AC_SHARED, default ../shared)
# into ./var. The server then keeps running in the foreground (Ctrl-C stops it
# gracefully); with DEMO_ONLY=1 it is stopped after the demo and the demo's status is
# the exit status.
set -u
BIN=${1:-build/autocompress}
ADDR=${AC_LISTEN:-127.0.0.1:8080}
URL=http://$ADDR
SHARED=${AC_SHARED:-$(cd "$(dirname "$0")/../.." && pwd)/shared}
DEMO=$(dirname "$0")/demo.sh
# Idle OpenMP threads spin about 2 ms, then sleep: no core spins while the server idles,
# and decode (many small parallel regions per token) does not pay a wake-up for each, as it
# does under OMP_WAIT_POLICY=passive (SmolLM2 decode and training at half speed).
export GOMP_SPINCOUNT=${GOMP_SPINCOUNT:-30000}
export AC_SHARED=$SHARED                             # evaluation task data
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
stop() { kill -TERM $pid 2>/dev/null; wait $pid; }
trap 'stop; exit 0' INT TERM
for _ in $(seq 100); do
    curl -fs "$URL/healthz" >/dev/null 2>&1 && break
    kill -0 $pid 2>/dev/null || { echo "run.sh: the server did not start (is $ADDR in use?)" >&2; exit 1; }
    sleep 0.1
done

status=0
if [ -f var/models/stories260K/stories260K.bin ] && [ -d var/data/tinystories ]; then
    "$DEMO" "$URL"
    status=$?
else
    echo "run.sh: $SHARED/data/models/stories260K or its text not found; no demo job" >&2
    status=1
fi
if [ "${DEMO_ONLY:-0}" = 1 ]; then
    stop
    exit $status
fi
printf '\n\033[1m== server running at %s (pid %s); try: curl %s/v1/jobs — Ctrl-C stops it\033[0m\n' "$URL" $pid "$URL"
wait $pid
