"""`ladderize demo --quick` end to end on the real SmolLM2-135M (slow: a few minutes on 2 cores)."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# the heartbeat's interval here, and the log's longest silence allowed: the default 15 s promises no silence over
# 20 s; 5 s here, so that the demo's quiet phases (a compile, the states cached before a layer, 10-20 s) fail without it
HEARTBEAT_S, MOST_QUIET_S = 5, 12.0


def run_timestamped(command: list[str], cwd: Path) -> tuple[int, list[tuple[float, str]]]:
    """Run ``command`` as a log would see it (stdout and stderr on one pipe, no terminal); each line with the
    seconds since the start at which it arrived, the process's start and end included as lines of their own."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
               PYTHONUNBUFFERED="1", LADDERIZE_PROGRESS_INTERVAL=str(HEARTBEAT_S))
    started = time.monotonic()
    lines = [(0.0, "<start>")]
    with subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as process:
        for line in process.stdout:
            lines.append((time.monotonic() - started, line.rstrip("\n")))
    lines.append((time.monotonic() - started, "<end>"))
    return process.returncode, lines


@pytest.mark.slow
def test_demo_quick_end_to_end(tmp_path: Path, monkeypatch, capsys):
    from ladderize import cli

    # as on a fresh clone: no runs/ folder, the default --out; in a log, never quiet for more than 20 s
    code, lines = run_timestamped([sys.executable, "-m", "ladderize.cli", "demo", "--quick"], cwd=tmp_path)
    text = "\n".join(line for _, line in lines)
    assert code == 0, text[-3000:]
    out = tmp_path / "runs" / "demo"
    assert f"report: {out / 'report' / 'report.md'}" in text.replace("\n", "")
    gaps = [(after - before, line) for (before, _), (after, line) in zip(lines, lines[1:])]
    longest = max(gaps)
    assert longest[0] <= MOST_QUIET_S, f"{longest[0]:.1f} s without a line before {longest[1]!r}"
    print("longest silence", longest)

    for name in ("ladder", "spd", "ladder-adapted", "spd-adapted"):
        assert (out / "checkpoints" / name / "ladderize.json").is_file()
    for name in ("dense", "ladder", "spd", "ladder-adapted", "spd-adapted"):
        record = json.loads((out / "eval" / f"{name}.json").read_text())
        assert record["results"]["shakespeare"]["word_perplexity,none"] > 1
    assert "adapt" in json.loads((out / "eval" / "spd-adapted.json").read_text())["history"]
    bench = json.loads((out / "bench" / "spd.json").read_text())
    assert {row["schedule"] for row in bench["rows"]} == {"native", "dense"} and bench["rows"][0]["tp"] == 3

    with (out / "report" / "report.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [r["layout"] for r in rows][0] == "dense" and len(rows) == 5
    assert all(float(r["decode_speedup_vs_dense/tp3/batch1"]) > 0 for r in rows)
    assert (out / "report" / "accuracy_vs_speedup.png").stat().st_size > 0
    markdown = (out / "report" / "report.md").read_text()
    assert "spd@tp3" in markdown and "ladder 22:30, adapted" in markdown

    # a second run resumes: every step is skipped, the report is rewritten (--out given: its folder exists)
    monkeypatch.setattr(sys, "argv", ["ladderize", "demo", "--quick", "--out", str(out)])
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    captured = capsys.readouterr()
    assert exit_info.value.code == 0
    assert "start eval" not in captured.err and "start adapt" not in captured.err and "skip bench spd" in captured.err

    # the same folder with other settings is refused with one line
    monkeypatch.setattr(sys, "argv", ["ladderize", "demo", "--out", str(out)])
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    assert exit_info.value.code == 2
    assert "holds a demo run with other settings" in capsys.readouterr().err


def test_demo_refuses_a_given_out_whose_folder_is_missing(tmp_path: Path, monkeypatch, capsys):
    """Only the default ``runs/demo`` has its folder made; a mistyped ``--out`` is one line, and nothing is made."""
    from ladderize import cli

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["ladderize", "demo", "--quick", "--out", "elsewhere/demo"])
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    assert exit_info.value.code == 2
    assert "folder" in capsys.readouterr().err and not (tmp_path / "elsewhere").exists()
    assert not (tmp_path / "runs").exists()
