#!/usr/bin/env bash
# Set up (if needed) and run the whole test suite. CI runs exactly this (see .ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# .venv-vllm: vLLM's CPU build with ladderize's plugin, driven by tests/runtime/vllm (idempotent; ~10 min the first time)
bash scripts/setup_vllm.sh
. .venv/bin/activate
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec python -m pytest -q -ra --durations=15 "$@"
