# Source me: sets AC_PYTHON to a virtual environment on top of Debian's python3 (which
# carries python3-torch) with the PyPI packages the oracles and benchmarks use, creating
# it on first use under $AC_CACHE. Nothing here is part of the product.
source "$(dirname "${BASH_SOURCE[0]}")/venv.sh" || return 1
_venv=$AC_VENV
# Debian's torch 1.13 is built against NumPy 1: a NumPy 2 in the venv (what pip picks for
# gguf when the venv is made before python3-numpy is installed) imports, but every tensor
# to or from NumPy then fails ("Numpy is not available"). So the check converts one, and
# NumPy stays below 2 (the system's 1.24 where it is installed).
if ! "$_venv/bin/python" -c "import tokenizers, safetensors, gguf, numpy, torch, jsonschema, moto.server
torch.from_numpy(numpy.zeros(1)).numpy()" 2>/dev/null; then
    "$_venv/bin/pip" install -q "numpy<2" tokenizers safetensors gguf jsonschema "moto[server]" >&2 || return 1
fi
AC_PYTHON=$_venv/bin/python
# transformers 4.40.2, the reference for the HF families (Llama, Mixtral, Qwen2-MoE), needs
# tokenizers 0.19, older than the one above: a second environment on the same system torch.
_tfvenv=$AC_CACHE/tfvenv
if [ ! -x "$_tfvenv/bin/python" ]; then
    /usr/bin/python3 -m venv --system-site-packages "$_tfvenv" || return 1
fi
if ! "$_tfvenv/bin/python" -c "import transformers, numpy, torch
assert transformers.__version__ == '4.40.2'
torch.from_numpy(numpy.zeros(1)).numpy()" 2>/dev/null; then
    "$_tfvenv/bin/pip" install -q "numpy<2" transformers==4.40.2 >&2 || return 1
fi
AC_TF_PYTHON=$_tfvenv/bin/python
export AC_PYTHON AC_TF_PYTHON AC_CACHE
# The slow test tier and the benchmarks compare against llama.cpp, built from source by
# PyPI's llama-cpp-python at the version ac-llama links (scripts/llamacpp.sh: several
# minutes on 2 cores, once).
if [ "${AC_SLOW:-0}" = 1 ]; then
    "$(dirname "${BASH_SOURCE[0]}")/llamacpp.sh" install >&2 || return 1
fi
