"""A convert whose output does not fit its disk is refused before a tensor is read; one whose write still meets a
full disk ends in one line, its temp dir removed and an earlier OUT as it was."""

from __future__ import annotations

import errno
import os
import shutil
import time
from collections import namedtuple
from pathlib import Path

from safetensors import SafetensorError

from tests.cli_helpers import run_cli
from tests.convert.test_bad_input import _assert_clean_failure

Usage = namedtuple("Usage", "total used free")


def test_convert_into_a_disk_too_small_is_refused_before_work(tiny_llama_dir: Path, tmp_path: Path, capsys,
                                                               monkeypatch) -> None:
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(real(path).total, real(path).total - 4096, 4096))
    out = tmp_path / "out"
    began = time.perf_counter()
    code, _, err = run_cli(["convert", tiny_llama_dir, out, "--ladder", "2:4"], capsys, monkeypatch)
    _assert_clean_failure(code, err, out, "not enough free space for OUT")
    assert "needed" in err and "available" in err
    assert time.perf_counter() - began < 10


def test_a_write_that_meets_a_full_disk_is_one_line_and_keeps_the_earlier_out(tiny_llama_dir: Path, tmp_path: Path,
                                                                                capsys, monkeypatch) -> None:
    out = tmp_path / "out"
    code, _, err = run_cli(["convert", tiny_llama_dir, out, "--ladder", "2:4"], capsys, monkeypatch)
    assert code == 0, err
    before = {path.name: path.read_bytes() for path in out.iterdir()}

    def full(*_args, **_kwargs):  # what safetensors raises on a full disk
        raise SafetensorError(f'Error while serializing: IoError(Os {{ code: {errno.ENOSPC}, kind: StorageFull, '
                              f'message: "{os.strerror(errno.ENOSPC)}" }})')

    monkeypatch.setattr("safetensors.torch.save_file", full)
    code, _, err = run_cli(["convert", tiny_llama_dir, out, "--ladder", "1:4", "--force"], capsys, monkeypatch)
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(lines) == 1 and "disk full while writing the checkpoint" in lines[0], err
    assert "Traceback" not in err
    assert "is as it was" in lines[0]
    assert {path.name: path.read_bytes() for path in out.iterdir()} == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.")]  # no temp dirs
