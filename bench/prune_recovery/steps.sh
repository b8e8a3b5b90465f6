# bench/prune_recovery/steps.sh — sourced by the prune_recovery scripts: step NAME CMD... runs
# CMD once into $OUT/NAME.out and .log (a rerun skips a step that finished) and keeps its wall
# seconds in $OUT/NAME.s.
step() {
    local name=$1; shift
    [ -s "$OUT/$name.s" ] && return 0
    local t0; t0=$(date +%s.%N)
    "$@" >"$OUT/$name.out" 2>"$OUT/$name.log" || { tail -5 "$OUT/$name.log"; echo "step $name failed" >&2; exit 1; }
    python3 -c "import sys; print('%.1f' % (float(sys.argv[2]) - float(sys.argv[1])))" "$t0" "$(date +%s.%N)" \
        >"$OUT/$name.s"
    echo "$name: $(cat "$OUT/$name.s") s"
}
