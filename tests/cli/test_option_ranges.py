"""Every numeric option's range is checked as it is parsed (issue 37 items 10 and 11): one line, exit 2, no traceback."""

from __future__ import annotations

import pytest

from ladderize.cli import app
from ladderize.cli.options import numeric_options, option_range
from tests.cli_helpers import error_lines, run_cli


def test_every_numeric_option_has_a_range() -> None:
    missing = [f"{command} {flag}" for command, flag, _ in numeric_options(app) if option_range(command, flag) is None]
    assert missing == [], f"give these options a range in ladderize/cli/options.py NUMBER_RANGES: {missing}"
    assert len(numeric_options(app)) > 30  # the walk finds the commands' options (Optional[int] included)


@pytest.mark.parametrize(
    "args,message",
    [
        (["sensitivity", "M", "--spd-tp", "3", "--json", "s.json", "--samples", "0"], "--samples must be at least 1, got 0"),
        (["sensitivity", "M", "--spd-tp", "3", "--json", "s.json", "--samples", "-1"], "--samples must be at least 1, got -1"),
        (["sensitivity", "M", "--spd-tp", "3", "--json", "s.json", "--seq-len", "1"], "--seq-len must be at least 2, got 1"),
        (["bench", "--synthetic", "tiny", "--tp", "2", "--batch", "1", "--threads-per-rank", "-1"],
         "--threads-per-rank must be 0 or more, got -1"),
        (["bench", "--synthetic", "tiny", "--domino-chunks", "0"], "--domino-chunks must be at least 1, got 0"),
        (["eval", "M", "--tasks", "shakespeare", "--max-length", "0"], "--max-length must be at least 2, got 0"),
        (["eval", "M", "--tasks", "shakespeare", "--limit", "0"], "--limit must be positive, got 0.0"),
        (["generate", "M", "--prompt", "hi", "--top-p", "1.5"], "--top-p must be in (0, 1], got 1.5"),
        (["generate", "M", "--prompt", "hi", "--max-new-tokens", "0"], "--max-new-tokens must be at least 1, got 0"),
        (["sample", "M", "o.jsonl", "--temperature", "0"], "--temperature must be positive, got 0.0"),
        (["adapt", "M", "O", "--lr", "-1e-3"], "--lr must be positive, got -0.001"),
        (["convert", "M", "O", "--spd-budget", "0"], "--spd-budget must be positive, got 0.0"),
    ],
)
def test_out_of_range_is_one_line(args, message, capsys, monkeypatch) -> None:
    code, out, err = run_cli(args, capsys, monkeypatch)
    assert code == 2 and error_lines(err) == [f"error: {message}"], err
    assert out == ""


def test_in_range_values_pass(capsys, monkeypatch) -> None:
    """generate's greedy temperature 0 stays allowed (sample's rule is its own)."""
    code, _, err = run_cli(["generate", "no-such-dir", "--prompt", "hi", "--temperature", "0"], capsys, monkeypatch)
    assert code == 2 and "temperature" not in err and "no-such-dir" in err
