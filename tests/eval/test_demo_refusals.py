"""``ladderize demo`` checks every step's constraints before its first step (issue 37 item 8)."""

from __future__ import annotations

from pathlib import Path

from tests.cli_helpers import error_lines, run_cli


def test_demo_dtype_float16_is_refused_before_the_first_step(tmp_path: Path, capsys, monkeypatch) -> None:
    def no_pull(*_args, **_kwargs):
        raise AssertionError("the demo pulled before refusing --dtype float16")

    monkeypatch.setattr("ladderize.convert.pull.pull_model", no_pull)
    out = tmp_path / "demo"
    code, _, err = run_cli(["demo", "--quick", "--out", out, "--dtype", "float16"], capsys, monkeypatch)
    lines = [line for line in error_lines(err) if "note" not in line]
    assert code == 2 and len(lines) == 1 and "float32 or bfloat16" in lines[0], err
    assert not out.exists()
