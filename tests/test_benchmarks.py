"""Every ``benchmarks/*.py`` imports against the product as it is now and answers ``--help``.

Each runs in its own process (``python benchmarks/X.py --help``), which executes the module's
imports and its argument parser and nothing else: a benchmark that imports a name the product no
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
SCRIPTS = sorted((ROOT / "benchmarks").glob("*.py"))


def test_the_benchmarks_are_found():
    assert len(SCRIPTS) >= 15 and ROOT / "benchmarks" / "bench_vllm_layouts.py" in SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.stem for s in SCRIPTS])
def test_benchmark_imports_and_answers_help(script: Path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run([sys.executable, str(script), "--help"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, f"{script.name} --help failed:\n{done.stderr[-3000:]}"
    if 'if __name__ == "__main__"' in script.read_text():
        assert "usage:" in done.stdout, f"{script.name} --help printed no usage:\n{done.stdout[-2000:]}"
