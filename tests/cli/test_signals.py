"""Issue 26 item 16: a signal after a command finished keeps its exit code, and an interrupted bench exits at once.

Both run the real entry point in a subprocess (signals go to a process, not to an in-process call).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# The entry point with a slow teardown, as torch's gives under load: an atexit hook and a module global whose
# finalizer each take a while, so the signal surely lands after the output and before the process ends.
SLOW_TEARDOWN = """
import atexit, sys, time
atexit.register(time.sleep, 1.5)  # registered first: runs last
class _Slow:
    def __del__(self, sleep=time.sleep):  # module globals are gone by then
        sleep(1.5)
slow = _Slow()
from ladderize.cli import main
sys.argv = ["ladderize", *sys.argv[1:]]
main()
"""


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return found


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
def test_a_signal_after_the_output_keeps_the_exit_code(tmp_path, tiny_llama_dir):
    for signum in (signal.SIGINT, signal.SIGTERM):
        process = subprocess.Popen([sys.executable, "-c", SLOW_TEARDOWN, "inspect", str(tiny_llama_dir)], env=_env(),
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path, text=True)
        out = ""
        for line in process.stdout:
            out += line
            if "all-reduces" in line.lower() or "parameters" in line.lower():  # the summary: the last output
                break
        time.sleep(0.3)  # the command has returned; the interpreter is tearing down
        process.send_signal(signum)
        rest, err = process.communicate(timeout=60)
        assert process.returncode == 0, (signum, process.returncode, err)
        assert "Traceback" not in err and "KeyboardInterrupt" not in err and "interrupted" not in err, err


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
def test_interrupted_bench_stops_its_ranks_and_exits_promptly(tmp_path):
    argv = [sys.executable, "-m", "ladderize.cli", "bench", "--synthetic", "cpu-512", "--tp", "2", "--batch", "1,4",
            "--gen", "64", "--repeats", "200", "--device", "cpu", "--oversubscribe"]
    process = subprocess.Popen(argv, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path, text=True,
                               start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while len(_children(process.pid)) < 2 and time.monotonic() < deadline:  # the ranks (and the resource tracker)
            time.sleep(0.2)
        time.sleep(3.0)  # the ranks are benchmarking
        ranks = _children(process.pid)
        assert ranks, "the bench started no ranks"
        sent = time.monotonic()
        process.send_signal(signal.SIGINT)  # the parent only, as `kill -INT` does (Ctrl-C would signal the group)
        try:
            _, err = process.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            pytest.fail("bench did not exit within 20 s of SIGINT (it waited for its ranks)")
        took = time.monotonic() - sent
        assert process.returncode == 130 and "interrupted (SIGINT)" in err, err
        assert took < 8, f"bench took {took:.1f} s to exit on SIGINT"
        time.sleep(0.5)
        alive = [pid for pid in ranks if Path(f"/proc/{pid}").exists() and "Z" not in _state(pid)]
        assert not alive, f"ranks still running after the bench exited: {alive}"
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "Z"


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
def test_a_sigint_during_the_state_caching_at_8192_positions_stops_within_seconds(tmp_path, smollm2_dir):
    """SmolLM2 at its full 8,192 positions: a SIGINT while the sequential stage caches the teacher's states ends the
    run within 10 s, with nothing left behind (nothing was saved: the same command starts over) and the lock gone."""
    import threading

    ladder = tmp_path / "ladder"
    subprocess.run([sys.executable, "-m", "ladderize.cli", "convert", str(smollm2_dir), str(ladder), "--ladder", "15:30"],
                   env=_env(), capture_output=True, text=True, timeout=300, check=True)
    out = tmp_path / "out"
    process = subprocess.Popen([sys.executable, "-m", "ladderize.cli", "adapt", str(ladder), str(out), "--seq-len", "8192",
                                "--device", "cpu", "--no-compile"], env={**_env(), "LADDERIZE_PROGRESS_INTERVAL": "0"},
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
    caching, lines = threading.Event(), []

    def read() -> None:
        for line in process.stdout:
            lines.append(line)
            if "caching the states entering layer" in line:
                caching.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert caching.wait(240), "".join(lines)
        time.sleep(2.0)  # inside the teacher's layers, chunk by chunk
        assert process.poll() is None, "".join(lines)
        sent = time.monotonic()
        process.send_signal(signal.SIGINT)
        process.wait(timeout=60)
        took = time.monotonic() - sent
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    reader.join(timeout=10)
    text = "".join(lines)
    assert process.returncode == 130 and "interrupted (SIGINT)" in text, text
    assert took < 10, f"stopped {took:.1f} s after the SIGINT"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ladder"], list(tmp_path.iterdir())  # no run dir, OUT or lock
