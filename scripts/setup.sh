#!/usr/bin/env bash
# Create ./.venv (once) and install ladderize with its test extras.
#
# Which torch it installs (said on one line, "torch: ..."):
# - a CUDA torch already importable (in .venv, or in $PYTHON: the venv is then created with
#   --system-site-packages so that it sees it): that one is kept;
# - else, where an NVIDIA GPU is present (nvidia-smi lists one): the registry's default torch
#   build (on Linux PyPI's default wheel is the CUDA build);
# - else the CPU build pinned in constraints-cpu.txt (torch==2.13.0).
# LADDERIZE_TORCH=cpu|cuda forces the CPU pin or the CUDA path.
# Every other package comes at the exact version in locks/main.txt (the set the suite passed on; scripts/lock.sh
# writes it). LADDERIZE_LOCK=0 installs without it: the newest versions pyproject.toml's ranges allow.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
CHOICE="${LADDERIZE_TORCH:-auto}"

cuda_torch() {  # prints the CUDA torch version when $1 imports a torch built for CUDA
  "$1" - <<'EOF' 2>/dev/null
import torch
if torch.version.cuda:
    print(f"{torch.__version__} (CUDA {torch.version.cuda})")
EOF
}

gpu_present() {
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q "^GPU"
}

case "$CHOICE" in
  auto|cpu|cuda) ;;
  *) echo "setup.sh: LADDERIZE_TORCH must be auto, cpu or cuda, got '$CHOICE'" >&2; exit 2 ;;
esac

if [ ! -x .venv/bin/python ]; then
  if [ "$CHOICE" != cpu ] && [ -n "$(cuda_torch "$PYTHON")" ]; then
    "$PYTHON" -m venv --system-site-packages .venv  # see the CUDA torch $PYTHON already has
  else
    "$PYTHON" -m venv .venv
  fi
fi
. .venv/bin/activate
export PIP_DISABLE_PIP_VERSION_CHECK=1
LOCK=(-c locks/main.txt)
[ "${LADDERIZE_LOCK:-1}" = 0 ] && LOCK=()

installed="$(cuda_torch python || true)"
if [ "$CHOICE" = cpu ]; then
  echo "torch: the CPU build pinned in constraints-cpu.txt (LADDERIZE_TORCH=cpu)"
  python -m pip install --quiet -c constraints-cpu.txt "${LOCK[@]}" -e ".[test]"
elif [ -n "$installed" ]; then
  echo "torch: the CUDA build already installed, $installed"
  python -m pip install --quiet "${LOCK[@]}" -e ".[test]"
elif [ "$CHOICE" = cuda ] || gpu_present; then
  echo "torch: an NVIDIA GPU is present; installing the registry's default torch build (CUDA on Linux)"
  python -m pip install --quiet "${LOCK[@]}" -e ".[test]"
  if [ -z "$(cuda_torch python || true)" ]; then
    echo "torch: note: the torch in .venv is a CPU build (installed earlier); for the GPU run" \
      "'. .venv/bin/activate && pip install --force-reinstall torch', or install your CUDA build" >&2
  fi
else
  echo "torch: no NVIDIA GPU found; the CPU build pinned in constraints-cpu.txt"
  python -m pip install --quiet -c constraints-cpu.txt "${LOCK[@]}" -e ".[test]"
fi
