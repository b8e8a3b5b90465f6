#!/bin/bash
# `make run` with DEMO_ONLY=1, in a scratch directory on a free port: the demo submits a
# real stories260K job with curl, follows its events, and verifies the downloaded
# checkpoint's sha-256 against the artifact record, the ETag and the export manifest;
# run.sh then stops the server and exits with the demo's status.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
BIN=$(realpath "${AC_BIN:-$here/../../build/autocompress}")
export AC_SHARED=$(realpath "${AC_SHARED:-$here/../../../shared}")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cd "$tmp"
if ! DEMO_ONLY=1 AC_LISTEN=127.0.0.1:$port "$here/../../scripts/run.sh" "$BIN" >demo.log 2>&1; then
    cat demo.log; tail -20 var/server.log; echo "FAIL: the demo failed"; exit 1
fi
grep -q '^checkpoint verified$' demo.log || { cat demo.log; echo "FAIL: no verification line"; exit 1; }
grep -q 'job.succeeded' demo.log || { cat demo.log; echo "FAIL: the events did not show the job succeed"; exit 1; }
grep -q 'distill.progress' demo.log || { cat demo.log; echo "FAIL: no distillation progress events followed"; exit 1; }
! kill -0 "$(pgrep -f "serve --listen 127.0.0.1:$port" || echo 999999)" 2>/dev/null || { echo "FAIL: server still running"; exit 1; }
echo ok
