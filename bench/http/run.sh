#!/bin/bash
# HTTP load benchmark (wrk): GET /v1/jobs/{id} status reads while a job runs, and job
# creation (POST /v1/jobs, each committed with fsync before 201). Prints requests/s and
# p50/p99 latency per case and writes bench/results/http.md with the machine's ceilings.
# Target (issue 2): >= 20,000 status reads/s with p99 < 5 ms on 2 cores while a job runs.
#   usage: bench/http/run.sh [BUILD_DIR]   (env: DURATION=10s CONNS=32 THREADS=1)
set -eu
cd "$(dirname "$0")/../.."
BUILD=${1:-build}
BIN=$PWD/$BUILD/autocompress
DURATION=${DURATION:-10s}
CONNS=${CONNS:-32}
WRK_THREADS=${THREADS:-1}
command -v wrk >/dev/null || { echo "wrk is not installed (apt-get install wrk)"; exit 1; }
[ -x "$BIN" ] || { echo "$BIN not built (make BUILD=$BUILD)"; exit 1; }
tmp=$(mktemp -d)
trap 'kill -TERM $spid 2>/dev/null; wait $spid 2>/dev/null; rm -rf "$tmp"' EXIT
mkdir -p "$tmp/var/models"
head -c 64 /dev/zero > "$tmp/var/models/tiny.bin"
AC_TEST_STAGES=1 "$BIN" serve --listen 127.0.0.1:0 --data-dir "$tmp/var" 2>"$tmp/server.log" &
spid=$!
for _ in $(seq 100); do
    port=$(sed -n 's/.*"msg":"listening".*"port":\([0-9]*\).*/\1/p' "$tmp/server.log" | head -1)
    [ -n "$port" ] && break
    sleep 0.05
done
[ -n "$port" ] || { cat "$tmp/server.log"; exit 1; }
url=http://127.0.0.1:$port
# a job that keeps its worker busy for the whole benchmark
id=$(curl -s -X POST "$url/v1/jobs" -H 'Content-Type: application/json' \
    -d '{"model":{"path":"models/tiny.bin"},"constraints":{"latency_ms":50},"x_test_pipeline":["test_sleep"],"x_test_sleep_ms":600000}' |
    sed -n 's/^{"id":"\([a-z_0-9]*\)".*/\1/p')
for _ in $(seq 100); do
    curl -s "$url/v1/jobs/$id" | grep -q '"status":"running"' && break
    sleep 0.05
done

# run NAME ARGS...: wrk, then "NAME req/s p50 p99" from its --latency output
results=()
run() {
    local name=$1; shift
    local out
    out=$(nice -n 0 wrk --latency -t"$WRK_THREADS" -c"$CONNS" -d"$DURATION" "$@")
    local rps p50 p99 errs
    rps=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
    p50=$(echo "$out" | awk '$1=="50%" {print $2}')
    p99=$(echo "$out" | awk '$1=="99%" {print $2}')
    errs=$(echo "$out" | awk '/Non-2xx/ {print $5}')
    printf '%-34s %12s req/s   p50 %-9s p99 %-9s %s\n' "$name" "$rps" "$p50" "$p99" "${errs:+non-2xx: $errs}"
    results+=("| $name | $rps | $p50 | $p99 | ${errs:-0} |")
}
echo "server: $BIN (http threads = online cores), wrk: $WRK_THREADS thread(s), $CONNS connections, $DURATION each"
run "GET /v1/jobs/{id} (job running)" "$url/v1/jobs/$id"
run "GET /healthz" "$url/healthz"
run "POST /v1/jobs (create, fsync)" -s bench/http/post_job.lua "$url/v1/jobs"
state=$(curl -s "$url/v1/jobs/$id" | sed -n 's/.*"status":"\([a-z]*\)".*/\1/p' | head -1)
echo "the background job is still: $state"

cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
cores=$(nproc)
mem_gib=$(awk '/MemTotal/ {printf "%.1f", $2/1048576}' /proc/meminfo)
bw=n/a
if [ -n "${AC_PYTHON:-}" ] || [ -x "$HOME/.cache/autocompress/venv/bin/python" ]; then
    py=${AC_PYTHON:-$HOME/.cache/autocompress/venv/bin/python}
    bw=$("$py" -c "
import numpy as np, time
a = np.ones(64 << 20, dtype=np.float32); b = np.empty_like(a)
best = 0
for _ in range(5):
    t = time.perf_counter(); np.copyto(b, a); dt = time.perf_counter() - t
    best = max(best, 2 * a.nbytes / dt / 1e9)
print('%.1f GB/s (numpy copy, read+write)' % best)" 2>/dev/null || echo n/a)
fi
ceil="machine: $cpu, $cores cores, ${mem_gib} GiB; GEMM ceiling: n/a for HTTP; memory bandwidth: $bw; load average during the run: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "$ceil"
{
    echo "# HTTP load (bench/http/run.sh)"
    echo
    echo "$(date -u +%Y-%m-%dT%H:%MZ), $ceil."
    echo "Server: \`autocompress serve\` defaults (libmicrohttpd, poll(), thread pool = cores); a test job runs in a worker"
    echo "process throughout. Load: wrk $WRK_THREADS thread(s), $CONNS connections, $DURATION per case, on the same machine."
    echo "Target: >= 20,000 status reads/s with p99 < 5 ms on 2 cores while a job runs."
    echo
    echo "| case | requests/s | p50 | p99 | non-2xx |"
    echo "|---|---|---|---|---|"
    printf '%s\n' "${results[@]}"
} > bench/results/http.md
echo "wrote bench/results/http.md"
