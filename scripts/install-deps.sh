#!/bin/sh
# Install the Debian packages AutoCompress builds and tests with, if any is missing.
# As root it runs apt-get; otherwise it prints the command to run.
set -e
PKGS="build-essential pkg-config libmicrohttpd-dev libjansson-dev libsqlite3-dev libpq-dev libcurl4-openssl-dev
libopenblas-dev libdnnl-dev libcmocka-dev libpcre2-dev libssl-dev python3 python3-venv python3-numpy python3-torch
curl wrk valgrind sqlite3 postgresql"
missing=""
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
if [ "$(id -u)" = 0 ]; then
    echo "installing:$missing"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null
else
    echo "missing packages:$missing"
    echo "run: sudo apt-get install -y$missing"
    exit 1
fi
