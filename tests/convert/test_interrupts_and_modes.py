"""Interrupted writes leave nothing behind, stale temp folders of dead writers are swept, file modes follow the umask."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ladderize.checkpoint.atomic import atomic_directory, sweep_stale
from ladderize.checkpoint.io import load_model, save_model_checkpoint
from ladderize.convert.conversion import convert_checkpoint

REPO = Path(__file__).resolve().parents[2]

# Runs the real console entry point; the first tensor written signals readiness and then waits,
# so the SIGTERM is sure to land in the middle of the conversion.
CONVERT_AND_WAIT = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from ladderize.checkpoint import tensor_files
    from ladderize import cli

    ready = Path(sys.argv[1])
    original_add = tensor_files.ShardWriter.add

    def slow_add(self, name, tensor):
        original_add(self, name, tensor)
        if not ready.exists():
            ready.write_text("writing")
        time.sleep(0.5)

    tensor_files.ShardWriter.add = slow_add
    sys.argv = ["ladderize", "convert", *sys.argv[2:]]
    cli.main()
    """
)


def _leftovers(folder: Path, name: str) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.name.startswith(f".{name}.tmp-") or p.name.startswith(f".{name}.old-"))


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


@pytest.mark.parametrize("signum, code, name", [(signal.SIGTERM, 143, "SIGTERM"), (signal.SIGINT, 130, "SIGINT")])
def test_signal_during_convert_leaves_no_temp_folder(tiny_llama_dir: Path, tmp_path: Path, signum, code, name):
    out = tmp_path / "converted"
    ready = tmp_path / "ready"
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    process = subprocess.Popen(
        [sys.executable, "-c", CONVERT_AND_WAIT, str(ready), str(tiny_llama_dir), str(out), "--ladder", "all"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
    )
    deadline = time.monotonic() + 120
    while not ready.exists():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "convert never started writing"
        time.sleep(0.05)
    assert len(_leftovers(tmp_path, "converted")) == 1  # mid-conversion: the temp folder exists
    process.send_signal(signum)
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == code, stderr
    lines = [line for line in stderr.splitlines() if line.strip() and not line.startswith("convert ")]  # progress lines
    assert lines == [f"interrupted ({name})"], stderr
    assert "Traceback" not in stderr
    assert not out.exists()
    assert _leftovers(tmp_path, "converted") == []


def test_stale_temp_folder_of_a_dead_pid_is_removed_by_the_next_run(tiny_llama_dir: Path, tmp_path: Path):
    out = tmp_path / "converted"
    dead = _dead_pid()
    stale_tmp = tmp_path / f".converted.tmp-{dead}-abc123"
    stale_old = tmp_path / f".converted.old-{dead}-def456"
    live = tmp_path / f".converted.tmp-{os.getppid()}-xyz789"  # a writer that still runs: kept
    legacy = tmp_path / ".converted.tmp-q1w2e3"  # no pid recorded: cannot be judged, kept
    other = tmp_path / f".other.tmp-{dead}-abc123"  # another output's temp folder: not ours to sweep
    for folder in (stale_tmp, stale_old, live, legacy, other):
        (folder / "sub").mkdir(parents=True)
        (folder / "sub" / "model.safetensors").write_bytes(b"x" * 100)
    convert_checkpoint(str(tiny_llama_dir), out)
    assert out.is_dir() and not stale_tmp.exists() and not stale_old.exists()
    assert live.exists() and legacy.exists() and other.exists()
    assert _leftovers(tmp_path, "converted") == sorted([legacy, live])


def test_temp_folder_names_record_the_pid_and_vanish_on_error(tmp_path: Path):
    out = tmp_path / "result"
    with pytest.raises(RuntimeError):
        with atomic_directory(out) as tmp:
            assert tmp.name.startswith(f".result.tmp-{os.getpid()}-")
            assert sweep_stale(out) == []  # our own temp folder is alive
            (tmp / "file").write_text("partial")
            raise RuntimeError("boom")
    assert not out.exists() and list(tmp_path.iterdir()) == []


def _modes(folder: Path) -> dict[str, int]:
    return {p.name: stat.S_IMODE(p.stat().st_mode) for p in [folder, *folder.rglob("*")]}


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_converted_and_saved_checkpoints_follow_the_umask(tiny_llama_dir: Path, tmp_path: Path, umask: int):
    previous = os.umask(umask)
    try:
        converted = convert_checkpoint(str(tiny_llama_dir), tmp_path / "converted", spd="0:1", spd_tp_size=3)
        sharded = convert_checkpoint(str(tiny_llama_dir), tmp_path / "sharded", max_shard_bytes=20_000)
        saved = save_model_checkpoint(load_model(converted), None, tmp_path / "saved", provenance={})
    finally:
        os.umask(previous)
    for folder in (converted, sharded, saved):
        modes = _modes(folder)
        assert any(name.endswith(".safetensors") for name in modes)
        expected = {name: (0o777 if (folder / name).is_dir() or name == folder.name else 0o666) & ~umask for name in modes}
        assert modes == expected, folder
    assert len(list(sharded.glob("model-*.safetensors"))) > 1


def test_write_file_atomic_replaces_whole_and_follows_the_umask(tmp_path):
    """The one single-file writer: text or bytes, the old file or the new one, mode from the umask."""
    import os

    from ladderize.checkpoint.atomic import write_file_atomic

    target = tmp_path / "sub" / "record.json"
    write_file_atomic(target, "old\n")
    old_umask = os.umask(0o027)
    try:
        write_file_atomic(target, b"\x89PNG new")
    finally:
        os.umask(old_umask)
    assert target.read_bytes() == b"\x89PNG new"
    assert target.stat().st_mode & 0o777 == 0o640
    assert [p.name for p in target.parent.iterdir()] == ["record.json"]  # no temp file left beside it


def test_forked_pools_still_terminate_under_the_interrupt_handlers(tmp_path):
    """lm-eval's bootstrap ``Pool`` (fork) ends: workers die on Pool.terminate()'s SIGTERM instead of raising
    ``Interrupted`` while holding the queue lock (that hung ``ladderize eval`` forever)."""
    import subprocess
    import sys

    script = tmp_path / "pools.py"
    script.write_text(
        "import multiprocessing as mp\n"
        "from ladderize.errors import install_interrupt_handlers\n"
        "install_interrupt_handlers()\n"
        "def square(x):\n    return x * x\n"
        "for _ in range(20):\n"
        "    with mp.get_context('fork').Pool(2) as pool:\n"
        "        assert pool.map(square, range(50)) == [x * x for x in range(50)]\n"
        "print('done')\n"
    )
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "done", result.stderr[-2000:]
    assert "Interrupted" not in result.stderr
