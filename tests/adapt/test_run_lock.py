"""One live adapt run per OUT (``adapt/run_lock.py``): a second run into an OUT a live run holds is refused in one
line naming the holder, before it writes anything, and the first finishes; a lock a dead run left is taken over; the
lock goes when the run ends, however it ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ladderize.adapt.run_lock import holding_run, lock_path
from ladderize.errors import LadderizeError

ROOT = Path(__file__).resolve().parents[2]


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
            "HF_HUB_OFFLINE": "1", "ACCELERATE_CONFIG_FILE": str(tmp_path / "no-config.yaml"),
            "LADDERIZE_PROGRESS_INTERVAL": "0"}


def _wait_for(condition, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.1)


def test_a_second_adapt_into_a_held_out_is_refused_naming_the_first_which_finishes(ladder_dir, text_file, tmp_path):
    out = tmp_path / "out"
    args = [sys.executable, "-m", "ladderize.cli", "adapt", str(ladder_dir), str(out), "--data", str(text_file),
            "--objective", "kd", "--tokens", str(16 * 2 * 32), "--seq-len", "32", "--batch-size", "2", "--device", "cpu",
            "--no-compile", "--dtype", "float32"]
    first = subprocess.Popen(args, env=_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             cwd=tmp_path)
    lock = lock_path(tmp_path / "out.adapt-run")
    try:
        _wait_for(lambda: lock.is_file() or first.poll() is not None, 120, "the first run's lock")
        assert first.poll() is None, first.communicate()
        os.kill(first.pid, signal.SIGSTOP)  # the first holds OUT for as long as the second takes
        try:
            started = time.monotonic()
            second = subprocess.run([*args, "--force"], env=_env(tmp_path), capture_output=True, text=True,
                                    cwd=tmp_path, timeout=60)
            took = time.monotonic() - started
        finally:
            os.kill(first.pid, signal.SIGCONT)
        assert second.returncode == 2, second.stderr
        lines = [line for line in second.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: ") and f"process {first.pid} on" in lines[0], lines
        assert took < 30, f"refused after {took:.1f} s"
        _, err = first.communicate(timeout=180)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert first.returncode == 0, err
    assert (out / "model.safetensors").is_file()
    assert not lock.exists() and not (tmp_path / "out.adapt-run").exists()


def test_a_lock_left_by_a_dead_run_is_taken_over_and_released(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    run_dir = tmp_path / "out.adapt-run"
    lock = lock_path(run_dir)
    lock.write_text(f'{{"pid": {dead.pid}, "host": "{os.uname().nodename}", "started": 0}}\n')
    said: list[str] = []
    with holding_run(run_dir, tmp_path / "out", say=said.append):
        assert f'"pid": {os.getpid()}' in lock.read_text()
    assert len(said) == 1 and f"from process {dead.pid}" in said[0] and "ended without releasing it" in said[0]
    assert not lock.exists() and not run_dir.exists()


def test_a_live_holder_refuses_and_an_error_releases(tmp_path):
    run_dir = tmp_path / "out.adapt-run"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from pathlib import Path; from ladderize.adapt.run_lock import holding_run\n"
        f"with holding_run(Path({str(run_dir)!r}), Path('out')):\n"
        "    print('held', flush=True); time.sleep(60)")], env=_env(tmp_path), stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(LadderizeError, match=rf"in use: .* \(process {holder.pid} on "):
            with holding_run(run_dir, tmp_path / "out"):
                pytest.fail("a held run dir was taken")
    finally:
        holder.kill()
        holder.wait()
    with pytest.raises(RuntimeError):  # the holder was killed: its lock is stale, taken over, and released on an error
        with holding_run(run_dir, tmp_path / "out"):
            raise RuntimeError("boom")
    assert not lock_path(run_dir).exists()


def test_a_refused_run_leaves_no_folder_the_lock_made(tmp_path):
    """The lock's folders (OUT's parent, where it did not exist) go again where the run left nothing in them."""
    run_dir = tmp_path / "new" / "deeper" / "out.adapt-run"
    with pytest.raises(LadderizeError, match="refused"):
        with holding_run(run_dir, tmp_path / "new" / "deeper" / "out"):
            raise LadderizeError("refused")
    assert list(tmp_path.iterdir()) == []
