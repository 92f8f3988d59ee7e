"""Wording a new user tripped on (issue 37 item 15)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from tests.cli_helpers import error_lines, run_cli


def test_unsupported_architecture_says_it_once(tmp_path: Path, capsys, monkeypatch) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))
    code, _, err = run_cli(["inspect", tmp_path / "m"], capsys, monkeypatch)
    line = error_lines(err)[0]
    assert code == 2 and "unsupported architecture 'GPT2LMHeadModel'" in line and "is not supported" not in line


def test_bench_without_a_model_does_not_say_not_both(capsys, monkeypatch) -> None:
    code, _, err = run_cli(["bench"], capsys, monkeypatch)
    assert code == 2 and error_lines(err) == ["error: give a checkpoint directory or --synthetic SHAPE"]
    code, _, err = run_cli(["bench", "ckpt", "--synthetic", "tiny"], capsys, monkeypatch)
    assert code == 2 and error_lines(err) == ["error: give a checkpoint directory or --synthetic SHAPE, not both"]


def test_convert_spd_tp_help_does_not_offer_1(capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "300")
    code, out, _ = run_cli(["convert", "--help"], capsys, monkeypatch)
    assert code == 0 and "else 1" not in out and "2 or more" in out


def test_sequential_summary_names_the_last_layers_loss() -> None:
    from ladderize.cli.render import adapt_summary

    result = SimpleNamespace(curve=[{"step": 64, "layer": 29, "loss_total": 44.5}], calibration_tokens=16384, steps=64,
                             tokens=32768, train_s=120.0, out="OUT", state_dir=None)
    line = adapt_summary(result)[0]
    assert "last layer (29) final step loss 44.5000" in line and "; final loss" not in line


def test_table_titles_keep_a_long_checkpoint_path_on_one_line(tmp_path: Path) -> None:
    """Issue 37 item 13: a table title wrapped the checkpoint path mid-word at the (narrow) table's width."""
    import io

    from rich.console import Console

    from ladderize.cli.render import inspection
    from tests.runtime.runtime_helpers import TINY_TP23, save_tiny

    path = tmp_path / "a-rather-long-checkpoint-folder-name-ladder"
    save_tiny(path, **TINY_TP23)
    console = Console(width=len(str(path.absolute())) + 10, file=io.StringIO(), record=True)  # wider than the path
    table, _ = inspection(path)
    console.print(table)
    assert str(path.absolute()) in console.export_text().splitlines()[0]


def test_a_resumed_runs_last_line_says_which_time_is_whose() -> None:
    """The wall time is this command's; the training time, after a resume, the run's over every attempt."""
    from ladderize.cli.render import adapt_summary

    common = dict(curve=[{"step": 9, "loss_total": 1.5}], calibration_tokens=None, steps=9, tokens=900, train_s=1086.0,
                  out="OUT", state_dir=None, wall_s=372.0)
    fresh = adapt_summary(SimpleNamespace(**common, resumed_from_step=0))[0]
    assert "6.2 min wall time (18.1 min training);" in fresh, fresh
    resumed = adapt_summary(SimpleNamespace(**common, resumed_from_step=4))[0]
    assert "6.2 min wall time this attempt (18.1 min training over every attempt);" in resumed, resumed
