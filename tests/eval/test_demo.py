"""`ladderize demo --quick` end to end on the real SmolLM2-135M (slow: a few minutes on 2 cores)."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
def test_demo_quick_end_to_end(tmp_path: Path, monkeypatch, capsys):
    from ladderize import cli

    out = tmp_path / "demo"
    monkeypatch.setattr(sys, "argv", ["ladderize", "demo", "--quick", "--out", str(out)])
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    captured = capsys.readouterr()
    assert exit_info.value.code == 0, captured.err[-3000:]
    assert f"report: {out / 'report' / 'report.md'}" in captured.out.replace("\n", "")

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

    # a second run resumes: every step is skipped, the report is rewritten
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
