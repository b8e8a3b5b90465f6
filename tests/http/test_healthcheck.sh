#!/bin/bash
# `autocompress healthcheck` against the real server: 0 while it serves (found through
# AC_LISTEN as serve reads it, or given --url), --ready asks /readyz and fails with the
# server's reason when the artifact directory is gone, 1 naming the URL once the
# server is gone, 2 for a URL that is not http(s) or a bad AC_LISTEN.
set -eu
source "$(dirname "$0")/acserver.sh"
DATA=$tmp/var
start_server "$DATA"
"$AC_BIN" healthcheck --url "http://127.0.0.1:$PORT" || fail "healthcheck failed on a serving server"
"$AC_BIN" healthcheck --url "http://127.0.0.1:$PORT/" --ready || fail "readyz failed on a serving server"
AC_LISTEN="0.0.0.0:$PORT" "$AC_BIN" healthcheck || fail "AC_LISTEN with a wildcard host was not asked on loopback"
AC_LISTEN="127.0.0.1:$PORT" "$AC_BIN" healthcheck --timeout-s 2 || fail "AC_LISTEN not followed"
mv "$DATA/artifacts" "$DATA/artifacts.away"   # what /readyz checks: the artifact directory writable
set +e; out=$("$AC_BIN" healthcheck --url "http://127.0.0.1:$PORT" --ready 2>&1); rc=$?; set -e
mv "$DATA/artifacts.away" "$DATA/artifacts"
[ $rc = 1 ] || fail "readyz without the artifact directory: exit $rc ($out)"
echo "$out" | grep -q "answered 503.*artifact directory not writable" || fail "no reason: $out"
"$AC_BIN" healthcheck --url "http://127.0.0.1:$PORT" || fail "healthz (liveness) should still pass"
stop_server
set +e
out=$("$AC_BIN" healthcheck --url "http://127.0.0.1:$PORT" 2>&1); rc=$?
[ $rc = 1 ] || fail "a stopped server: exit $rc"
echo "$out" | grep -q "http://127.0.0.1:$PORT/healthz" || fail "the message does not name the URL: $out"
out=$("$AC_BIN" healthcheck --url "file:///etc/passwd" 2>&1); rc=$?
[ $rc = 2 ] && echo "$out" | grep -q "not an http" || fail "file:// URL: exit $rc ($out)"
out=$(AC_LISTEN=nonsense "$AC_BIN" healthcheck 2>&1); rc=$?
[ $rc = 2 ] && echo "$out" | grep -q "AC_LISTEN" || fail "bad AC_LISTEN: exit $rc ($out)"
out=$("$AC_BIN" healthcheck --bogus 2>&1); rc=$?
[ $rc = 2 ] || fail "unknown option: exit $rc"
echo "ok: healthcheck"
