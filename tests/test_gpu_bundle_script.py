"""scripts/gpu_bundle.sh replaces the parts of an earlier build and keeps DIR and its downloads, whatever DIR is named
(``parts``, ``part-x``: names that its own ``part*`` pattern matches). Run with a stand-in for pip (which would reach
the registry) and the downloads already in place: tiny data, a tiny model file, no wheels."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
pytestmark = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("git") is None, reason="needs bash, git")


def _python_without_pip(tools: Path) -> Path:
    """This interpreter, except that ``-m pip`` does nothing (the downloads are in place; the wheels folder stays empty)."""
    tools.mkdir()
    python = tools / "python"
    python.write_text(f'#!/usr/bin/env bash\n[ "$1 $2" = "-m pip" ] && exit 0\nexec {sys.executable} "$@"\n')
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    return python


def _bundle(tmp_path: Path, name: str) -> tuple[subprocess.CompletedProcess, Path]:
    bundle = tmp_path / name
    downloads = bundle / ".downloads" / "cp312"
    (downloads / "wheels").mkdir(parents=True)
    (downloads / GGUF_NAME).write_bytes(b"GGUF" + bytes(4096))
    (bundle / "part7").mkdir()  # an earlier build's part, to be replaced
    data = tmp_path / "data"
    for relative in ("lambada_openai/lambada_test.jsonl", "wikitext-2/valid.txt"):
        (data / relative).parent.mkdir(parents=True)
        (data / relative).write_text('{"text": "a b c"}\n')
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path), "LADDERIZE_DATA_DIR": str(data),
           "LADDERIZE_HOME": str(tmp_path / "home"), "PYTHON": str(_python_without_pip(tmp_path / "tools"))}
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_bundle.sh"), str(bundle)], capture_output=True, text=True,
                          timeout=120, env=env)
    return done, bundle


@pytest.mark.parametrize("name", ["parts", "bundle"])
def test_a_rebuild_replaces_the_parts_and_keeps_dir_and_its_downloads(tmp_path, name):
    done, bundle = _bundle(tmp_path, name)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (bundle / ".downloads" / "cp312" / GGUF_NAME).is_file()
    assert sorted(p.name for p in bundle.iterdir()) == [".downloads", "part1"]
    assert (bundle / "part1" / "manifest.json").is_file()
