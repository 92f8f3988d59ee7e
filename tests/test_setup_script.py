"""scripts/setup.sh picks the torch build: the CUDA one already installed, the registry's default where an
NVIDIA GPU is present, else the CPU pin of constraints-cpu.txt; and says which on a ``torch:`` line.

Run against a fake ``.venv`` (its ``python`` records pip's arguments and answers ``import torch``
with a chosen build) and a fake ``nvidia-smi``: nothing is installed.
"""

from __future__ import annotations

import shutil
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")

FAKE_PYTHON = """#!/usr/bin/env bash
# fake venv python: "-m pip ..." is logged; "-" (a script on stdin) answers the CUDA-torch probe
if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then echo "pip $*" >> "$LOG"; exit 0; fi
if [ "$1" = "-" ]; then cat >/dev/null; [ -n "$FAKE_CUDA_TORCH" ] && echo "$FAKE_CUDA_TORCH"; exit 0; fi
exit 0
"""


def _executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def _run(tmp_path: Path, *, gpu: bool, cuda_torch: str = "", choice: str | None = None) -> tuple[int, str, str]:
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "setup.sh", repo / "scripts" / "setup.sh")
    shutil.copy(ROOT / "constraints-cpu.txt", repo / "constraints-cpu.txt")
    venv_bin = repo / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    _executable(venv_bin / "python", FAKE_PYTHON)
    (venv_bin / "activate").write_text(f'export PATH="{venv_bin}:$PATH"\n')
    tools = tmp_path / "tools"
    tools.mkdir()
    if gpu:
        _executable(tools / "nvidia-smi", '#!/usr/bin/env bash\necho "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)"\n')
    log = tmp_path / "pip.log"
    env = {"PATH": f"{tools}:/usr/bin:/bin", "LOG": str(log), "FAKE_CUDA_TORCH": cuda_torch, "HOME": str(tmp_path)}
    if choice is not None:
        env["LADDERIZE_TORCH"] = choice
    done = subprocess.run(["bash", str(repo / "scripts" / "setup.sh")], env=env, capture_output=True, text=True, timeout=60)
    return done.returncode, done.stdout + done.stderr, log.read_text() if log.exists() else ""


def test_cpu_machine_pins_the_cpu_build(tmp_path):
    code, out, pip = _run(tmp_path, gpu=False)
    assert code == 0, out
    assert "torch: no NVIDIA GPU found; the CPU build pinned in constraints-cpu.txt" in out
    assert "-c constraints-cpu.txt" in pip and "torch==2.13.0" in (ROOT / "constraints-cpu.txt").read_text()


def test_gpu_machine_takes_the_registry_default(tmp_path):
    code, out, pip = _run(tmp_path, gpu=True)
    assert code == 0, out
    assert "an NVIDIA GPU is present; installing the registry's default torch build" in out
    assert pip and "constraints-cpu" not in pip


def test_installed_cuda_torch_is_kept(tmp_path):
    code, out, pip = _run(tmp_path, gpu=False, cuda_torch="2.11.0+cu130 (CUDA 13.0)")
    assert code == 0, out
    assert "torch: the CUDA build already installed, 2.11.0+cu130 (CUDA 13.0)" in out
    assert pip and "constraints-cpu" not in pip


def test_forced_cpu_and_bad_choice(tmp_path):
    code, out, pip = _run(tmp_path / "a", gpu=True, cuda_torch="2.11.0+cu130 (CUDA 13.0)", choice="cpu")
    assert code == 0 and "LADDERIZE_TORCH=cpu" in out and "-c constraints-cpu.txt" in pip
    code, out, _ = _run(tmp_path / "b", gpu=False, choice="rocm")
    assert code == 2 and "LADDERIZE_TORCH must be auto, cpu or cuda" in out
