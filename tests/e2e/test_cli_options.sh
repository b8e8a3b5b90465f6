#!/bin/bash
# Every subcommand refuses an unknown or misspelled option with exit status 2 and a
# message that names it (alone, and followed by a value), never the usage text alone
# or a misleading "needs a value".
set -u
fail=0
for cmd in calibrate estimate search prune distill eval export inspect generate perplexity run worker serve; do
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
[ $fail = 0 ] && echo "every subcommand names an unknown option"
exit $fail
