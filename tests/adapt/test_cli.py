"""The adapt, sensitivity and convert --spd auto / --head-grouping commands, end to end on tiny checkpoints."""

from __future__ import annotations

import json

from ladderize.checkpoint.io import load_model, read_provenance
from tests.cli_helpers import error_lines, run_cli


def test_adapt_command_and_resume(ladder_dir, text_file, tmp_path, capsys, monkeypatch):
    out = tmp_path / "adapted"
    args = ["adapt", ladder_dir, out, "--data", text_file, "--objective", "local", "--tokens", 256, "--seq-len", 32, "--batch-size", 2]
    code, stdout, stderr = run_cli(args, capsys, monkeypatch)
    assert code == 0, stderr
    assert "adapted 4 steps, 256 tokens" in stdout
    assert json.loads((out / "adapt_curve.json").read_text())[-1]["tokens"] == 256
    code, _, stderr = run_cli(args, capsys, monkeypatch)
    assert code == 2 and len(error_lines(stderr)) == 1 and "already exists" in stderr


def test_adapt_command_bad_data(ladder_dir, tmp_path, capsys, monkeypatch):
    (tmp_path / "empty.jsonl").write_text("")
    code, _, stderr = run_cli(["adapt", ladder_dir, tmp_path / "o", "--data", tmp_path / "empty.jsonl"], capsys, monkeypatch)
    assert code == 2 and len(error_lines(stderr)) == 1 and "empty" in stderr


def test_sensitivity_then_auto_convert(dense_dir, text_file, tmp_path, capsys, monkeypatch):
    report = tmp_path / "sens.json"
    code, stdout, stderr = run_cli(["sensitivity", dense_dir, "--spd-tp", 3, "--data", text_file, "--samples", 2, "--seq-len", 32, "--json", report], capsys, monkeypatch)
    assert code == 0, stderr
    ranking = json.loads(report.read_text())["ranking"]
    assert sorted(ranking) == [0, 1, 2, 3]
    out = tmp_path / "auto"
    code, _, stderr = run_cli(["convert", dense_dir, out, "--spd", "auto", "--spd-budget", 2, "--sensitivity", report, "--head-grouping"], capsys, monkeypatch)
    assert code == 0, stderr
    model = load_model(out)
    assert model.layout.layers(model.layout.modes[ranking[0]]) == sorted(ranking[:2])
    assert model.layout.spd_tp_size == 3 and model.layout.spd_head_order is not None
    assert read_provenance(out)["history"][-1]["step"] == "head_grouping"
    code, _, stderr = run_cli(["convert", dense_dir, tmp_path / "x", "--spd", "auto", "--sensitivity", report], capsys, monkeypatch)
    assert code == 2 and "--spd-budget" in stderr


def test_adapt_command_sequential_and_its_refusal(ladder_dir, text_file, tmp_path, capsys, monkeypatch):
    out = tmp_path / "seq"
    args = ["adapt", ladder_dir, out, "--data", text_file, "--local-schedule", "sequential", "--epochs", 1,
            "--tokens", 128, "--seq-len", 32, "--batch-size", 2]
    code, stdout, stderr = run_cli(args, capsys, monkeypatch)
    assert code == 0, stderr
    assert "adapted 4 steps" in stdout  # 4 sequences, 1 epoch, batch 2: 2 steps per ladder layer (2 and 3)
    assert read_provenance(out)["history"][-1]["local_schedule"] == "sequential"
    code, _, stderr = run_cli([*args[:2], tmp_path / "o2", *args[3:], "--objective", "kd"], capsys, monkeypatch)
    assert code == 2 and len(error_lines(stderr)) == 1 and "local objective alone" in stderr
