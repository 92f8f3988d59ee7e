"""Every ``benchmarks/*.py`` and ``lab/*.py`` imports against the product as it is now and answers ``--help``.

Each runs in its own process (``python benchmarks/X.py --help``), which executes the module's
imports and its argument parser and nothing else: a script that imports a name the product no
longer has, or a test helper that moved, fails here rather than on the GPU machine. A module with
no ``__main__`` block (``adapt_common.py``, the adapt scripts' shared code) is only imported.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((ROOT / "benchmarks").glob("*.py")) + sorted((ROOT / "lab").glob("*.py"))


def test_the_benchmarks_and_the_lab_scripts_are_found():
    assert len(SCRIPTS) >= 25 and ROOT / "benchmarks" / "bench_vllm_layouts.py" in SCRIPTS
    assert ROOT / "lab" / "adapt_interpolate.py" in SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS, ids=[f"{s.parent.name}/{s.stem}" for s in SCRIPTS])
def test_benchmark_imports_and_answers_help(script: Path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run([sys.executable, str(script), "--help"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, f"{script.name} --help failed:\n{done.stderr[-3000:]}"
    if 'if __name__ == "__main__"' in script.read_text():
        assert "usage:" in done.stdout, f"{script.name} --help printed no usage:\n{done.stdout[-2000:]}"


def test_the_curve_counts_a_re_planned_budget_s_token_passes(monkeypatch):
    """``adapt_curve.token_passes`` reads the plan line and, after a stage, the re-plan line ``budget.replan`` writes."""
    import importlib.util

    from ladderize.adapt.plan.budget import Budget, Sizing, plan_line, replan
    from tests.adapt.test_budget import timed_plan

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))  # its sibling adapt_common
    spec = importlib.util.spec_from_file_location("adapt_curve_under_test", ROOT / "benchmarks" / "adapt_curve.py")
    curve = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(curve)
    pace, steps, planned = timed_plan()
    said = [plan_line(Budget("15m", seconds=20.0 + sum(planned)), steps)]
    record = Sizing("15m", seconds=20.0 + sum(planned), pace=pace, planned_s=tuple(planned))
    replanned, _ = replan(steps, 0, record, [1.2 * planned[0]], said.append)
    assert curve.token_passes({"adapt": {"plan": said[:1], "stdout_tail": []}}) == 204_800 + 51_200
    assert curve.token_passes({"adapt": {"plan": said, "stdout_tail": []}}) == 204_800 + replanned[1].tokens < 256_000
    # the line before it said its total (one recorded run): the kd stage's change counted
    old = said[1].replace(f": {204_800 + replanned[1].tokens:,} token passes", "")
    assert "token passes" not in old.split("; re-planned")[1]
    assert curve.token_passes({"adapt": {"plan": [said[0], old], "stdout_tail": []}}) == 204_800 + replanned[1].tokens
