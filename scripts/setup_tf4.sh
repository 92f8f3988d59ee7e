#!/usr/bin/env bash
# Create ./.venv-tf4 (once) for tests/model/test_transformers_versions.py: torch (the CPU pin) and the newest
# transformers 4.x, nothing else (what ladderize writes, read by a transformers-4 user without ladderize);
# and in $VENV/transformers-lowest the lowest transformers ladderize supports (5.4.0, as pyproject pins it)
# with its own dependencies, put first on PYTHONPATH to run ladderize's model there (and, with pytest, its
# generation tests). Versions: locks/tf4.txt and locks/transformers-lowest.txt.
# Idempotent: a venv whose marker matches this recipe is left as it is. About a minute the first time.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
VENV=.venv-tf4
RECIPE="transformers==4.57.6 torch==2.13.0 lowest=transformers==5.4.0 lock=$(cat locks/tf4.txt locks/transformers-lowest.txt | sha256sum | cut -c1-16) recipe=3"
export PIP_DISABLE_PIP_VERSION_CHECK=1
if [ -f "$VENV/.ladderize-ready" ] && [ "$(cat "$VENV/.ladderize-ready")" = "$RECIPE" ]; then
  exit 0
fi
start=$(date +%s)
rm -f "$VENV/.ladderize-ready"
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet -c constraints-cpu.txt -c locks/tf4.txt "torch==2.13.0" "transformers==4.57.6" pytest pytest-timeout
"$VENV/bin/python" -c "import torch, transformers; assert transformers.__version__.startswith('4.')"
rm -rf "$VENV/transformers-lowest"
"$VENV/bin/python" -m pip install --quiet -c locks/transformers-lowest.txt --target "$VENV/transformers-lowest" "transformers==5.4.0"
echo "$RECIPE" > "$VENV/.ladderize-ready"
echo "setup_tf4: $VENV ready in $(( $(date +%s) - start )) s" >&2
