# bench/prune_recovery/steps.sh — sourced by the prune_recovery scripts: step NAME CMD... runs
# CMD once into $OUT/NAME.out and .log (a rerun skips a step that finished) and keeps its wall
# seconds in $OUT/NAME.s; prep, ppl and uniform_arch (below) are the SmolLM2 scripts' shared
# steps (they read BIN, OUT, THREADS, WIKI and PPL_CHUNKS).
step() {
    local name=$1; shift
    [ -s "$OUT/$name.s" ] && return 0
    local t0; t0=$(date +%s.%N)
    "$@" >"$OUT/$name.out" 2>"$OUT/$name.log" || { tail -5 "$OUT/$name.log"; echo "step $name failed" >&2; exit 1; }
    python3 -c "import sys; print('%.1f' % (float(sys.argv[2]) - float(sys.argv[1])))" "$t0" "$(date +%s.%N)" \
        >"$OUT/$name.s"
    echo "$name: $(cat "$OUT/$name.s") s"
}

# prep: the work folder, the build, the machine's ceilings measured now, and two archs from
# bench/results/smollm2-135m-cpu.json: $OUT/a30.json (the job's 30%-cheaper result, hidden 504
# and 27 layers) and $OUT/parent.arch.json (SmolLM2-135M's own).
prep() {
    mkdir -p "$OUT"
    make -s -j2 all >/dev/null
    build/tools/ceilings_probe "$THREADS" >"$OUT/ceilings.txt"
    python3 - "$OUT" <<'PY'
import json, sys
r = json.load(open("bench/results/smollm2-135m-cpu.json"))
json.dump(r["result"]["arch"], open(sys.argv[1] + "/a30.json", "w"), indent=1)
json.dump(r["parent"]["arch"], open(sys.argv[1] + "/parent.arch.json", "w"), indent=1)
PY
}

# ppl NAME MODEL: WikiText-2 perplexity (llama.cpp's chunk method) as step NAME.ppl.
ppl() { step "$1.ppl" "$BIN" perplexity "$2" --text "$WIKI" --chunks "$PPL_CHUNKS" --threads "$THREADS" --json; }

# uniform_arch NAME LAYERS HIDDEN FFN: $OUT/NAME.json, a uniform arch of the parent's heads with
# hidden size HIDDEN and FFN width FFN, on the LAYERS layers whose removal the ranking in
# $OUT/rank scored costliest (the rest, lowest layer-skip loss first, dropped).
uniform_arch() {
    python3 - "$OUT" "$@" <<'PY'
import json, sys
out, name, n, hidden, ffn = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
p = json.load(open(out + "/parent.arch.json"))
skip = [l["skip"]["layer"] for l in json.load(open(out + "/rank/ranking.json"))["layers"]]
keep = sorted(sorted(range(len(skip)), key=lambda i: -skip[i])[:n])
heads = p["layers"][0]["attention"]
p["hidden_size"] = hidden
p["layers"] = [{"source_layer": s, "attention": dict(heads), "mlp": {"ffn_dim": ffn}} for s in keep]
json.dump(p, open("%s/%s.json" % (out, name), "w"), indent=1)
PY
}
