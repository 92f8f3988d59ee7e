"""``--help`` that helps: each command's options grouped by purpose in panels, each option's help one or two lines,
``adapt --help`` on one screen of 100 lines, and no word of the project's history in it."""

from __future__ import annotations

import re

import pytest

from tests.cli_helpers import run_cli

COMMANDS = ["convert", "pull", "inspect", "generate", "bench", "predict", "adapt", "tokenize", "sample", "sensitivity",
            "eval", "report", "demo"]
TAG = re.compile(r"(\[(default|required)[^\]]*\]\s*)+")  # Typer's own tags, on a line of their own when they wrap


def _help(command: str, columns: int, capsys, monkeypatch) -> str:
    monkeypatch.setenv("COLUMNS", str(columns))
    code, stdout, _ = run_cli([command, "--help"], capsys, monkeypatch)
    assert code == 0
    return stdout


def _options(text: str) -> dict[str, int]:
    """``--flag -> lines of its help`` (Typer's [default: ...] line not counted) of every option row in ``text``."""
    rows: dict[str, int] = {}
    current = None
    for line in text.splitlines():
        row = re.match(r"│ \*?\s{0,4}(--[\w-]+)", line)  # a row's flag stands at its start; a wrapped line is indented
        if row:
            current = row.group(1)
            rows[current] = 1
        elif not line.startswith("│"):
            current = None
        elif current and not TAG.fullmatch(line[1:-1].strip()):
            rows[current] += 1
    return rows


def test_adapt_help_fits_a_screen(capsys, monkeypatch):
    for columns in (80, 120):
        text = _help("adapt", columns, capsys, monkeypatch)
        assert len(text.splitlines()) <= 100, (columns, len(text.splitlines()))
    assert "Scale (multi-GPU)" in text
    scale = text[text.index("Scale (multi-GPU)"):]
    scale = scale[:scale.index("╰")]
    assert all(flag in scale for flag in ("--shard", "--save-minutes", "--activation-checkpointing", "--dry-run"))


@pytest.mark.parametrize("command", COMMANDS)
def test_options_sit_in_panels_and_say_it_in_two_lines(command, capsys, monkeypatch):
    text = _help(command, 100, capsys, monkeypatch)
    rows = _options(text)
    assert rows and "--help" in rows
    long = {flag: lines for flag, lines in rows.items() if lines > 2}
    assert not long, f"{command}: help over two lines at 100 columns: {long}"
    panels = re.findall(r"^╭─ (.+?) ─", text, flags=re.M)
    if len(rows) > 5:  # a command with more than a handful of options groups them
        assert len([p for p in panels if p != "Arguments"]) >= 2, (command, panels)
    assert panels.index("Options") == (1 if "Arguments" in panels else 0), panels  # the options most runs set first


def test_help_tells_no_history(capsys, monkeypatch):
    for command in ["--help"] + COMMANDS:
        monkeypatch.setenv("COLUMNS", "200")
        code, text, _ = run_cli([command] if command == "--help" else [command, "--help"], capsys, monkeypatch)
        assert code == 0
        assert not re.search(r"\bsessions?\b", text, flags=re.I), command
        assert not re.search(r"\b[0-9a-f]{7,40}\b", text), (command, re.search(r"\b[0-9a-f]{7,40}\b", text))


def test_top_level_help_says_where_to_start(capsys, monkeypatch):
    """``ladderize --help`` names the demo as the place to start and the workflow's order, and lists it first."""
    monkeypatch.setenv("COLUMNS", "200")
    code, stdout, _ = run_cli(["--help"], capsys, monkeypatch)
    assert code == 0
    text = " ".join(stdout.split())
    assert "Start with 'ladderize demo'" in text and "pull -> convert -> adapt -> eval -> bench" in text, text
    listed = re.findall(r"^│ (\w+) ", stdout, flags=re.M)
    assert listed[:6] == ["demo", "pull", "convert", "adapt", "eval", "bench"], listed
    assert sorted(listed) == sorted(COMMANDS), listed


def test_every_adapt_option_says_its_default(capsys, monkeypatch):
    """Each ``adapt`` option that takes a value shows its default (Typer's tag or its help's words); an on/off flag is
    off unless given, and the one that turns itself on says where."""
    import typer.main

    from ladderize.cli import app

    text = _help("adapt", 200, capsys, monkeypatch)
    rows: dict[str, str] = {}
    current = None
    for line in text.splitlines():
        row = re.match(r"│ \*?\s{0,4}(--[\w-]+)", line)
        current = row.group(1) if row else current if line.startswith("│") else None
        if current:
            rows[current] = rows.get(current, "") + " " + line.strip("│ ")
    command = typer.main.get_command(app).commands["adapt"]
    valued = [param.opts[0] for param in command.params
              if getattr(param, "opts", [""])[0].startswith("--") and not param.is_flag]
    assert {"--mixed-precision", "--grad-accum", "--local-inputs", "--train", "--seq-len"} <= set(valued)
    silent = [flag for flag in valued if "default" not in rows[flag].lower()]
    assert silent == [], f"adapt options whose help gives no default: {silent}"
    assert "on by itself where one sequence does not fit the GPU" in " ".join(rows["--activation-checkpointing"].split())
