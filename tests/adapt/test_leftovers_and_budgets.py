"""adapt: the run state goes after a finished run (--keep-state keeps it), budgets are reported as trained, clear refusals."""

from __future__ import annotations

import json

from tests.adapt.conftest import convert
from tests.cli_helpers import error_lines, run_cli


def _error(stderr: str) -> str:
    """The one error line (a progress start line may come before it in a log)."""
    lines = [line for line in error_lines(stderr) if not line.endswith(": started")]
    assert len(lines) == 1 and lines[0].startswith("error:"), stderr
    return lines[0]

BASE = ["--objective", "local", "--seq-len", 32, "--batch-size", 2]


def test_finished_run_removes_its_state_unless_kept(ladder_dir, text_file, tmp_path, capsys, monkeypatch):
    out = tmp_path / "adapted"
    run_dir = tmp_path / "adapted.adapt-run"
    code, stdout, stderr = run_cli(["adapt", ladder_dir, out, "--data", text_file, "--tokens", 128, *BASE], capsys, monkeypatch)
    assert code == 0, stderr
    assert out.is_dir() and not run_dir.exists()
    assert "training state kept" not in stdout

    kept = tmp_path / "kept"
    code, stdout, stderr = run_cli(["adapt", ladder_dir, kept, "--data", text_file, "--tokens", 128, *BASE, "--keep-state"],
                                   capsys, monkeypatch)
    assert code == 0, stderr
    state = tmp_path / "kept.adapt-run" / "state"
    assert (state / "trainer_state.json").is_file()
    assert f"training state kept in {state}" in " ".join(stdout.split())


def test_token_budget_trains_what_it_says_or_names_the_rounding(ladder_dir, text_file, tmp_path, capsys, monkeypatch):
    out = tmp_path / "exact"
    code, stdout, stderr = run_cli(["adapt", ladder_dir, out, "--data", text_file, "--tokens", 128, *BASE], capsys, monkeypatch)
    assert code == 0, stderr
    assert "adapted 2 steps, 128 tokens trained" in stdout and "rounds up" not in stdout + stderr
    assert json.loads((out / "adapt_curve.json").read_text())[-1]["tokens"] == 128

    out = tmp_path / "rounded"
    code, stdout, stderr = run_cli(["adapt", ladder_dir, out, "--data", text_file, "--tokens", 100, *BASE], capsys, monkeypatch)
    assert code == 0, stderr
    text = " ".join((stdout + stderr).split())
    assert "--tokens 100 rounds up to 128: a step trains 2 sequence(s) x 32 tokens" in text
    assert "adapted 2 steps, 128 tokens trained" in text


def test_sequential_reports_calibration_and_trained_tokens(ladder_dir, text_file, tmp_path, capsys, monkeypatch):
    out = tmp_path / "sequential"
    args = ["adapt", ladder_dir, out, "--data", text_file, "--tokens", 128, *BASE, "--local-schedule", "sequential", "--epochs", 2]
    code, stdout, stderr = run_cli(args, capsys, monkeypatch)
    assert code == 0, stderr
    # 4 calibration sequences of 32, 2 epochs, batch 2: 4 steps per layer, 2 converted layers (2:4)
    assert "adapted 8 steps, 512 tokens trained (calibration set 128 tokens)" in " ".join(stdout.split())
    assert not (tmp_path / "sequential.adapt-run").exists()


def test_checkpoint_without_converted_layers_says_so(dense_dir, text_file, tmp_path, capsys, monkeypatch):
    plain = convert(dense_dir, tmp_path / "plain")  # converted format, every layer dense
    code, _, stderr = run_cli(["adapt", plain, tmp_path / "o", "--data", text_file, *BASE], capsys, monkeypatch)
    line = _error(stderr)
    assert code == 2 and "has no converted layers (all 4 are dense)" in line and "ladderize convert" in line


def test_a_text_file_is_not_a_checkpoint(text_file, tmp_path, capsys, monkeypatch):
    code, _, stderr = run_cli(["adapt", text_file, tmp_path / "o", *BASE], capsys, monkeypatch)
    line = _error(stderr)
    assert code == 2 and "is not a checkpoint" in line and "not found" not in line
    code, _, stderr = run_cli(["adapt", tmp_path / "missing", tmp_path / "o", *BASE], capsys, monkeypatch)
    assert code == 2 and "not found" in _error(stderr)
