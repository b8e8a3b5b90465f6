#!/bin/bash
# The images' commands run as plain processes (no container engine here): for each of
# docker/Dockerfile and docker/Dockerfile.cuda, its ENTRYPOINT (after tini) + CMD with its ENV (the
# listen address moved to a free loopback port, the data directory to a scratch one)
# serves, its HEALTHCHECK command then exits 0, and SIGTERM stops the server cleanly; then
# the compose file's fleet commands (below).
# store: own PostgreSQL (not run again in tests/run_all.sh's PostgreSQL pass)
set -eu
source "$(dirname "$0")/acserver.sh"
cd "$(dirname "$0")/../.."
for df in docker/Dockerfile docker/Dockerfile.cuda; do
    read -r -a entry < <(python3 - "$df" <<'PY'
import json, re, sys
src = open(sys.argv[1]).read()
def last(key):
    return json.loads(re.findall(r"^%s (\[.*\])$" % key, src, re.M)[-1])
print(" ".join(last("ENTRYPOINT") + last("CMD")))
PY
)
    read -r -a check < <(python3 - "$df" <<'PY'
import json, re, sys
print(" ".join(json.loads(re.findall(r"^HEALTHCHECK .* CMD (\[.*\])$", open(sys.argv[1]).read(), re.M)[-1])))
PY
)
    # tini as PID 1 (it reaps what a killed worker leaves), installed by the run stage; the
    # server is what it starts
    [ "${entry[*]:0:3}" = "tini -s --" ] || fail "$df: the entrypoint ${entry[*]} does not start with tini -s --"
    grep -q 'ca-certificates tini' "$df" || fail "$df: the run stage does not install tini"
    entry=("${entry[@]:3}")
    [ "${entry[0]}" = autocompress ] && [ "${check[0]}" = autocompress ] || fail "$df: commands ${entry[*]} / ${check[*]}"
    grep -q '^ENV AC_LISTEN=0.0.0.0:8080' "$df" || fail "$df: the image does not listen on 0.0.0.0:8080"
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    data=$tmp/data-$(basename "$df")
    mkdir -p "$data"
    AC_LISTEN=127.0.0.1:$port AC_DATA_DIR=$data "$AC_BIN" "${entry[@]:1}" > "$tmp/entry.log" 2>&1 &
    SPID=$!
    ok=0
    for _ in $(seq 100); do
        if AC_LISTEN=127.0.0.1:$port "$AC_BIN" "${check[@]:1}" 2>/dev/null; then ok=1; break; fi
        kill -0 "$SPID" 2>/dev/null || { cat "$tmp/entry.log"; fail "$df: '${entry[*]}' exited"; }
        sleep 0.1
    done
    [ $ok = 1 ] || fail "$df: '${check[*]}' never passed against '${entry[*]}'"
    [ -d "$data/artifacts" ] || fail "$df: the server did not use AC_DATA_DIR"
    kill -TERM "$SPID"
    wait "$SPID" || fail "$df: the server exited $? on SIGTERM"
    SPID=""
    echo "ok: $df: '${entry[*]}' served and '${check[*]}' passed"
done

# docker/compose.yaml's fleet profile: the API that runs no jobs and the worker agent, each
# command run as a plain process against a throwaway PostgreSQL server (the compose file's
# S3 and database addresses exist only inside compose): the API answers its health check
# and lists the agent's CPU as the agent's, and both stop on SIGTERM.
compose_command() {   # the command of compose service $1, words on one line
    python3 - docker/compose.yaml "$1" <<'PY'
import json, re, sys
svc = None
for line in open(sys.argv[1]):
    m = re.match(r"^  ([a-z0-9-]+):\s*$", line)
    if m:
        svc = m.group(1)
    m = re.match(r"^    command: (\[.*\])", line)
    if m and svc == sys.argv[2]:
        print(" ".join(json.loads(m.group(1))))
PY
}
read -r -a api_cmd < <(compose_command api-fleet)
read -r -a worker_cmd < <(compose_command worker)
[ "${api_cmd[0]:-}" = serve ] && [ "${worker_cmd[0]:-}" = worker ] || fail "compose fleet commands: ${api_cmd[*]} / ${worker_cmd[*]}"
pgdir=$(mktemp -d /tmp/ac-pg-XXXXXX)
helpers_pg() { tests/tools/pg.sh stop "$pgdir"; rm -rf "$pgdir"; }
trap 'helpers_pg; cleanup' EXIT
store=$(tests/tools/pg.sh newdb "$(tests/tools/pg.sh start "$pgdir")" ac_compose)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
mkdir -p "$tmp/fleet-api" "$tmp/fleet-worker"
AC_STORE=$store AC_LISTEN=127.0.0.1:$port AC_DATA_DIR=$tmp/fleet-api "$AC_BIN" "${api_cmd[@]}" > "$tmp/api.log" 2>&1 &
SPID=$!
AC_STORE=$store AC_DATA_DIR=$tmp/fleet-worker "$AC_BIN" "${worker_cmd[@]}" > "$tmp/worker.log" 2>&1 &
WPID=$!
helpers+=("$WPID")
ok=0
for _ in $(seq 100); do
    if AC_LISTEN=127.0.0.1:$port "$AC_BIN" healthcheck --ready 2>/dev/null &&
        curl -s "http://127.0.0.1:$port/v1/devices" | jq -e '[.data[] | select(.runner != null and .id == "cpu")] | length == 1' >/dev/null; then
        ok=1; break
    fi
    kill -0 "$SPID" 2>/dev/null && kill -0 "$WPID" 2>/dev/null || { cat "$tmp/api.log" "$tmp/worker.log"; fail "a fleet command exited"; }
    sleep 0.1
done
[ $ok = 1 ] || { cat "$tmp/api.log" "$tmp/worker.log"; fail "the fleet API never listed the agent's CPU"; }
kill -TERM "$WPID"; wait "$WPID" || fail "the worker agent exited $? on SIGTERM"
kill -TERM "$SPID"; wait "$SPID" || fail "the fleet API exited $? on SIGTERM"
SPID=""
echo "ok: compose fleet: '${api_cmd[*]}' and '${worker_cmd[*]}' on PostgreSQL; the API lists the agent's CPU"

# The images' llama.cpp target engine: each run stage must put ac-llama beside autocompress
# (where the product looks for it) and libllama/ggml in the folder the build stage's make
# line names as LLAMA_RPATH (where the helper looks for them). That layout rebuilt under a
# scratch root from this machine's llama.cpp, the helper made by the same make variable:
# the server started from there finds llama.cpp with no AC_LLAMA_HELPER, and the helper
# loads the root's libraries, not the venv's.
for df in docker/Dockerfile docker/Dockerfile.cuda; do
    read -r rpath libdest bindir < <(python3 - "$df" <<'PY'
import re, sys
src = open(sys.argv[1]).read().replace("\\\n", " ")
rpath = re.findall(r"^RUN make .*LLAMA_RPATH=(\S+).*\bllamacpp\b", src, re.M)
libs = re.findall(r"^COPY --from=build /opt/llama.cpp-lib (\S+)$", src, re.M)
bins = [l.split()[2:] for l in re.findall(r"^COPY --from=build .*$", src, re.M) if "/ac-llama" in l]
ok = len(rpath) == len(libs) == len(bins) == 1 and "/src/build/autocompress" in bins[0][:-1]
print(rpath[0], libs[0], bins[0][-1].rstrip("/")) if ok else print("- - -")
PY
)
    [ "$rpath" != - ] || fail "$df: no make line with LLAMA_RPATH and llamacpp, or no COPY of the libraries and of ac-llama beside autocompress"
    [ "$rpath" = "$libdest" ] || fail "$df: ac-llama's rpath $rpath is not where the libraries go ($libdest)"
    echo "ok: $df: ac-llama in $bindir beside autocompress, libllama/ggml in $libdest, its rpath"
done
prefix=$(scripts/llamacpp.sh --prefix)
if [ -z "$prefix" ]; then
    echo "skip: the images' llama.cpp layout: llama.cpp is not installed here (scripts/llamacpp.sh install)"
    exit 0
fi
root=$tmp/root
mkdir -p "$root$bindir" "$root$libdest"
cp -a "$prefix/llama_cpp/lib/." "$root$libdest/"
# (SANITIZE= : under make test-sanitize the sub-make would move BUILD to $tmp/helper-san)
make -s --no-print-directory SANITIZE= BUILD="$tmp/helper" LLAMA_RPATH="$root$libdest" "$tmp/helper/ac-llama" >/dev/null
cp "$AC_BIN" "$tmp/helper/ac-llama" "$root$bindir/"
ldd "$root$bindir/ac-llama" | grep -q "libllama.so.* => $root$libdest/" || { ldd "$root$bindir/ac-llama"; fail "ac-llama does not load libllama from $root$libdest"; }
"$root$bindir/ac-llama" info | jq -e '.package_version | type == "string"' >/dev/null || fail "ac-llama info failed in the image layout"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
mkdir -p "$tmp/data-llama"
env -u AC_LLAMA_HELPER AC_LISTEN=127.0.0.1:$port AC_DATA_DIR=$tmp/data-llama "$root$bindir/autocompress" serve \
    > "$tmp/server.log" 2>&1 &
SPID=$!
for _ in $(seq 100); do
    AC_LISTEN=127.0.0.1:$port "$AC_BIN" healthcheck --ready 2>/dev/null && break
    kill -0 "$SPID" 2>/dev/null || fail "the server in the image layout exited"
    sleep 0.1
done
curl -s "http://127.0.0.1:$port/v1/engines" |
    jq -e '.engines[] | select(.name == "llama.cpp") | .present and (.engine_build | startswith("llama.cpp"))' >/dev/null ||
    fail "the server in the image layout does not find llama.cpp: $(curl -s "http://127.0.0.1:$port/v1/engines")"
kill -TERM "$SPID"; wait "$SPID" || fail "the server in the image layout exited $? on SIGTERM"
SPID=""
echo "ok: the images' layout: the server finds ac-llama beside it, and ac-llama loads libllama from $libdest"
