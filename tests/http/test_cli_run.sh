#!/bin/bash
# `autocompress run SPEC.json --out DIR`: the same validation as the API (exit 2 with
# the JSON pointer), the pipeline in-process, artifacts linked into DIR with the digest
# the store recorded, a missing stage reported as "not available in this build" (exit 1).
set -eu
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# the smallest llama2.c checkpoint the model probe takes (dim 8, 1 layer, vocab 32)
python3 -c 'import struct,sys; open(sys.argv[1],"wb").write(struct.pack("<7i",8,16,1,2,2,32,4)+bytes(3744))' "$tmp/tiny.bin"
cat > "$tmp/ok.json" <<JSON
{"model": {"path": "$tmp/tiny.bin"}, "constraints": {"params": 1000},
 "x_test_pipeline": ["test_artifact", "test_sleep"], "x_test_sleep_ms": 100, "x_test_artifact_bytes": 300000}
JSON
out=$(AC_TEST_STAGES=1 "$AC_BIN" run "$tmp/ok.json" --out "$tmp/run1")
echo "$out" | grep -q '"status": "succeeded"' || { echo "not succeeded: $out"; exit 1; }
[ "$(stat -c %s "$tmp/run1/blob.bin")" = 300000 ] || { echo "blob.bin missing or wrong size"; exit 1; }
want=$(sqlite3 "$tmp/run1/autocompress.db" "select sha256 from artifacts where name='blob.bin'")
got=$(sha256sum "$tmp/run1/blob.bin" | cut -d' ' -f1)
[ "$want" = "$got" ] || { echo "digest mismatch: $want vs $got"; exit 1; }

# a stage this build lacks
sed 's/"test_sleep"\]/"no_such_stage"]/' "$tmp/ok.json" > "$tmp/missing.json"
set +e
out=$(AC_TEST_STAGES=1 "$AC_BIN" run "$tmp/missing.json" --out "$tmp/run2")
rc=$?
set -e
[ $rc = 1 ] || { echo "expected exit 1, got $rc"; exit 1; }
echo "$out" | grep -q 'stage no_such_stage is not available in this build' || { echo "$out"; exit 1; }

# invalid spec: exit 2 naming the pointer; test fields need AC_TEST_STAGES=1
set +e
err=$("$AC_BIN" run "$tmp/ok.json" --out "$tmp/run3" 2>&1 >/dev/null)
rc=$?
set -e
[ $rc = 2 ] && echo "$err" | grep -q '/x_test_pipeline' || { echo "rc=$rc: $err"; exit 1; }
echo '{"model": {"path": "/etc/passwd"}, "constraints": {"params": 1}}' > "$tmp/bad.json"
set +e
err=$("$AC_BIN" run "$tmp/bad.json" --out "$tmp/run4" --data-root "$tmp" 2>&1 >/dev/null)
rc=$?
set -e
[ $rc = 2 ] && echo "$err" | grep -q '/model/path: the path .*outside the allowed roots' || { echo "rc=$rc: $err"; exit 1; }
echo ok
