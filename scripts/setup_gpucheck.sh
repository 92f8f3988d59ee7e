#!/usr/bin/env bash
# Create, once, what the GPU check's CPU rehearsal runs on (scripts/gpu_check.sh --rehearse, driven by
# tests/test_gpu_check_script.py): the bundle BUNDLE (default ./.gpu-bundle-rehearse: the wheels the GPU image lacks,
# the evaluation data and the default model's GGUF, for this interpreter; scripts/gpu_bundle.sh --rehearse) and the
# venv ./.venv-gpucheck (torch 2.13.0+cpu and the GPU image's packages, scripts/gpu/image.txt), both with the registry.
# Idempotent: a bundle with a manifest and a venv whose marker matches this recipe are left as they are. A few minutes
# the first time.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
BUNDLE="${1:-.gpu-bundle-rehearse}"
VENV=.venv-gpucheck
RECIPE="torch==2.13.0 $(sha256sum scripts/gpu/image.txt | cut -c1-16) recipe=1"
export PIP_DISABLE_PIP_VERSION_CHECK=1
ls "$BUNDLE"/part1/manifest.json >/dev/null 2>&1 || bash scripts/gpu_bundle.sh --rehearse "$BUNDLE"
if [ ! -f "$VENV/.ladderize-ready" ] || [ "$(cat "$VENV/.ladderize-ready")" != "$RECIPE" ]; then
  start=$(date +%s)
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet -c constraints-cpu.txt "torch==2.13.0" -r scripts/gpu/image.txt
  echo "$RECIPE" > "$VENV/.ladderize-ready"
  echo "setup_gpucheck: $VENV ready in $(( $(date +%s) - start )) s" >&2
fi
