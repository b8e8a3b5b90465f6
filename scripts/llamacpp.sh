#!/bin/bash
# llama.cpp for the llama.cpp target engine and the benchmarks' peer: PyPI llama-cpp-python
# at one pinned version, built from source into the project venv (scripts/pyenv.sh).
#   scripts/llamacpp.sh install       install it (a no-op when that version is there)
#   scripts/llamacpp.sh --prefix      the site-packages folder holding include/llama.h and
#                                     llama_cpp/lib (nothing when not installed)
#   scripts/llamacpp.sh --version     the installed package version
#   scripts/llamacpp.sh --build-flags the CMAKE_ARGS it was built with
# AC_LLAMACPP_CMAKE_ARGS, when set, are the CMAKE_ARGS instead of this CPU's own features:
# an image built on one machine and run on others needs a portable build (docker/).
set -eu
VERSION=0.3.36
AC_CACHE=${AC_CACHE:-$HOME/.cache/autocompress}
venv=$AC_CACHE/venv
flags_file=$AC_CACHE/llamacpp-build-flags
prefix() {
    local py=$venv/bin/python
    [ -x "$py" ] || return 0
    "$py" - <<'PY' 2>/dev/null || true
import os, sysconfig
p = sysconfig.get_paths()["purelib"]
if os.path.exists(os.path.join(p, "include", "llama.h")) and os.path.isdir(os.path.join(p, "llama_cpp", "lib")):
    print(p)
PY
}
installed_version() {
    [ -x "$venv/bin/python" ] || return 0
    "$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("llama-cpp-python"))' 2>/dev/null || true
}
# -march=native, except on CPUs with AMX: there ggml 0.25's AMX matmuls (Q4_0, Q8_0 and
# K-quant weights) die at their first tile load (SIGSEGV / SIGILL in
# ggml::cpu::amx::tensor_traits::compute_forward, seen on a Sapphire Rapids-class guest;
# upstream llama.cpp issue 20824 reports the same crash), so the build names the CPU's
# other features one by one and leaves AMX out.
build_flags() {
    if [ -n "${AC_LLAMACPP_CMAKE_ARGS:-}" ]; then echo "$AC_LLAMACPP_CMAKE_ARGS"; return; fi
    local f; f=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)
    if ! grep -qw amx_int8 <<<"$f"; then echo "-DGGML_NATIVE=ON"; return; fi
    local out="-DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF" pair
    for pair in avx:AVX avx2:AVX2 fma:FMA f16c:F16C bmi2:BMI2 avx_vnni:AVX_VNNI avx512f:AVX512 \
                avx512vbmi:AVX512_VBMI avx512_vnni:AVX512_VNNI avx512_bf16:AVX512_BF16; do
        grep -qw "${pair%%:*}" <<<"$f" && out="$out -DGGML_${pair#*:}=ON"
    done
    echo "$out"
}
case "${1:-}" in
--prefix) prefix ;;
--version) installed_version ;;
--build-flags) if [ -s "$flags_file" ]; then cat "$flags_file"; else echo unknown; fi ;;
install)
    source "$(dirname "$0")/venv.sh"
    if [ "$(installed_version)" = "$VERSION" ] && [ -n "$(prefix)" ] && [ "$(cat "$flags_file" 2>/dev/null)" = "$(build_flags)" ]; then
        [ -s "$flags_file" ] || echo "unknown (installed before this script recorded flags)" >"$flags_file"
        exit 0
    fi
    flags=$(build_flags)
    echo "building llama.cpp (llama-cpp-python $VERSION from source, several minutes on 2 cores)" >&2
    CMAKE_ARGS="$flags" "$venv/bin/pip" install -q --force-reinstall --no-deps --no-cache-dir "llama-cpp-python==$VERSION" >&2
    "$venv/bin/pip" install -q "llama-cpp-python==$VERSION" "numpy<2" >&2   # torch 1.13: NumPy 1 (scripts/pyenv.sh)
    echo "$flags" >"$flags_file"
    ;;
*) echo "usage: scripts/llamacpp.sh install | --prefix | --version | --build-flags" >&2; exit 2 ;;
esac
