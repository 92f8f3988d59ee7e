"""Under a launcher (torchrun, accelerate launch) a refusal is printed once, by the main process; every process exits
with the refusal's code."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.adapt.test_accelerate_config import FSDP_YAML
from tests.adapt.test_sharded import _env, _free_port, _torchrun
from tests.runtime.runtime_helpers import save_tiny



@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    save_tiny(tmp_path / "ckpt")
    return tmp_path / "ckpt"


def _run(command: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(command, env=_env(tmp_path), capture_output=True, text=True, timeout=120, cwd=tmp_path)


@pytest.mark.parametrize("bad, says", [
    (["--budget", "abc"], "error: --budget 'abc'"),  # a LadderizeError
    (["--seq-len", "abc"], "Invalid value for '--seq-len'"),  # a usage error of the parser
])
def test_torchrun_prints_a_refusal_once(checkpoint, tmp_path, bad, says):
    done = _run([*_torchrun(2), "-m", "ladderize.cli", "adapt", str(checkpoint), str(tmp_path / "out"), *bad], tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode != 0
    assert output.count(says) == 1, output
    assert "exitcode  : 2" in output  # both processes exit with the refusal's code (torchrun's report)
    assert not (tmp_path / "out").exists()


def test_accelerate_fsdp_offload_refused_once(checkpoint, tmp_path):
    config = tmp_path / "fsdp-offload.yaml"
    config.write_text(FSDP_YAML.format(offload="true"))
    done = _run([sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config), "--main_process_port",
                 _free_port(), "-m", "ladderize.cli", "adapt", str(checkpoint), str(tmp_path / "out"), "--tokens", "256",
                 "--seq-len", "32", "--device", "cpu"], tmp_path)
    errors = [line for line in (done.stdout + done.stderr).splitlines() if line.startswith("error:")]
    assert done.returncode != 0
    assert len(errors) == 1 and "fsdp_offload_params" in errors[0], done.stderr
    assert not (tmp_path / "out").exists()
