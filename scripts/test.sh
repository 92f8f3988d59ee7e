#!/usr/bin/env bash
# Set up (if needed) and run the whole test suite. CI runs exactly this (see .ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
# disk: a fresh clone's run peaked at 12.3 GiB over its start (the four venvs about 8.5 GiB, the rest test files);
# with less free, tests fail partway with "No space left on device", so say so first
need_mib=4096
for venv in .venv:1900 .venv-vllm:3400 .venv-tf4:1400 .venv-gpucheck:1800; do
  [ -d "${venv%%:*}" ] || need_mib=$((need_mib + ${venv##*:}))
done
for dir in . "${TMPDIR:-/tmp}"; do
  free_mib=$(($(df -Pk "$dir" | awk 'NR==2 {print $4}') / 1024))
  if [ "$free_mib" -lt "$need_mib" ]; then
    echo "test.sh: warning: $free_mib MiB free on $(cd "$dir" && pwd); the suite needs about $need_mib MiB here (venvs still to build, and its test files)" >&2
  fi
done
bash scripts/setup.sh
# .venv-vllm: vLLM's CPU build with ladderize's plugin, driven by tests/runtime/vllm (idempotent; ~10 min the first time)
bash scripts/setup_vllm.sh
# .venv-tf4: torch and the newest transformers 4.x only, driven by tests/model/test_transformers_versions.py (idempotent; ~1 min once)
bash scripts/setup_tf4.sh
. .venv/bin/activate
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# one worker per core (at most 4: several tests start 2-3 ranks or a vLLM engine each), handed one test at a
# time (--maxschedchunk 1), so the long tests that tests/conftest.py puts first spread over the workers
# (xdist's default hands each worker a quarter of its share at once: one worker got every long test);
# a test that hangs fails after LADDERIZE_TEST_TIMEOUT seconds (default 1800) instead of holding the run
workers="${LADDERIZE_TEST_WORKERS:-$(python -c 'import os; print(max(1, min(4, len(os.sched_getaffinity(0)))))')}"
exec python -m pytest -q -ra --durations=15 -n "$workers" --maxschedchunk 1 --timeout "${LADDERIZE_TEST_TIMEOUT:-1800}" "$@"
