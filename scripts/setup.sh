#!/usr/bin/env bash
# Create ./.venv (once) and install ladderize with its test extras, pinning the CPU torch build.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
. .venv/bin/activate
export PIP_DISABLE_PIP_VERSION_CHECK=1
python -m pip install --quiet -c constraints-cpu.txt -e ".[test]"
