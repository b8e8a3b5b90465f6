#!/bin/bash
# GET /v1/engines against the real server: both engines with what each takes (the built-in
# one always present; llama.cpp present with its build, or absent with the reason, as this
# machine has it, then made absent on purpose with AC_LLAMA_HELPER=/nonexistent), and a
# target naming an unknown or absent engine refused with a 422 at /target/engine, for jobs,
# calibrations and estimates, before anything is queued; and a helper installed while the
# server runs: its llama.cpp jobs are taken by the server's runner, not left queued.
set -eu
source "$(dirname "$0")/acserver.sh"
export AC_TEST_STAGES=1
DATA=$tmp/var
engines_ok() {
    req GET /v1/engines
    expect 200 '(.engines | length) == 2 and (.engines | map(.name)) == ["autocompress", "llama.cpp"]'
    expect 200 '.engines[0] | .present == true and .precisions == ["fp32", "bf16", "fp16"]
                and .default_precision == "fp32" and .devices == "see /v1/devices"'
    expect 200 '.engines[1] | .precisions == ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_k_m", "q5_k_m", "q6_k"]
                and .kv_cache_types == ["f16", "f32", "bf16", "q8_0", "q4_0"] and .default_precision == "f16"
                and .flash_attention == ["off", "on"]
                and (.present | type) == "boolean"'
    expect 200 '.engines[1] | if .present then (.version | type) == "string" and (.engine_build | startswith("llama.cpp"))
                and .reason == null else (.reason | type) == "string" and .engine_build == null end'
}

# ---- whatever this machine has ------------------------------------------------------------
start_server "$DATA"
engines_ok
echo "llama.cpp here: $(echo "$BODY" | jq -c '.engines[1] | {present, version, reason}')"
req POST /v1/jobs '{"model": {"path": "models/none.bin"}, "constraints": {"latency_ms": 50},
                    "target": {"engine": "nonsense"}}'
expect 422 '.code == "unprocessable_spec" and any(.errors[]; .pointer == "/target/engine"
            and (.message | contains("unknown engine")))'
req POST /v1/jobs '{"model": {"path": "models/none.bin"}, "constraints": {"latency_ms": 50},
                    "target": {"precision": "q8_0"}}'
expect 422 'any(.errors[]; .pointer == "/target/precision")'
req GET /v1/jobs
expect 200 '.data == []'
stop_server

# ---- llama.cpp absent on purpose ----------------------------------------------------------
AC_LLAMA_HELPER=/nonexistent start_server "$DATA"
engines_ok
expect 200 '.engines[1].present == false and (.engines[1].reason | contains("not installed"))'
absent='any(.errors[]; .pointer == "/target/engine" and (.message | contains("not installed")))'
req POST /v1/jobs '{"model": {"path": "models/none.bin"}, "constraints": {"latency_ms": 50},
                    "target": {"engine": "llama.cpp", "precision": "q4_k_m"}, "x_test_pipeline": ["test_sleep"]}'
expect 422 "$absent"
req POST /v1/calibrations '{"model": {"path": "models/none.bin"}, "target": {"engine": "llama.cpp"}}'
expect 422 "$absent"
req POST /v1/estimates '{"model": {"path": "models/none.bin"}, "target": {"engine": "llama.cpp", "threads": 2}}'
expect 422 "$absent"
req GET /v1/jobs
expect 200 '.data == []'
req GET /v1/calibrations
expect 200 '.data == []'
stop_server

# ---- llama.cpp installed while the server runs --------------------------------------------
# the API accepts llama.cpp jobs once the helper answers; the server's own runner must take
# them too (it had started without llama.cpp), not leave them queued for good
HELPER=$(dirname "$AC_BIN")/ac-llama
if [ -x "$HELPER" ]; then
    AC_LLAMA_HELPER=$tmp/late/ac-llama start_server "$DATA"
    mkdir -p "$tmp/late"
    ln -s "$HELPER" "$tmp/late/ac-llama"
    req POST /v1/jobs '{"model": {"path": "models/none.bin"}, "constraints": {"latency_ms": 50},
                        "target": {"engine": "llama.cpp"}, "x_test_pipeline": ["test_sleep"], "x_test_sleep_ms": 50}'
    [ "$CODE" = 422 ] && echo "$BODY" | jq -e 'any(.errors[]; .pointer == "/model/path")' >/dev/null ||
        fail "expected only the model path refused: $CODE $BODY"
    cp "${AC_SHARED:-../shared}/data/models/stories260K/stories260K.bin" "$DATA/models/s.bin"
    cp "${AC_SHARED:-../shared}/data/models/stories260K/tok512.bin" "$DATA/models/"
    req POST /v1/jobs '{"model": {"path": "models/s.bin"}, "constraints": {"latency_ms": 50},
                        "target": {"engine": "llama.cpp"}, "x_test_pipeline": ["test_sleep"], "x_test_sleep_ms": 50}'
    expect 201 '.status == "queued"'
    jid=$(echo "$BODY" | jq -r .id)
    for _ in $(seq 300); do
        req GET "/v1/jobs/$jid"
        [ "$(echo "$BODY" | jq -r .status)" = succeeded ] && break
        sleep 0.1
    done
    expect 200 '.status == "succeeded"'
    stop_server
    echo "llama.cpp installed after the start: its job ran"
fi
echo "ok"
