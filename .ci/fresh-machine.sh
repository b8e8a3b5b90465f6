#!/bin/bash
# Runs a command as if on a fresh machine: until the project's install step has run
# `apt-get install`, dpkg-query reports every package missing and pkg-config knows no
# package. apt-get itself is the real one (it only reinstalls what is present), so the
# command sees exactly the order of events of a first `make run` / `make test` on a new
# machine. Usage: .ci/fresh-machine.sh make test
set -euo pipefail
fake=$(mktemp -d)
trap 'rm -rf "$fake"' EXIT
installed=$fake/installed
real_apt=$(command -v apt-get) real_dpkg=$(command -v dpkg-query) real_pc=$(command -v pkg-config || echo /usr/bin/pkg-config)
cat >"$fake/dpkg-query" <<SH
#!/bin/sh
[ -e "$installed" ] && exec "$real_dpkg" "\$@"
exit 1
SH
cat >"$fake/pkg-config" <<SH
#!/bin/sh
[ -e "$installed" ] && exec "$real_pc" "\$@"
exit 1
SH
cat >"$fake/apt-get" <<SH
#!/bin/sh
"$real_apt" "\$@" || exit \$?
for a in "\$@"; do [ "\$a" = install ] && touch "$installed"; done
exit 0
SH
chmod +x "$fake"/*
PATH=$fake:$PATH "$@"
