#!/bin/bash
# A throwaway PostgreSQL server for the tests, from Debian's postgresql package: a
# cluster in a temporary directory, listening only on a Unix socket there, trust
# authentication (nothing reaches it from the network). As root it runs as the package's
# `postgres` user, since PostgreSQL refuses to run as root.
#   pg.sh start DIR        initdb (first time) and start; prints the admin URI (DIR: a
#                          fresh folder whose parents the postgres user may enter, as
#                          mktemp -d makes under /tmp)
#   pg.sh stop DIR         fast shutdown (pg.sh kill DIR: immediate, as a crash)
#   pg.sh newdb URI NAME   create database NAME (dropped first if it exists); prints its URI
#   pg.sh uri DIR [DB]     the URI of database DB (default postgres)
set -euo pipefail
bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
[ -n "$bin" ] || { echo "pg.sh: PostgreSQL is not installed (make deps)" >&2; exit 1; }
as_pg() {
    if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}
uri() { printf 'postgresql:///%s?host=%s&port=5432&user=postgres\n' "${2:-postgres}" "$1/sock"; }
cmd=${1:-}; shift || true
case $cmd in
start)
    dir=$1
    mkdir -p "$dir/sock"
    [ "$(id -u)" = 0 ] && chown -R postgres "$dir"
    if [ ! -f "$dir/data/PG_VERSION" ]; then
        as_pg "$bin/initdb" -D "$dir/data" -U postgres --auth=trust -E UTF8 --no-sync >"$dir/initdb.log" 2>&1 ||
            { cat "$dir/initdb.log" >&2; exit 1; }
    fi
    as_pg "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
        -o "-c listen_addresses='' -c unix_socket_directories=$dir/sock -c port=5432 -c fsync=off -c max_connections=300" \
        start >/dev/null || { cat "$dir/server.log" >&2; exit 1; }
    uri "$dir"
    ;;
stop|kill)
    mode=fast; [ "$cmd" = kill ] && mode=immediate
    as_pg "$bin/pg_ctl" -D "$1/data" -m $mode -w stop >/dev/null 2>&1 || true
    ;;
newdb)
    base=$1 name=$2
    PGOPTIONS="-c client_min_messages=warning" psql -q -v ON_ERROR_STOP=1 "$base" \
        -c "DROP DATABASE IF EXISTS \"$name\"" -c "CREATE DATABASE \"$name\"" >/dev/null
    printf '%s\n' "$base" | sed "s|^postgresql:///[^?]*|postgresql:///$name|"
    ;;
uri)
    uri "$1" "${2:-postgres}"
    ;;
*)
    sed -n '2,10p' "$0" >&2; exit 2 ;;
esac
