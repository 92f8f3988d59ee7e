"""A launched rank's death is explained and costs no work: a rank sent SIGABRT prints its Python stack, and a rank
killed with SIGKILL mid-kd stops the job within seconds (torchrun's monitor), after which ``--resume`` ends
bit-identical to an uninterrupted run."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import psutil

from tests.adapt.test_multiprocess import launch_failure
from tests.adapt.test_sharded import _env, _torchrun

ARGS = ["--stage", "kd", "--seq-len", "32", "--batch-size", "2", "--device", "cpu", "--dtype", "float32",
        "--no-compile", "--save-every", "1"]


def _command(checkpoint: Path, out: Path, text: Path, tokens: int, *extra: str) -> list[str]:
    """kd under ``torchrun --nproc_per_node 2``, sized by a token budget of ``tokens``."""
    return [*_torchrun(2), "-m", "ladderize.cli", "adapt", str(checkpoint), str(out), "--data", str(text), *ARGS,
            "--budget", str(tokens), *extra]


def _rank(launcher: subprocess.Popen, rank: int, timeout: float = 120) -> psutil.Process:
    """The worker process of ``rank`` that ``launcher`` (torchrun) started."""
    ends = time.monotonic() + timeout
    while time.monotonic() < ends:
        for child in psutil.Process(launcher.pid).children(recursive=True):
            try:
                if child.environ().get("RANK") == str(rank) and "ladderize.cli" in " ".join(child.cmdline()):
                    return child
            except psutil.Error:
                continue
        time.sleep(0.2)
    raise AssertionError(f"torchrun started no rank {rank}")


def _wait_for_saves(run: Path, launcher: subprocess.Popen, step: int, timeout: float = 240) -> None:
    """Until the run's saved state is past ``step`` (its ``trainer_state.json``)."""
    import json

    ends = time.monotonic() + timeout
    while time.monotonic() < ends and launcher.poll() is None:
        for state in run.glob("**/state/trainer_state.json"):
            try:
                if json.loads(state.read_text()).get("step", 0) >= step:
                    return
            except (OSError, ValueError):
                pass
        time.sleep(0.1)
    raise AssertionError(f"no save past step {step} in {run}")


def test_a_rank_sent_sigabrt_prints_its_python_stack(ladder_dir, text_file, tmp_path):
    launcher = subprocess.Popen(_command(ladder_dir, tmp_path / "out", text_file, 1 << 20), env=_env(tmp_path),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_saves(tmp_path / "out.adapt-run", launcher, 1)
        _rank(launcher, 1).send_signal(signal.SIGABRT)
        _, stderr = launcher.communicate(timeout=60)
    finally:
        launcher.kill()
    assert "Fatal Python error: Aborted" in stderr, stderr[-3000:]
    stack = stderr[stderr.index("Fatal Python error: Aborted"):]
    assert "Thread 0x" in stack or "Current thread" in stack
    assert 'File "' in stack and "ladderize" in stack, stack[:3000]


def test_a_rank_killed_mid_kd_stops_the_job_and_the_resume_ends_bit_identical(ladder_dir, text_file, tmp_path):
    tokens = 64 * 24  # 24 steps of 2 sequences of 32 tokens
    whole = subprocess.run(_command(ladder_dir, tmp_path / "whole", text_file, tokens), env=_env(tmp_path),
                           capture_output=True, text=True, timeout=300)
    assert whole.returncode == 0, launch_failure(whole.stderr)
    launcher = subprocess.Popen(_command(ladder_dir, tmp_path / "cut", text_file, tokens), env=_env(tmp_path),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_saves(tmp_path / "cut.adapt-run", launcher, 3)
        _rank(launcher, 1).kill()
        killed = time.monotonic()
        launcher.communicate(timeout=60)
        stopped_in = time.monotonic() - killed
    finally:
        launcher.kill()
    assert launcher.returncode != 0 and stopped_in < 30, stopped_in
    assert not (tmp_path / "cut").exists()
    resumed = subprocess.run(_command(ladder_dir, tmp_path / "cut", text_file, tokens, "--resume"), env=_env(tmp_path),
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, launch_failure(resumed.stderr)
    assert "resumed from step" in resumed.stdout + resumed.stderr
    assert (tmp_path / "cut" / "model.safetensors").read_bytes() == (tmp_path / "whole" / "model.safetensors").read_bytes()
