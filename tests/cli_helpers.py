"""Run the real ``ladderize`` entry point in-process and capture its exit code and output."""

from __future__ import annotations

import sys

import pytest


def run_cli(args: list[str], capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> tuple[int, str, str]:
    from ladderize.cli import main

    monkeypatch.setattr(sys, "argv", ["ladderize", *map(str, args)])
    capsys.readouterr()  # drop whatever the test's own set-up printed
    code = 0
    try:
        main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip()]
