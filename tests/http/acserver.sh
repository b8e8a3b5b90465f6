# Helpers for the bash black-box tests (sourced, not run: no test_ prefix), the shell
# twin of acserver.py: a scratch folder $tmp removed on exit with every helper process
# (append their pids to helpers) and the server; start the real `autocompress serve` on
# a free loopback port (read from its "listening" log line), stop it with SIGTERM and
# fail on a sanitizer report, and talk to it with curl.
#   start_server DATA_DIR ARGS...   sets SPID, PORT (env such as AC_TEST_STAGES=1 passes through)
#   stop_server                     sets STOP_S (seconds SIGTERM took)
#   req METHOD PATH [BODY]          sets CODE, BODY
#   expect CODE JQ-FILTER           the filter must print true for BODY
#   wait_status ID STATUS [SECS]    polls /v1/models/ID (default 30 s); sets WAITED
# With AC_TEST_PG (tests/run_all.sh's PostgreSQL pass) each data directory gets a
# PostgreSQL database of its own as its store, the same one again when restarted.
tmp=$(mktemp -d)
helpers=()
SPID=""
cleanup() {
    set +e
    [ -n "$SPID" ] && kill "$SPID" 2>/dev/null && wait "$SPID" 2>/dev/null
    for p in "${helpers[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
    rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; [ -f "$tmp/server.log" ] && tail -20 "$tmp/server.log"; exit 1; }

store_for() {   # the AC_STORE of data directory $1 ("" = SQLite)
    [ -n "${AC_TEST_PG:-}" ] || return 0
    local name="ac_$(realpath -m "$1" | sha1sum | cut -c1-20)"
    psql -qtA "$AC_TEST_PG" -c "SELECT 1 FROM pg_database WHERE datname='$name'" | grep -q 1 ||
        psql -q "$AC_TEST_PG" -c "CREATE DATABASE $name" >/dev/null
    printf '%s\n' "$AC_TEST_PG" | sed "s|^postgresql:///[^?]*|postgresql:///$name|"
}
start_server() {
    local dir=$1; shift
    mkdir -p "$dir/models"
    : > "$tmp/server.log"
    AC_STORE=$(store_for "$dir") "$AC_BIN" serve --listen 127.0.0.1:0 --data-dir "$dir" "$@" >> "$tmp/server.log" 2>&1 &
    SPID=$!
    PORT=""
    for _ in $(seq 150); do
        PORT=$(grep '"msg":"listening"' "$tmp/server.log" | head -1 | jq -r .port 2>/dev/null || true)
        [ -n "$PORT" ] && return 0
        kill -0 "$SPID" 2>/dev/null || fail "server exited"
        sleep 0.1
    done
    fail "server did not start"
}
stop_server() {
    local t0=$(date +%s.%N)
    kill -TERM "$SPID"
    wait "$SPID" || fail "server exit status $?"
    SPID=""
    STOP_S=$(echo "$(date +%s.%N) - $t0" | bc)
    ! grep -q 'AddressSanitizer\|LeakSanitizer\|runtime error:' "$tmp/server.log" || fail "sanitizer report"
}
req() {
    if [ $# -ge 3 ]; then
        CODE=$(curl -s -o "$tmp/body" -w '%{http_code}' -X "$1" -H 'Content-Type: application/json' \
               --data-binary "$3" "http://127.0.0.1:$PORT$2")
    else
        CODE=$(curl -s -o "$tmp/body" -w '%{http_code}' -X "$1" "http://127.0.0.1:$PORT$2")
    fi
    BODY=$(cat "$tmp/body")
}
expect() {
    [ "$CODE" = "$1" ] || fail "expected $1, got $CODE: $BODY"
    [ "$(echo "$BODY" | jq "$2")" = true ] || fail "$2 does not hold for $BODY"
}
wait_status() {
    local t0=$(date +%s.%N) secs=${3:-30}
    for _ in $(seq $((secs * 10))); do
        req GET "/v1/models/$1"
        if [ "$(echo "$BODY" | jq -r .status)" = "$2" ]; then
            WAITED=$(echo "$(date +%s.%N) - $t0" | bc)
            return 0
        fi
        sleep 0.1
    done
    fail "model $1 not $2 after $secs s: $BODY"
}
