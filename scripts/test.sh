#!/usr/bin/env bash
# Set up (if needed) and run the whole test suite. CI runs exactly this (see .ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/disk_check.sh  # warns first where the disk has less free than the suite needs
bash scripts/setup.sh
# .venv-vllm: vLLM's CPU build with ladderize's plugin, driven by tests/runtime/vllm (idempotent; ~10 min the first time)
bash scripts/setup_vllm.sh
# .venv-tf4: torch and the newest transformers 4.x only, driven by tests/model/test_transformers_versions.py (idempotent; ~1 min once)
bash scripts/setup_tf4.sh
# .venv-gpucheck and .gpu-bundle-rehearse: the GPU check's CPU rehearsal, driven by tests/test_gpu_check_script.py (idempotent; a few minutes once)
bash scripts/setup_gpucheck.sh
. .venv/bin/activate
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# one worker per core (at most 4: several tests start 2-3 ranks or a vLLM engine each), handed one test at a
# time (--maxschedchunk 1), so the long tests that tests/conftest.py puts first spread over the workers
# (xdist's default hands each worker a quarter of its share at once: one worker got every long test);
# a test that hangs fails after LADDERIZE_TEST_TIMEOUT seconds (default 1800) instead of holding the run
workers="${LADDERIZE_TEST_WORKERS:-$(python -c 'import os; print(max(1, min(4, len(os.sched_getaffinity(0)))))')}"
exec python -m pytest -q -ra --durations=15 -n "$workers" --maxschedchunk 1 --timeout "${LADDERIZE_TEST_TIMEOUT:-1800}" "$@"
