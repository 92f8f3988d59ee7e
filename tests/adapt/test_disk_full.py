"""A long adapt meets a full disk: a plan that does not fit the free space is refused before the models load, and a
save that still meets a full disk ends in one line, keeps the previous save, and ``--resume`` then ends bit-identical
to an uninterrupted run."""

from __future__ import annotations

import errno
import os
import shutil
from collections import namedtuple

import torch.distributed.checkpoint as dcp

from tests.cli_helpers import run_cli

Usage = namedtuple("Usage", "total used free")


def _args(ladder_dir, text_file, out, *extra):
    return ["adapt", ladder_dir, out, "--data", text_file, "--stage", "kd:tokens=256", "--seq-len", "32",
            "--batch-size", "2", "--device", "cpu", "--dtype", "float32", "--no-compile", "--save-every", "1", *extra]


def _full_at(call: int, write):
    """``write``, except that its ``call``-th call meets a full disk (ENOSPC), as a disk another process filled."""
    calls = []

    def writing(*args, **kwargs):
        calls.append(1)
        if len(calls) == call:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return write(*args, **kwargs)

    return writing


def test_a_run_whose_writes_do_not_fit_is_refused_before_it_loads(ladder_dir, text_file, tmp_path, capsys, monkeypatch):
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(real(path).total, real(path).total - 4096, 4096))
    code, _, err = run_cli(_args(ladder_dir, text_file, tmp_path / "out"), capsys, monkeypatch)
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and "not enough free space for OUT and the run folder" in errors[0], err
    assert "Traceback" not in err
    assert sorted(path.name for path in tmp_path.iterdir()) == []  # neither OUT nor a run folder


def test_a_save_that_meets_a_full_disk_keeps_the_previous_one_and_the_resume_ends_bit_identical(
        ladder_dir, text_file, tmp_path, capsys, monkeypatch):
    code, _, err = run_cli(_args(ladder_dir, text_file, tmp_path / "whole"), capsys, monkeypatch)
    assert code == 0, err
    real_save = dcp.save
    monkeypatch.setattr(dcp, "save", _full_at(3, real_save))
    code, _, err = run_cli(_args(ladder_dir, text_file, tmp_path / "cut"), capsys, monkeypatch)
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and "disk full while writing the training state" in errors[0], err
    assert "the previous save is kept" in errors[0] and "Traceback" not in err
    run = tmp_path / "cut.adapt-run"
    assert not (tmp_path / "cut").exists() and not list(run.rglob(".state.tmp"))
    monkeypatch.setattr(dcp, "save", real_save)
    code, out, err = run_cli(_args(ladder_dir, text_file, tmp_path / "cut", "--resume"), capsys, monkeypatch)
    assert code == 0, err
    assert "resumed from step 2" in out + err
    assert (tmp_path / "cut" / "model.safetensors").read_bytes() == (tmp_path / "whole" / "model.safetensors").read_bytes()


def test_a_sequential_layer_save_that_meets_a_full_disk_is_one_line_and_the_resume_goes_on(
        ladder_dir, text_file, tmp_path, capsys, monkeypatch):
    """The sequential stage's layer files meet the same rule: one line, the layers saved before kept, and
    ``--resume`` ends byte-identical to an uninterrupted run."""
    from ladderize.adapt.sequential import sequential_run

    args = ["adapt", ladder_dir, None, "--data", text_file, "--stage", "seq-local:tokens=256,epochs=1", "--seq-len",
            "32", "--batch-size", "2", "--device", "cpu", "--dtype", "float32", "--no-compile"]

    def run(out, *extra):
        return run_cli([tmp_path / out if item is None else item for item in args] + list(extra), capsys, monkeypatch)

    code, _, err = run("whole")
    assert code == 0, err
    real = sequential_run.save_safetensors
    monkeypatch.setattr(sequential_run, "save_safetensors", _full_at(2, real))
    code, _, err = run("cut")
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and "disk full while writing the training state" in errors[0], err
    assert "the layers saved before it are kept" in errors[0] and "Traceback" not in err
    monkeypatch.setattr(sequential_run, "save_safetensors", real)
    code, _, err = run("cut", "--resume")
    assert code == 0, err
    assert (tmp_path / "cut" / "model.safetensors").read_bytes() == (tmp_path / "whole" / "model.safetensors").read_bytes()
