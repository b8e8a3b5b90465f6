#!/bin/bash
# Every subcommand refuses an unknown or misspelled option with exit status 2 and a
# message that names it (alone, and followed by a value), never the usage text alone
# or a misleading "needs a value"; and values out of their bounds before any work.
set -u
fail=0
for cmd in calibrate estimate measure search prune distill eval export inspect generate perplexity run worker serve; do
    for args in "--no-such-opt" "--no-such-opt 5" "--modle x"; do
        # shellcheck disable=SC2086
        out=$(timeout 20 "$AC_BIN" $cmd $args 2>&1 </dev/null)
        rc=$?
        opt=${args%% *}
        if [ $rc -ne 2 ]; then
            echo "FAIL: $cmd $args: exit $rc (want 2): $out"; fail=1
        elif ! printf '%s' "$out" | grep -Eq "(unknown|unrecognized) option.*$opt"; then
            echo "FAIL: $cmd $args: the message does not name $opt as unknown: $out"; fail=1
        fi
    done
done
# the target options' values: a combination the engine does not take names the option
for args in "--engine llama.cpp --flash-attention auto" "--engine llama.cpp --kv-cache-type q8_0 --flash-attention off" \
            "--flash-attention on"; do
    # shellcheck disable=SC2086
    out=$(timeout 20 "$AC_BIN" estimate --model none.bin $args 2>&1 </dev/null)
    rc=$?
    if [ $rc -ne 2 ] || ! printf '%s' "$out" | grep -q -- "--flash-attention"; then
        echo "FAIL: estimate $args: exit $rc (want 2, naming --flash-attention): $out"; fail=1
    fi
done
# llama.cpp holds at most 256 sequences: a larger batch is named before any work
out=$(timeout 20 "$AC_BIN" estimate --model none.bin --engine llama.cpp --batch 257 2>&1 </dev/null)
rc=$?
if [ $rc -ne 2 ] || ! printf '%s' "$out" | grep -q -- "--batch: llama.cpp serves at most 256"; then
    echo "FAIL: estimate --engine llama.cpp --batch 257: exit $rc (want 2, naming --batch): $out"; fail=1
fi
# counts are whole numbers within their bounds, checked before any work: a count written as a
# real or past its bound is refused (it was converted from a double, 1e20 to a negative count)
for args in "--search-tokens 1e20" "--search-tokens 0.5" "--search-tokens 0" "--rank-tokens 1e19" "--seed 1.5"; do
    # shellcheck disable=SC2086
    out=$(timeout 20 "$AC_BIN" search none.bin --latency-ms 5 --calib none.txt $args 2>&1 </dev/null)
    rc=$?
    opt=${args%% *}
    if [ $rc -ne 2 ] || ! printf '%s' "$out" | grep -q -- "$opt"; then
        echo "FAIL: search $args: exit $rc (want 2, naming $opt): $out"; fail=1
    fi
done
# an --out that cannot be written is said before the search, not after it
out=$(timeout 20 "$AC_BIN" search none.bin --latency-ms 5 --calib none.txt --out /nonexistent/dir/a.json 2>&1 </dev/null)
rc=$?
if [ $rc -ne 2 ] || ! printf '%s' "$out" | grep -q "folder does not exist"; then
    echo "FAIL: search --out /nonexistent/dir/a.json: exit $rc (want 2): $out"; fail=1
fi
# a ranking forwards sequences of at least 8 tokens
out=$(timeout 20 "$AC_BIN" prune none.bin --arch none.json --out /tmp/none --calib none.txt --seq 4 2>&1 </dev/null)
rc=$?
if [ $rc -ne 2 ] || ! printf '%s' "$out" | grep -q -- "--seq"; then
    echo "FAIL: prune --seq 4: exit $rc (want 2, naming --seq): $out"; fail=1
fi
# export never writes over its input, nor the archive into the folder it packs
M=${AC_SHARED:-../shared}/data/models/stories260K/stories260K.bin
T=$(mktemp -d)
for args in "--format gguf --out $M" "--out $T/exp --tar $T/exp/a.tar"; do
    # shellcheck disable=SC2086
    out=$(timeout 20 "$AC_BIN" export "$M" $args 2>&1 </dev/null)
    rc=$?
    opt=$(printf '%s' "$args" | grep -o -- '--\(out\|tar\) [^ ]*$' | cut -d' ' -f1)
    if [ $rc -ne 2 ] || ! printf '%s' "$out" | grep -q -- "$opt"; then
        echo "FAIL: export $args: exit $rc (want 2, naming $opt): $out"; fail=1
    fi
done
[ ! -e "$T/exp" ] || { echo "FAIL: a refused export wrote $T/exp"; fail=1; }
rm -rf "$T"
# measure: one model, the built-in engine, whole counts; then a real serving whose peak is
# the process's own (its program and libraries count, not only the model's buffers)
for args in "" "--model $M --arch a.json" "--model $M --engine llama.cpp" "--model $M --reps 0" \
            "--model $M --threads 1.5"; do
    # shellcheck disable=SC2086
    out=$(timeout 20 "$AC_BIN" measure $args 2>&1 </dev/null)
    rc=$?
    if [ $rc -ne 2 ]; then
        echo "FAIL: measure $args: exit $rc (want 2): $out"; fail=1
    fi
done
out=$(timeout 60 "$AC_BIN" measure --model "$M" --prompt 16 --output 4 --reps 2 --json 2>&1 </dev/null)
rc=$?
if [ $rc -ne 0 ] || ! printf '%s' "$out" | python3 -c '
import json, sys
m = json.load(sys.stdin)
assert m["weights"] == "loaded" and m["reps"] == 2 and m["latency_ms"] > 0, m
assert m["peak_memory_bytes"] == m["process_peak_bytes"] > m["backend_peak_bytes"] + 4 * 2**20, m
assert m["backend_peak_bytes"] >= m["weights_bytes"] > 0, m
'; then
    echo "FAIL: measure --model $M: exit $rc: $out"; fail=1
fi
out=$(timeout 20 "$AC_BIN" measure --model /nonexistent/model.bin 2>&1 </dev/null)
rc=$?
if [ $rc -ne 1 ] || ! printf '%s' "$out" | grep -q "/nonexistent/model.bin"; then
    echo "FAIL: measure --model /nonexistent/model.bin: exit $rc (want 1, naming the path): $out"; fail=1
fi
# --arch takes a shape (an arch or an HF config .json) or a model: a refusal names both
# and says what a .json was read as
echo '{"hidden_size": 8}' >"${TMPDIR:-/tmp}/ac-cli-arch-$$.json"
for bad in /etc/hostname "${TMPDIR:-/tmp}/ac-cli-arch-$$.json"; do
    out=$(timeout 20 "$AC_BIN" measure --arch "$bad" 2>&1 </dev/null)
    rc=$?
    if [ $rc -ne 1 ] || ! printf '%s' "$out" | grep -qE "or a shape alone: an arch .json|read as an HF config \(no \"layers\""; then
        echo "FAIL: measure --arch $bad: exit $rc (want 1, naming what --arch takes): $out"; fail=1
    fi
done
rm -f "${TMPDIR:-/tmp}/ac-cli-arch-$$.json"
[ $fail = 0 ] && echo "every subcommand names an unknown option"
exit $fail
