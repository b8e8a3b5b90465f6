# Source me: the project's virtual environment, $AC_CACHE/venv on top of Debian's python3
# (with its system packages: python3-torch for the oracles), created on first use. What
# goes into it is for the script that sources this to install (scripts/pyenv.sh: the
# oracles' packages; scripts/llamacpp.sh: llama.cpp alone, as the images build it).
AC_CACHE=${AC_CACHE:-$HOME/.cache/autocompress}
AC_VENV=$AC_CACHE/venv
if [ ! -x "$AC_VENV/bin/python" ]; then
    mkdir -p "$AC_CACHE" && /usr/bin/python3 -m venv --system-site-packages "$AC_VENV" || return 1
fi
