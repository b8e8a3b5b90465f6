# Source me: sets AC_PYTHON to a virtual environment on top of Debian's python3 (which
# carries python3-torch) with the PyPI packages the oracles and benchmarks use, creating
# it on first use under $AC_CACHE. Nothing here is part of the product.
AC_CACHE=${AC_CACHE:-$HOME/.cache/autocompress}
_venv=$AC_CACHE/venv
if [ ! -x "$_venv/bin/python" ]; then
    mkdir -p "$AC_CACHE"
    /usr/bin/python3 -m venv --system-site-packages "$_venv" || return 1
fi
if ! "$_venv/bin/python" -c "import tokenizers, safetensors, gguf, numpy, torch, jsonschema" 2>/dev/null; then
    "$_venv/bin/pip" install -q tokenizers safetensors gguf jsonschema >&2 || return 1
fi
AC_PYTHON=$_venv/bin/python
export AC_PYTHON AC_CACHE
# The slow test tier and the benchmarks compare against llama.cpp, built from source by
# PyPI's llama-cpp-python at the version ac-llama links (scripts/llamacpp.sh: several
# minutes on 2 cores, once).
if [ "${AC_SLOW:-0}" = 1 ]; then
    "$(dirname "${BASH_SOURCE[0]}")/llamacpp.sh" install >&2 || return 1
fi
