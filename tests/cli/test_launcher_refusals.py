"""Under a launcher (torchrun, accelerate launch) a refusal is printed once, by the main process; every process exits
with the refusal's code."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.adapt.test_accelerate_config import FSDP_YAML
from tests.adapt.test_sharded import _env, _torchrun
from tests.runtime.runtime_helpers import save_tiny



@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    save_tiny(tmp_path / "ckpt")
    return tmp_path / "ckpt"


def _run(command: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(command, env=_env(tmp_path), capture_output=True, text=True, timeout=120, cwd=tmp_path)


def _ladderize_frames(output: str) -> list[str]:
    """The traceback lines of any process that point into ladderize's own code (torchrun's report has its own)."""
    return [line for line in output.splitlines() if line.strip().startswith("File ") and "ladderize" in line
            and "/tests/" not in line]


@pytest.mark.parametrize("bad, says", [
    (["--budget", "abc"], "error: --budget 'abc'"),  # a LadderizeError
    (["--seq-len", "abc"], "Invalid value for '--seq-len'"),  # a usage error of the parser
])
def test_torchrun_prints_a_refusal_once(checkpoint, tmp_path, bad, says):
    done = _run([*_torchrun(2), "-m", "ladderize.cli", "adapt", str(checkpoint), str(tmp_path / "out"), *bad], tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode != 0
    assert output.count(says) == 1, output
    assert not _ladderize_frames(output), output
    assert "exitcode  : 2" in output  # both processes exit with the refusal's code (torchrun's report)
    assert not (tmp_path / "out").exists()


def test_accelerate_fsdp_offload_refused_once(checkpoint, tmp_path):
    config = tmp_path / "fsdp-offload.yaml"
    config.write_text(FSDP_YAML.format(offload="true"))
    done = _run([sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config), "--main_process_port",
                 "0", "-m", "ladderize.cli", "adapt", str(checkpoint), str(tmp_path / "out"), "--tokens", "256",
                 "--seq-len", "32", "--device", "cpu"], tmp_path)
    errors = [line for line in (done.stdout + done.stderr).splitlines() if line.startswith("error:")]
    assert done.returncode != 0
    assert len(errors) == 1 and "fsdp_offload_params" in errors[0], done.stderr
    assert not _ladderize_frames(done.stdout + done.stderr), done.stderr
    assert not (tmp_path / "out").exists()


def test_torchrun_refusal_after_the_process_group_started_is_one_line(checkpoint, tmp_path):
    """A refusal every rank reaches once the launch's process group runs (a batch of 3 does not divide over 2
    processes): one ``error:`` line, every rank exits 2, and the launcher's SIGTERM to the waiting rank ends it
    quietly."""
    from ladderize.convert.conversion import convert_checkpoint
    from tests.runtime.runtime_helpers import save_char_tokenizer

    save_char_tokenizer(checkpoint)
    ladder = convert_checkpoint(str(checkpoint), tmp_path / "ladder", ladder="2:4")
    (tmp_path / "text.txt").write_text("the quick brown fox jumps over the lazy dog. " * 400)
    done = _run([*_torchrun(2), "-m", "ladderize.cli", "adapt", str(ladder), str(tmp_path / "out"), "--stage",
                 "kd:tokens=1024", "--batch-size", "3", "--seq-len", "32", "--data", str(tmp_path / "text.txt"),
                 "--device", "cpu"], tmp_path)
    output = done.stdout + done.stderr
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert done.returncode != 0
    assert len(errors) == 1, output
    assert not _ladderize_frames(output), output
    assert "Interrupted" not in output and "exitcode  : 1 " not in output, output  # 2, or 143 where SIGTERM came first
    assert not (tmp_path / "out").exists()
