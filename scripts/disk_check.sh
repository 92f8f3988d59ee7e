#!/usr/bin/env bash
# Warn (never fail) when the disk has less free than the test suite needs: a fresh clone's run peaked at 12.3 GiB
# over what was used at its start (the four venvs about 8.5 GiB, the rest test files); with less free, tests fail
# partway with "No space left on device", and this line says why first. scripts/test.sh runs it.
set -euo pipefail
cd "$(dirname "$0")/.."
need_mib=4096  # the suite's test files at their peak
for venv in .venv:1900 .venv-vllm:3400 .venv-tf4:1400 .venv-gpucheck:1800; do  # each venv not built yet, in MiB
  [ -d "${venv%%:*}" ] || need_mib=$((need_mib + ${venv##*:}))
done
for dir in . "${TMPDIR:-/tmp}"; do
  free_mib=$(($(df -Pk "$dir" | awk 'NR==2 {print $4}') / 1024))
  if [ "$free_mib" -lt "$need_mib" ]; then
    echo "disk_check: warning: $free_mib MiB free on $(cd "$dir" && pwd); the suite needs about $need_mib MiB here (venvs still to build, and its test files)" >&2
  fi
done
