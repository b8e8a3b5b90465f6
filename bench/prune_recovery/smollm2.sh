# bench/prune_recovery/smollm2.sh — sourced by run.sh, lr.sh and hidden.sh from the project's
# root: the binary, the shared data, SmolLM2-135M (fetched on first use), the C4 calibration
# text, the WikiText-2 test text, and the scoring knobs they share (TASKS, EVAL_LIMIT,
# PPL_CHUNKS, THREADS), each unless the environment names its own.
BIN=${AC_BIN:-$PWD/build/autocompress}
export AC_SHARED=${AC_SHARED:-$(cd .. && pwd)/shared}
MODEL=${MODEL:-$(scripts/fetch-models.sh)}
CALIB=${CALIB:-$AC_SHARED/data/text/c4/c4_sample.jsonl}
WIKI=$AC_SHARED/data/text/wikitext-2-raw/wiki.test.raw
TASKS=${TASKS:-eight}
EVAL_LIMIT=${EVAL_LIMIT:-200}
PPL_CHUNKS=${PPL_CHUNKS:-16}
THREADS=${THREADS:-0}
