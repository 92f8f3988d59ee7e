"""The pipelines behind convert and adapt, called from Python, give what the commands give."""

from __future__ import annotations

import json

import torch

from ladderize.checkpoint.io import load_model
from tests.cli_helpers import run_cli


def test_convert_layout_equals_the_command(dense_dir, tmp_path, capsys, monkeypatch):
    from ladderize.convert.pipeline import convert_layout

    code, _, stderr = run_cli(["convert", dense_dir, tmp_path / "cli", "--ladder", "2:4", "--spd", "1", "--spd-tp", "3"],
                              capsys, monkeypatch)
    assert code == 0, stderr
    converted = convert_layout(str(dense_dir), tmp_path / "py", ranges={"ladder": "2:4", "spd": "1"}, spd_tp=3, device="cpu")
    assert converted.head_orders is None
    a, b = load_model(tmp_path / "cli"), load_model(converted.path)
    assert a.config.layer_modes == b.config.layer_modes and a.config.spd_tp_size == b.config.spd_tp_size == 3
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_adapt_checkpoint_equals_the_command(ladder_dir, text_file, tmp_path, capsys, monkeypatch):
    from ladderize.adapt.entrance import AdaptRequest, adapt_checkpoint

    args = ["--data", text_file, "--objective", "local", "--tokens", 128, "--seq-len", 32, "--batch-size", 2]
    code, stdout, stderr = run_cli(["adapt", ladder_dir, tmp_path / "cli", *args], capsys, monkeypatch)
    assert code == 0, stderr
    run = adapt_checkpoint(AdaptRequest.of(str(ladder_dir), str(tmp_path / "py"), data=str(text_file), seq_len=32,
                                        batch_size=2, objectives="local", tokens=128, device="cpu"))
    assert f"adapted {run.result.steps} steps, {run.result.tokens:,} tokens" in stdout
    curve = lambda path: [(r["step"], r["loss_total"]) for r in json.loads((path / "adapt_curve.json").read_text())]  # noqa: E731
    assert curve(tmp_path / "cli") == curve(tmp_path / "py")
