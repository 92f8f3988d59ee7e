#!/usr/bin/env bash
# Set up (if needed) and run the offline end-to-end demo on the bundled default model.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec ladderize demo "$@"
