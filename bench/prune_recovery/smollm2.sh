# bench/prune_recovery/smollm2.sh — sourced by run.sh, lr.sh and hidden.sh from the project's root:
# the binary, the shared data, SmolLM2-135M (fetched on first use) and the C4 calibration
# text, each unless the environment names its own.
BIN=${AC_BIN:-$PWD/build/autocompress}
export AC_SHARED=${AC_SHARED:-$(cd .. && pwd)/shared}
MODEL=${MODEL:-$(scripts/fetch-models.sh)}
CALIB=${CALIB:-$AC_SHARED/data/text/c4/c4_sample.jsonl}
