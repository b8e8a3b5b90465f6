#!/bin/bash
# The fleet on one host: jobs claimed per second and status reads per second with 1, 2
# and 4 worker agents (`autocompress worker`, each with a data directory of its own, as
# separate hosts would have) behind one API server that runs no jobs (--workers 0), on
# PostgreSQL (a throwaway server from tests/tools/pg.sh) beside SQLite (one file the
# agents and the server share). Each case queues JOBS one-stage test jobs (a 50 ms
# test_sleep: the claim, the worker process and the store writes are what is timed), then
# starts the agents and, while they drain the queue, runs wrk on GET /v1/jobs/{id}.
# Prints a table and writes bench/results/fleet.md with the machine's ceilings.
#   usage: bench/fleet/run.sh [BUILD_DIR]   (env: JOBS=200 SLOTS=2 READ_S=5 CONNS=16)
set -eu
cd "$(dirname "$0")/../.."
BUILD=${1:-build}
BIN=$PWD/$BUILD/autocompress
JOBS=${JOBS:-200}
SLOTS=${SLOTS:-2}
READ_S=${READ_S:-5}
CONNS=${CONNS:-16}
command -v wrk >/dev/null || { echo "wrk is not installed (make deps)"; exit 1; }
[ -x "$BIN" ] || { echo "$BIN not built (make BUILD=$BUILD)"; exit 1; }
tmp=$(mktemp -d)
pgdir=$(mktemp -d /tmp/ac-pg-XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
    tests/tools/pg.sh stop "$pgdir"
    rm -rf "$tmp" "$pgdir"
}
trap cleanup EXIT
pg_base=$(tests/tools/pg.sh start "$pgdir")
export AC_TEST_STAGES=1

wait_line() {   # wait_line FILE PATTERN: the first line of FILE matching PATTERN
    for _ in $(seq 300); do
        grep -m1 "$2" "$1" 2>/dev/null && return 0
        sleep 0.05
    done
    echo "no '$2' in $1:" >&2; cat "$1" >&2; exit 1
}
succeeded() {
    curl -s "$url/metrics" | sed -n 's/^ac_jobs{status="succeeded"} //p'
}

results=()
run_case() {   # run_case STORE_KIND AGENTS
    local kind=$1 agents=$2 dir=$tmp/$1-$2 store
    mkdir -p "$dir/api/models"
    # the smallest llama2.c checkpoint the model probe takes (the test stages never load it)
    python3 -c 'import struct, sys; sys.stdout.buffer.write(struct.pack("<7i", 8, 16, 1, 2, 2, 32, 4) + bytes(936 * 4))' \
        > "$dir/api/models/tiny.bin"
    if [ "$kind" = postgresql ]; then
        store=$(tests/tools/pg.sh newdb "$pg_base" "ac_fleet_$agents")
    else
        store=$dir/fleet.db
    fi
    "$BIN" serve --listen 127.0.0.1:0 --data-dir "$dir/api" --store "$store" --workers 0 2>"$dir/api.log" &
    local spid=$!
    pids+=("$spid")
    port=$(wait_line "$dir/api.log" '"msg":"listening"' | sed -n 's/.*"port":\([0-9]*\).*/\1/p')
    url=http://127.0.0.1:$port
    local first="" i
    for i in $(seq "$JOBS"); do
        id=$(curl -s -X POST "$url/v1/jobs" -H 'Content-Type: application/json' -d \
            '{"model":{"path":"models/tiny.bin"},"constraints":{"latency_ms":50},"x_test_pipeline":["test_sleep"],"x_test_sleep_ms":50}' |
            sed -n 's/^{"id":"\([a-z_0-9]*\)".*/\1/p')
        [ -n "$id" ] || { echo "$kind/$agents: POST /v1/jobs failed" >&2; cat "$dir/api.log" >&2; exit 1; }
        [ -n "$first" ] || first=$id
    done
    local apids=() t0 t1
    t0=$(date +%s.%N)
    for i in $(seq "$agents"); do
        "$BIN" worker --store "$store" --devices cpu --workers "$SLOTS" --data-dir "$dir/host$i" 2>"$dir/host$i.log" &
        apids+=($!)
        pids+=($!)
    done
    local out
    out=$(wrk --latency -t1 -c"$CONNS" -d"${READ_S}s" "$url/v1/jobs/$first")
    while [ "$(succeeded)" != "$JOBS" ]; do
        sleep 0.05
        [ "$(echo "$(date +%s.%N) - $t0 > 600" | bc)" = 1 ] && { echo "$kind/$agents: queue not drained" >&2; exit 1; }
    done
    t1=$(date +%s.%N)
    for p in "${apids[@]}" "$spid"; do kill -TERM "$p"; wait "$p" || true; done
    local wall rate rps p99 runners
    wall=$(echo "$t1 - $t0" | bc)
    rate=$(echo "scale=1; $JOBS / $wall" | bc)
    rps=$(echo "$out" | awk '/Requests\/sec/ {printf "%.0f", $2}')
    p99=$(echo "$out" | awk '$1=="99%" {print $2}')
    runners=$(cat "$dir"/host*.log | grep -c '"msg":"worker agent ready"' || true)
    printf '%-10s %6d agents %3d slots  %4d jobs in %6.1f s  %7s jobs/s  %7s status reads/s (p99 %s)\n' \
        "$kind" "$agents" "$((agents * SLOTS))" "$JOBS" "$wall" "$rate" "$rps" "$p99"
    results+=("| $kind | $agents | $((agents * SLOTS)) | $JOBS | $(printf '%.1f' "$wall") | $rate | $rps | $p99 |")
    [ "$runners" = "$agents" ] || { echo "only $runners of $agents agents started" >&2; exit 1; }
}

build/tools/ceilings_probe 2 > "$tmp/ceilings.txt"
for kind in sqlite postgresql; do
    for n in 1 2 4; do
        run_case "$kind" "$n"
    done
done
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
gemm=$(awk '$1=="sgemm_gflops" {print $2}' "$tmp/ceilings.txt")
bw=$(awk '$1=="triad_gbs" {print $2}' "$tmp/ceilings.txt")
ceil="machine: $cpu, $(nproc) cores; ceilings measured in this run: sgemm $gemm GFLOP/s, triad $bw GB/s (2 threads)"
echo "$ceil"
{
    echo "# The fleet on one host (bench/fleet/run.sh)"
    echo
    echo "$(date -u +%Y-%m-%dT%H:%MZ), $ceil; PostgreSQL $(psql --version | awk '{print $3}'), SQLite $(sqlite3 --version | awk '{print $1}')."
    echo
    echo "One API server (--workers 0) and N worker agents, each with its own data directory and $SLOTS worker"
    echo "slots, all on this host; $JOBS queued jobs of one 50 ms test stage each. jobs/s: the queue drained"
    echo "(claimed, run in a worker process, finished) per second of wall time from the agents' start."
    echo "Status reads: wrk, 1 thread, $CONNS connections, ${READ_S} s of GET /v1/jobs/{id} during the drain."
    echo "On 2 cores the agents, their worker processes, the database and wrk share the same CPUs."
    echo
    echo "| store | agents | worker slots | jobs | wall s | jobs/s | status reads/s | p99 |"
    echo "|---|---|---|---|---|---|---|---|"
    printf '%s\n' "${results[@]}"
} > bench/results/fleet.md
echo "wrote bench/results/fleet.md"
