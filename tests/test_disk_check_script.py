"""scripts/disk_check.sh (run first by scripts/test.sh) warns, and never fails, when the disk has less free than the
suite needs: the venvs not built yet, and the test files at their peak. Run against a fake ``df``."""

from __future__ import annotations

import shutil
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
VENVS = (".venv", ".venv-vllm", ".venv-tf4", ".venv-gpucheck")


def _run(tmp_path: Path, free_mib: int, venvs: tuple[str, ...] = ()) -> tuple[int, str]:
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "disk_check.sh", repo / "scripts" / "disk_check.sh")
    for venv in venvs:
        (repo / venv).mkdir()
    tools = tmp_path / "tools"
    tools.mkdir()
    df = tools / "df"  # POSIX output (df -Pk): 1024-byte blocks, "Available" in the fourth column
    df.write_text("#!/usr/bin/env bash\necho 'Filesystem 1024-blocks Used Available Capacity Mounted on'\n"
                  f"echo '/dev/vda 264000000 40000000 {free_mib * 1024} 15% /'\n")
    df.chmod(df.stat().st_mode | stat.S_IXUSR)
    temp = tmp_path / "tmp"
    temp.mkdir()
    done = subprocess.run(["bash", str(repo / "scripts" / "disk_check.sh")], capture_output=True, text=True, timeout=60,
                          env={"PATH": f"{tools}:/usr/bin:/bin", "TMPDIR": str(temp)})
    return done.returncode, done.stdout + done.stderr


def test_a_fresh_clone_on_a_small_disk_is_warned_of_every_venv_and_the_test_files(tmp_path):
    code, out = _run(tmp_path, free_mib=7_000)
    assert code == 0
    lines = out.strip().splitlines()
    assert len(lines) == 2, out  # the repository's disk and the temp folder's
    assert all(line.startswith("disk_check: warning: 7000 MiB free on ") for line in lines)
    assert "the suite needs about 12596 MiB" in lines[0]  # 4096 of test files + 1900 + 3400 + 1400 + 1800 of venvs
    assert lines[1].split(" free on ")[1].startswith(str(tmp_path / "tmp"))


def test_built_venvs_are_not_counted(tmp_path):
    assert _run(tmp_path, free_mib=7_000, venvs=VENVS) == (0, "")
    code, out = _run(tmp_path / "again", free_mib=3_000, venvs=VENVS)
    assert code == 0 and out.count("the suite needs about 4096 MiB") == 2, out


def test_a_large_disk_says_nothing(tmp_path):
    assert _run(tmp_path, free_mib=100_000) == (0, "")
