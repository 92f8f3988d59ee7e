"""A launched run with ``--budget`` resumes under its launcher: every process takes the same collectives in the same
order on resume as on a first run (the main process reads the saved plan and agrees it), and a token budget's resume
ends bit-identical to an uninterrupted run."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.adapt.test_multiprocess import launch_failure
from tests.adapt.test_sharded import _env, _torchrun

ARGS = ["--seq-len", "32", "--batch-size", "2", "--device", "cpu", "--dtype", "float32", "--no-compile",
        "--stage", "kd:tokens=64"]


def _adapt(processes: int, checkpoint: Path, out: Path, text: Path, tmp_path: Path, *extra: str,
           expect: int = 0) -> subprocess.CompletedProcess:
    command = [*_torchrun(processes), "-m", "ladderize.cli", "adapt", str(checkpoint), str(out), "--data", str(text),
               *ARGS, *extra]
    done = subprocess.run(command, env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert done.returncode == expect, launch_failure(done.stderr)
    return done


def test_a_token_budget_run_stopped_under_torchrun_resumes_bit_identical(ladder_dir, text_file, tmp_path):
    """``torchrun --nproc_per_node 2 ... --budget 512 --max-steps 2``, then the same command with ``--resume`` and no
    ``--max-steps``: the resume reads the saved plan on the main process and every rank takes it, and OUT equals the
    uninterrupted run's byte for byte."""
    budget = ["--budget", "512"]
    _adapt(2, ladder_dir, tmp_path / "whole", text_file, tmp_path, *budget)
    _adapt(2, ladder_dir, tmp_path / "cut", text_file, tmp_path, *budget, "--max-steps", "2")
    done = _adapt(2, ladder_dir, tmp_path / "cut", text_file, tmp_path, *budget, "--resume")
    assert "resumed from step 2" in done.stdout + done.stderr, done.stderr[-2000:]
    whole, cut = ((tmp_path / name / "model.safetensors").read_bytes() for name in ("whole", "cut"))
    assert whole == cut


def test_a_wall_budget_run_stopped_under_torchrun_resumes_from_the_saved_plan(ladder_dir, text_file, tmp_path):
    """A wall budget (``--budget 30s``) stopped by ``--max-steps`` resumes under the launcher from the saved step and
    with the plan its first attempt recorded (no pace timed again)."""
    budget = ["--budget", "30s"]
    _adapt(2, ladder_dir, tmp_path / "cut", text_file, tmp_path, *budget, "--max-steps", "1")
    plan = (tmp_path / "cut.adapt-run" / "recipe.json").read_text()
    done = _adapt(2, ladder_dir, tmp_path / "cut", text_file, tmp_path, *budget, "--resume")
    said = done.stdout + done.stderr
    assert "resumed from step 1" in said and "timing this device's pace" not in said, said[-2000:]
    assert (tmp_path / "cut" / "model.safetensors").is_file()
    assert plan.count('"stage"') >= 1
