"""adapt under a launcher: a process count that differs from the one asked for is one warning; rank 0 alone prints."""

from __future__ import annotations

import pytest

from ladderize.checkpoint.placement import launch_mismatch
from tests.cli_helpers import run_cli

WARNING = "warning: accelerate launch was asked for several processes but started one"


def _adapt(ladder_dir, text_file, out, capsys, monkeypatch):
    args = ["adapt", ladder_dir, out, "--data", text_file, "--objective", "local", "--tokens", 64, "--seq-len", 32,
            "--batch-size", 2, "--device", "cpu"]  # fmt: skip
    return run_cli(args, capsys, monkeypatch)


def test_accelerate_simple_launcher_with_two_processes_warns_once(ladder_dir, text_file, tmp_path, capsys, monkeypatch):
    # what `accelerate launch --num_processes 2 --cpu` gives its single process (Accelerate 1.15's simple launcher)
    monkeypatch.setenv("ACCELERATE_USE_CPU", "True")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    code, stdout, stderr = _adapt(ladder_dir, text_file, tmp_path / "out", capsys, monkeypatch)
    assert code == 0, stderr
    assert stderr.count(WARNING) == 1 and "adapted 1 step" in stdout


@pytest.mark.parametrize("env,expected", [
    ({}, None),
    ({"WORLD_SIZE": "2"}, None),  # Accelerate's world read from the same variable
    ({"ACCELERATE_USE_CPU": "True"}, None),  # accelerate launch of one process: no MASTER_ADDR
    ({"ACCELERATE_USE_CPU": "True", "MASTER_ADDR": "127.0.0.1"}, WARNING),
])  # fmt: skip
def test_launch_mismatch(env, expected, monkeypatch):
    for name in ("WORLD_SIZE", "ACCELERATE_USE_CPU", "MASTER_ADDR"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    found = launch_mismatch()
    assert (found is None) if expected is None else found.startswith(expected) and "\n" not in found
    if env.get("WORLD_SIZE"):
        assert launch_mismatch(world=1) == "warning: the launcher started 2 processes (WORLD_SIZE) but Accelerate runs 1"


def test_only_rank_zero_prints_the_plan_and_result(ladder_dir, text_file, tmp_path, capsys, monkeypatch):
    code, stdout, stderr = _adapt(ladder_dir, text_file, tmp_path / "zero", capsys, monkeypatch)
    assert code == 0 and "adapted 1 step" in stdout, stderr
    monkeypatch.setenv("RANK", "1")
    code, stdout, stderr = _adapt(ladder_dir, text_file, tmp_path / "one", capsys, monkeypatch)
    assert code == 0, stderr
    assert stdout.strip() == ""


def test_two_process_staged_run_prints_once(ladder_dir, text_file, tmp_path):
    """``accelerate launch --multi_gpu --num_processes 2`` (gloo on CPU) of a two-stage run: the plan, the stage lines
    and the result appear once, and the second rank does not take the plan file rank 0 wrote for an earlier run."""
    import os
    import subprocess
    import sys

    from tests.adapt.test_multiprocess import launch_failure

    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
           "ACCELERATE_CONFIG_FILE": str(tmp_path / "no-config.yaml")}  # fmt: skip
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
              "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "0",
              "-m", "ladderize.cli", "adapt", str(ladder_dir), str(tmp_path / "two"), "--data", str(text_file),
              "--stage", "local:tokens=128", "--stage", "kd:tokens=128", "--seq-len", "32", "--batch-size", "2"]  # fmt: skip
    done = subprocess.run(launch, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, launch_failure(done.stderr)
    lines = done.stdout.splitlines()
    assert sum(line.startswith("plan (") for line in lines) == 1
    assert sum(line.startswith("stage 2/2") for line in lines) == 1
    assert sum(line.startswith("adapted 4 steps") for line in lines) == 1, done.stdout
    assert "warning:" not in done.stderr
