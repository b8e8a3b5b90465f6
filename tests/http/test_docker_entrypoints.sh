#!/bin/bash
# The images' commands run as plain processes (no container engine here): for each of
# docker/Dockerfile and docker/Dockerfile.cuda, its ENTRYPOINT + CMD with its ENV (the
# listen address moved to a free loopback port, the data directory to a scratch one)
# serves, its HEALTHCHECK command then exits 0, and SIGTERM stops the server cleanly.
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
