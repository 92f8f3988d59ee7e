"""Report rendering from fixture eval and bench JSON: table, CSV, PNG, Pareto front."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from ladderize.errors import LadderizeError
from ladderize.report import build_report, write_report
from ladderize.report.plot import pareto_front


def _eval(ckpt: str, layout: str, converted: int, allreduces: int, overlappable: int, acc: float, ppl: float, word_ppl: float, history=("convert",)):
    return {
        "kind": "ladderize-eval",
        "checkpoint": ckpt,
        "layout": layout,
        "num_layers": 30,
        "layers_converted": converted,
        "allreduces_per_token": {"total": allreduces, "overlappable": overlappable},
        "history": list(history),
        "lm_eval": {"higher_is_better": {"lambada_openai": {"acc": True, "perplexity": False}, "shakespeare": {"word_perplexity": False}}},
        "results": {
            "lambada_openai": {"alias": "lambada_openai", "acc,none": acc, "acc_stderr,none": 0.01, "perplexity,none": ppl, "perplexity_stderr,none": 1.0},
            "shakespeare": {"alias": "shakespeare", "word_perplexity,none": word_ppl, "word_perplexity_stderr,none": "N/A", "bits_per_byte,none": 1.2},
        },
    }


def _bench(ckpt: str, layout: str, native_tps: dict, dense_tps: dict):
    """The format of ``ladderize bench --json`` (meta + rows, speedup_vs_dense per row)."""
    rows = []
    for (tp, batch), tps in native_tps.items():
        speedup = tps / dense_tps[(tp, batch)] if (tp, batch) in dense_tps else None
        rows.append({"schedule": "native", "tp": tp, "batch": batch, "prompt_len": 128, "gen_len": 32, "prefill_s": 0.1,
                     "decode_s_per_token": 1 / tps, "tokens_per_s": tps, "allreduce_count": 60, "allreduce_share": 0.5,
                     "layout": layout, "speedup_vs_dense": speedup})
    for (tp, batch), tps in dense_tps.items():
        rows.append({"schedule": "dense", "tp": tp, "batch": batch, "prompt_len": 128, "gen_len": 32, "tokens_per_s": tps,
                     "layout": "dense", "speedup_vs_dense": 1.0})
    rows.append({"schedule": "upper-bound", "tp": 3, "batch": 1, "prompt_len": 128, "gen_len": 32, "tokens_per_s": 999.0,
                 "layout": "dense", "speedup_vs_dense": 99.0})
    return {"meta": {"model": ckpt, "layout": layout}, "rows": rows}


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    folder = tmp_path / "runs"
    folder.mkdir()
    files = {
        "eval-dense.json": _eval("/m/dense", "dense", 0, 60, 0, 0.40, 20.0, 50.0),
        "eval-ladder.json": _eval("/m/ladder", "ladder 22:30", 8, 60, 16, 0.30, 35.0, 80.0),
        "eval-ladder-adapted.json": _eval("/m/ladder-adapted", "ladder 22:30", 8, 60, 16, 0.36, 24.0, 60.0, ("convert", "adapt")),
        "eval-spd.json": _eval("/m/spd", "spd@tp3 22:30", 8, 52, 0, 0.38, 22.0, 55.0),
        "bench-dense.json": _bench("/m/dense", "dense", {(3, 1): 10.0, (3, 4): 30.0}, {(3, 1): 10.0, (3, 4): 30.0}),
        "bench-ladder.json": _bench("/m/ladder", "ladder 22:30", {(3, 1): 12.0, (3, 4): 33.0}, {(3, 1): 10.0, (3, 4): 30.0}),
        # a leaner bench record: no meta, no dense rows, no speed-up; the dense layout's bench is the reference
        "bench-spd.json": {"checkpoint": "/m/spd", "rows": [
            {k: v for k, v in r.items() if k != "speedup_vs_dense"}
            for r in _bench("/m/spd", "spd@tp3 22:30", {(3, 1): 11.0, (3, 4): 36.0}, {})["rows"] if r["schedule"] == "native"]},
        "notes.json": {"unrelated": True},
    }
    for name, record in files.items():
        (folder / name).write_text(json.dumps(record))
    return folder


def test_report_joins_eval_and_bench(runs: Path):
    report = build_report([runs])
    labels = [r.label for r in report.runs]
    assert labels == ["dense", "ladder 22:30", "ladder 22:30, adapted", "spd@tp3 22:30"]
    assert report.configs == [(3, 1), (3, 4)]
    by = {r.label: r for r in report.runs}
    assert by["dense"].speedups == {(3, 1): 1.0, (3, 4): 1.0}
    assert by["ladder 22:30"].speedups == pytest.approx({(3, 1): 1.2, (3, 4): 1.1})
    assert by["spd@tp3 22:30"].speedups == pytest.approx({(3, 1): 1.1, (3, 4): 1.2})
    # the adapted checkpoint has no bench of its own: it shares its layout's speed
    assert by["ladder 22:30, adapted"].speedups == by["ladder 22:30"].speedups
    acc = next(m for m in report.metrics if m.name == "acc")
    assert report.delta(by["ladder 22:30"], acc) == pytest.approx(-0.10)
    assert report.delta(by["dense"], acc) == 0.0
    cols = report.columns()
    assert cols[:3] == ["layout", "layers converted", "all-reduces / token"]
    assert "Δ lambada_openai acc" in cols and "speed-up TP3 b4" in cols
    assert [m.label for m in report.metrics] == ["lambada_openai acc", "lambada_openai ppl", "shakespeare word ppl"]


def test_report_files(runs: Path, tmp_path: Path):
    out = tmp_path / "report"
    written = write_report([runs], out)
    markdown = written["markdown"].read_text()
    assert "| ladder 22:30, adapted | 8/30 | 60 (16 overlapped) |" in markdown
    assert "1.20x" in markdown and "-0.1000" in markdown
    with written["csv"].open() as handle:
        rows = list(csv.DictReader(handle))
    assert [r["layout"] for r in rows][0] == "dense"
    assert float(rows[1]["speedup_vs_dense/tp3/batch1"]) == pytest.approx(1.2)
    assert float(rows[1]["lambada_openai/acc/delta_vs_dense"]) == pytest.approx(-0.1)
    png = written["png"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    # TP3 batch 4 and TP3 batch 1 cover all layouts; the larger TP and then the smaller batch wins
    assert written["plot"]["config"] == (3, 1)
    assert written["plot"]["front"] == ["dense", "spd@tp3 22:30", "ladder 22:30, adapted"]  # zero-shot ladder is dominated


def test_pareto_front():
    points = [(1.0, 0.40), (1.2, 0.30), (1.2, 0.36), (1.1, 0.38), (0.9, 0.39)]
    assert pareto_front(points) == [0, 3, 2]
    assert pareto_front([(1.0, 20.0), (1.2, 24.0), (1.1, 30.0)], higher_is_better=False) == [0, 1]


def test_report_without_bench_still_writes_png(tmp_path: Path):
    path = tmp_path / "e.json"
    path.write_text(json.dumps(_eval("/m/dense", "dense", 0, 60, 0, 0.4, 20.0, 50.0)))
    written = write_report([path], tmp_path / "out")
    assert written["png"].stat().st_size > 0
    assert "No bench run" in written["markdown"].read_text()


def test_report_bad_input(tmp_path: Path):
    with pytest.raises(LadderizeError, match="does not exist"):
        build_report([tmp_path / "missing.json"])
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(LadderizeError, match="not valid JSON"):
        build_report([bad])
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"a": 1}))
    with pytest.raises(LadderizeError, match="neither an eval record"):
        build_report([other])
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(LadderizeError, match="no eval or bench JSON"):
        build_report([empty])
