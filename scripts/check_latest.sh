#!/usr/bin/env bash
# Try ladderize on the newest releases of its main dependencies, for whoever widens a bound in pyproject.toml.
#
# Builds ./.venv-latest (rebuilt each run) with the newest torch, transformers, peft, accelerate and lm-eval
# that the registry offers within their current major versions (transformers <6, torch <3, peft <1,
# accelerate <2, lm-eval <0.5), pyproject's upper bounds and locks/ ignored; ladderize's other dependencies
# at their newest too. Then runs the compatibility tests there (the model against transformers' Llama, cached
# against uncached generate in every layout, peft, saving and loading, lm-eval, Accelerate's training) and
# prints a table: each package's locked version, the version tried, and each test file's result. It writes
# the same as JSON to .venv-latest/check_latest.json. Exit status: 0 when every test passed.
#
# LADDERIZE_LATEST_TORCH=locked keeps torch at the CPU pin (constraints-cpu.txt): on Linux, PyPI's newest torch
# is a CUDA build of several GB. On a machine whose pip caps torch (/etc/xdg/pip), the newest it allows is taken.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
VENV=.venv-latest
export PIP_DISABLE_PIP_VERSION_CHECK=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
TESTS=(tests/model/test_generation.py tests/model/test_llama_contract.py tests/model/test_parity.py
       tests/model/test_peft.py tests/model/test_save_load.py tests/model/test_dtypes_and_training.py
       tests/eval/test_eval.py tests/eval/test_lean_lm.py tests/adapt/test_multiprocess.py tests/adapt/test_peft_adapter.py)

rm -rf "$VENV"
"$PYTHON" -m venv "$VENV" || exit 2
if [ "${LADDERIZE_LATEST_TORCH:-newest}" = locked ]; then
  TORCH=(-c constraints-cpu.txt "torch==2.13.0")
else
  TORCH=("torch<3")
fi
echo "check_latest: installing the newest releases into $VENV" >&2
"$VENV/bin/python" -m pip install --quiet --upgrade "${TORCH[@]}" "transformers>=5.4,<6" "peft<1" "accelerate<2" \
  "lm-eval<0.5" || exit 2
# ladderize without its pins, then its other dependencies (pyproject's names, bounds dropped) at their newest
"$VENV/bin/python" -m pip install --quiet --no-deps -e . || exit 2
OTHERS=$("$VENV/bin/python" - <<'PY'
import re, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
main = {"torch", "transformers", "peft", "accelerate", "lm-eval"}
for text in project["dependencies"] + project["optional-dependencies"]["test"]:
    name = re.match(r"[A-Za-z0-9_.\-]+", text).group(0)
    if name not in main:
        print(name if "==" not in text else text)
PY
)
# shellcheck disable=SC2086
"$VENV/bin/python" -m pip install --quiet --upgrade ${OTHERS} "${TORCH[@]}" || exit 2

mkdir -p "$VENV/results"
for file in "${TESTS[@]}"; do
  echo "check_latest: $file" >&2
  "$VENV/bin/python" -m pytest -q -p no:cacheprovider -n 2 --timeout 900 --junitxml "$VENV/results/$(basename "$file" .py).xml" \
    "$file" >"$VENV/results/$(basename "$file" .py).log" 2>&1
done

"$VENV/bin/python" - "$VENV" "${TESTS[@]}" <<'PY'
import json, sys, xml.etree.ElementTree as ET
from importlib.metadata import version
from pathlib import Path

venv, tests = Path(sys.argv[1]), sys.argv[2:]
locked = {}
for line in Path("locks/main.txt").read_text().splitlines():
    if line and not line.startswith("#"):
        name, pinned = line.split("==")
        locked[name.lower().replace("_", "-")] = pinned
locked["torch"] = Path("constraints-cpu.txt").read_text().split("torch==")[1].split()[0]
packages = ["torch", "transformers", "peft", "accelerate", "lm-eval", "safetensors", "tokenizers", "huggingface-hub", "datasets"]
rows = [{"package": p, "locked": locked.get(p, "-"), "tried": version(p)} for p in packages]
results = []
for test in tests:
    report = venv / "results" / (Path(test).stem + ".xml")
    if not report.is_file():
        results.append({"tests": test, "passed": 0, "failed": 0, "errors": 1, "skipped": 0})
        continue
    suite = ET.parse(report).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    n, failures, errors, skipped = (int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped"))
    results.append({"tests": test, "passed": n - failures - errors - skipped, "failed": failures, "errors": errors, "skipped": skipped})
ok = all(r["failed"] == 0 and r["errors"] == 0 for r in results)
(venv / "check_latest.json").write_text(json.dumps({"versions": rows, "results": results, "ok": ok}, indent=2) + "\n")
print("| package | locked | tried |\n| --- | --- | --- |")
for r in rows:
    mark = "" if r["locked"] == r["tried"] else " (newer)"
    print(f"| {r['package']} | {r['locked']} | {r['tried']}{mark} |")
print("\n| tests | passed | failed | errors | skipped |\n| --- | --- | --- | --- | --- |")
for r in results:
    print(f"| {r['tests']} | {r['passed']} | {r['failed']} | {r['errors']} | {r['skipped']} |")
print(f"\ncheck_latest: {'every test passed' if ok else 'FAILURES: see ' + str(venv / 'results')}")
sys.exit(0 if ok else 1)
PY
