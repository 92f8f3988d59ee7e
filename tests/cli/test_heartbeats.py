"""Off a terminal, convert, eval and bench print a line at least every progress interval while they work (the
heartbeat of ``ladderize.progress.Progress``), from the libraries' loading on."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.runtime.runtime_helpers import save_char_tokenizer, save_tiny


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    save_tiny(tmp_path / "ckpt")
    save_char_tokenizer(tmp_path / "ckpt")
    return tmp_path / "ckpt"


def _stderr_lines(args: list, tmp_path: Path) -> list[str]:
    """Run ``ladderize ARGS`` with stderr a pipe (not a terminal) and a 0.1 s progress interval; its stderr lines."""
    env = {**os.environ, "LADDERIZE_PROGRESS_INTERVAL": "0.1", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run([sys.executable, "-m", "ladderize.cli", *map(str, args)], env=env, capture_output=True,
                          text=True, timeout=180, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    return done.stderr.splitlines()


def test_convert_beats_while_it_loads(checkpoint, tmp_path):
    lines = _stderr_lines(["convert", checkpoint, tmp_path / "out", "--ladder", "2:4"], tmp_path)
    beats = [line for line in lines if re.match(r"convert  working, \d+s since the last line$", line)]
    assert beats and lines.index(beats[0]) == 0, lines  # the heartbeat, before the first tensor's line
    assert any(re.match(r"convert \d+/\d+ \(100%\) .*done$", line) for line in lines), lines


def test_eval_beats_before_its_first_request(checkpoint, tmp_path, bundled_data_dir):
    lines = _stderr_lines(["eval", checkpoint, "--tasks", "lambada_openai", "--limit", "2", "--data-dir", bundled_data_dir],
                          tmp_path)
    beats = [line for line in lines if re.match(r"eval  working, \d+s since the last line$", line)]
    first_request = next(i for i, line in enumerate(lines) if line.startswith("eval loglikelihood requests"))
    assert beats and lines.index(beats[0]) < first_request, lines


def test_bench_beats_until_its_table(tmp_path):
    lines = _stderr_lines(["bench", "--synthetic", "tiny", "--tp", "1", "--batch", "1", "--prompt", "4", "--gen", "2",
                           "--warmup", "0", "--repeats", "1", "--schedules", "native"], tmp_path)
    assert any(line.startswith("benchmarking synthetic:tiny at TP 1") for line in lines), lines
    assert any(re.match(r"bench  working, \d+s since the last line$", line) for line in lines), lines
