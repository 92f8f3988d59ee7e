"""The report plot (panels, short names, log axis, error bars, title) and the bench spread in rows and table."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from ladderize.records import BenchRecord, BenchRow, EvalRecord, SpeedupSpread
from ladderize.report import write_report
from ladderize.report.plot import short_names, spans_a_decade
from ladderize.runtime.bench import add_comparisons

SPD = "spd@tp3 5:6,7:9,17:18,21:23,25:26,27:28"


def _eval(ckpt: str, layout: str, converted: int, word_ppl: float, acc: float | None = None, history=("convert",)) -> dict:
    results = {"shakespeare": {"alias": "shakespeare", "word_perplexity,none": word_ppl, "word_perplexity_stderr,none": "N/A"}}
    if acc is not None:
        results["lambada_openai"] = {"acc,none": acc, "acc_stderr,none": 0.02, "perplexity,none": 60.0, "perplexity_stderr,none": 9.0}
    return EvalRecord(checkpoint=ckpt, layout=layout, layout_ranges={}, num_layers=30, layers_converted=converted,
                      allreduces_per_decode_step=60, overlappable_allreduces_per_decode_step=0, history=list(history),
                      lm_eval={"higher_is_better": {"shakespeare": {"word_perplexity": False}, "lambada_openai": {"acc": True}}},
                      results=results).to_json()


def _rows(layout: str, per_token: dict[tuple[int, int], tuple[list[float], list[float]]]) -> list[BenchRow]:
    """Bench rows as ``run_bench`` makes them: per (tp, batch), the dense and native decode time per token of each round."""
    rows = []
    for (tp, batch), (dense_runs, native_runs) in per_token.items():
        for schedule, runs in (("dense", dense_runs), ("native", native_runs)):
            median = sorted(runs)[len(runs) // 2]
            row = BenchRow(schedule=schedule, layout="dense" if schedule == "dense" else layout, tp=tp, batch=batch,
                           prompt_len=64, decode_steps=16, prefill_s=0.05, decode_s_per_token=median,
                           allreduces_per_decode_step=60)
            row.set_decode_runs(runs)
            rows.append(row)
    add_comparisons(rows)
    return rows


def _bench(model: str, layout: str, rows: list[BenchRow]) -> dict:
    return BenchRecord(model, layout, rows).to_json()


def test_bench_rows_carry_min_median_max_and_round_speedups():
    rows = _rows("ladder 22:30", {(3, 1): ([0.030, 0.020, 0.024], [0.024, 0.020, 0.020])})
    native = next(r for r in rows if r.schedule == "native")
    assert native.decode_s_per_token_min == 0.020 and native.decode_s_per_token_max == 0.024
    assert native.decode_s_per_token_median == 0.020
    assert native.decode_tokens_per_s_min == pytest.approx(1 / 0.024) and native.decode_tokens_per_s_max == pytest.approx(50.0)
    assert native.decode_speedup_vs_dense_min == pytest.approx(1.0) and native.decode_speedup_vs_dense_max == pytest.approx(1.25)
    assert native.decode_speedup_vs_dense_stderr > 0
    assert SpeedupSpread.of([1.0], [1.0, 2.0]) is None  # rounds must pair up


def test_short_names_and_decade():
    from ladderize.report.collect import LayoutRun

    runs = [LayoutRun("a", "dense"), LayoutRun("b", "ladder 22:30"), LayoutRun("c", "ladder 15:30"),
            LayoutRun("d", "ladder 22:30", adapted=True), LayoutRun("e", f"ladder 22:30 + {SPD}")]
    assert short_names(runs) == {"dense": "dense", "ladder 22:30": "ladder #1", "ladder 15:30": "ladder #2",
                                 "ladder 22:30, adapted": "ladder #1, adapted", f"ladder 22:30 + {SPD}": "ladder+spd@tp3"}
    assert spans_a_decade([50.0, 600.0]) and not spans_a_decade([50.0, 400.0])


@pytest.fixture
def demo_like(tmp_path: Path) -> Path:
    folder = tmp_path / "runs"
    folder.mkdir()
    timings = {"ladder": {(3, 1): ([0.030, 0.031, 0.033], [0.028, 0.030, 0.031]), (3, 4): ([0.040, 0.041, 0.045], [0.040, 0.040, 0.044])},
               "spd": {(3, 1): ([0.030, 0.032, 0.031], [0.026, 0.028, 0.027]), (3, 4): ([0.040, 0.042, 0.041], [0.039, 0.040, 0.041])}}
    files = {
        "dense.json": _eval("/x/smollm2-135m", "dense", 0, 508.2),
        "ladder.json": _eval("/x/ladder", "ladder 22:30", 8, 5352.1),
        "ladder-adapted.json": _eval("/x/ladder-adapted", "ladder 22:30", 8, 596.6, history=("convert", "adapt")),
        "spd.json": _eval("/x/spd", SPD, 8, 607.8),
        "spd-adapted.json": _eval("/x/spd-adapted", SPD, 8, 531.7, history=("convert", "adapt")),
        "bench-ladder.json": _bench("/x/ladder", "ladder 22:30", _rows("ladder 22:30", timings["ladder"])),
        "bench-spd.json": _bench("/x/spd", SPD, _rows(SPD, timings["spd"])),
    }
    for name, record in files.items():
        (folder / name).write_text(json.dumps(record))
    return folder


def test_report_plot_has_a_panel_per_config_log_axis_title_and_spread(demo_like: Path, tmp_path: Path):
    written = write_report([demo_like], tmp_path / "report")
    plot = written["plot"]
    assert [panel["config"] for panel in plot["panels"]] == [(3, 1), (3, 4)]
    assert plot["log_y"]  # 508 to 5,352: more than a decade
    assert plot["title"] == "smollm2-135m: shakespeare word ppl vs decode speed-up, TP=3"
    assert plot["short_names"][SPD] == "spd@tp3" and plot["short_names"]["ladder 22:30, adapted"] == "ladder, adapted"
    png = written["png"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from PIL import Image

    width, height = Image.open(png).size
    assert width > height > 300  # two panels side by side and the legend below
    markdown = written["markdown"].read_text()
    ladder_row = next(line for line in markdown.splitlines() if line.startswith("| ladder 22:30 |"))
    # ladder at TP3 b1: rounds 0.030/0.028, 0.031/0.030, 0.033/0.031 -> speed-ups 1.071, 1.033, 1.065: the headline
    # is their median 1.06 (not the ratio of the median times, 0.031/0.030 = 1.03), the brackets their min and max
    assert "1.06x (1.03–1.07)" in ladder_row
    rows = list(csv.DictReader(written["csv"].open()))
    assert float(rows[1]["decode_speedup_vs_dense/tp3/batch1/max"]) == pytest.approx(0.030 / 0.028, rel=1e-5)


def test_report_plot_error_bars_from_lm_eval_stderr(tmp_path: Path):
    folder = tmp_path / "runs"
    folder.mkdir()
    (folder / "dense.json").write_text(json.dumps(_eval("/x/dense", "dense", 0, 500.0, acc=0.40)))
    (folder / "ladder.json").write_text(json.dumps(_eval("/x/ladder", "ladder 22:30", 8, 600.0, acc=0.35)))
    rows = _rows("ladder 22:30", {(2, 1): ([0.03, 0.03], [0.025, 0.027])})
    (folder / "bench.json").write_text(json.dumps(_bench("/x/ladder", "ladder 22:30", rows)))
    written = write_report([folder], tmp_path / "report")
    report = written["report"]
    ladder = next(r for r in report.runs if r.layout == "ladder 22:30")
    acc = next(m for m in ladder.metrics if m.name == "acc")
    assert ladder.metric_stderr[acc] == 0.02
    assert ladder.decode_speedup[(2, 1)].stderr > 0
    assert written["plot"]["y_label"] == "lambada_openai acc" and not written["plot"]["log_y"]
    assert written["plot"]["title"] == "dense: lambada_openai acc vs decode speed-up, TP=2"


def test_report_plot_error_bars_stay_inside_the_axes(tmp_path: Path):
    """Issue 26 item 11: the x limits came from the points alone, so wide speed-up spreads ran off the panel."""
    folder = tmp_path / "runs"
    folder.mkdir()
    (folder / "dense.json").write_text(json.dumps(_eval("/x/dense", "dense", 0, 500.0, acc=0.40)))
    (folder / "ladder.json").write_text(json.dumps(_eval("/x/ladder", "ladder 22:30", 8, 600.0, acc=0.35)))
    # rounds of very different speed: a speed-up stderr far wider than the 12% padding around the points
    rows = _rows("ladder 22:30", {(2, 1): ([0.03, 0.03, 0.03], [0.010, 0.030, 0.090])})
    (folder / "bench.json").write_text(json.dumps(_bench("/x/ladder", "ladder 22:30", rows)))
    written = write_report([folder], tmp_path / "report")
    ladder = next(r for r in written["report"].runs if r.layout == "ladder 22:30")
    acc = next(m for m in ladder.metrics if m.name == "acc")
    (panel,) = written["plot"]["panels"]
    (x_low, x_high), (y_low, y_high) = panel["xlim"], panel["ylim"]
    for point in panel["points"]:
        run = next(r for r in written["report"].runs if r.label == point["layout"])
        xerr = run.decode_speedup[(2, 1)].stderr or 0.0
        yerr = run.metric_stderr.get(acc, 0.0)
        assert x_low <= point["decode_speedup"] - xerr and point["decode_speedup"] + xerr <= x_high, (point, xerr, panel["xlim"])
        assert y_low <= point["quality"] - yerr and point["quality"] + yerr <= y_high, (point, yerr, panel["ylim"])
    assert ladder.decode_speedup[(2, 1)].stderr > 0.3  # the case above is a real one


def test_a_bench_without_an_eval_fills_layers_and_allreduces_from_its_layout(tmp_path: Path):
    """Issue 26 item 11: a zero-shot checkpoint's bench row showed '–' for layers converted and all-reduces."""
    folder = tmp_path / "runs"
    folder.mkdir()
    (folder / "dense.json").write_text(json.dumps(_eval("/x/dense", "dense", 0, 500.0, acc=0.40)))
    rows = _rows(SPD, {(3, 1): ([0.03, 0.03], [0.025, 0.027])})
    for row in rows:
        if row.schedule == "native":
            row.overlapped_allreduces_per_decode_step = 0
            row.allreduces_per_decode_step = 52
    old = _bench("/x/spd-zero-shot", SPD, rows)  # a record from before the layout's counts were in its meta
    (folder / "bench-old.json").write_text(json.dumps(old))
    written = write_report([folder], tmp_path / "report")
    run = next(r for r in written["report"].runs if r.layout == SPD)
    assert (run.layers_converted, run.allreduces_per_decode_step) == (8, 52)
    line = next(l for l in written["markdown"].read_text().splitlines() if l.startswith(f"| {SPD} |"))
    assert line.split("|")[2].strip() == "8" and line.split("|")[3].strip() == "52"

    new = dict(old, meta={"num_layers": 30, "layers_converted": 8, "allreduces_per_token": {"total": 52, "overlappable": 0}})
    (folder / "bench-old.json").write_text(json.dumps(new))
    run = next(r for r in write_report([folder], tmp_path / "report2")["report"].runs if r.layout == SPD)
    assert (run.layers_converted, run.num_layers, run.allreduces_per_decode_step) == (8, 30, 52)


def test_described_layers_reads_layout_descriptions():
    from ladderize.model.layout import Layout, described_layers

    layout = Layout.from_ranges(30, ladder="22:30", spd="0:4,10", spd_tp_size=3)
    assert described_layers(layout.describe()) == {"ladder": list(range(22, 30)), "spd": [0, 1, 2, 3, 10]}
    assert described_layers("dense") == {} and described_layers("something else") is None


def test_log_axis_labels_only_1_2_5_per_decade(demo_like: Path, tmp_path: Path):
    """Issue 37 item 15: on the log axis every minor tick had a label, and they overlapped."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    from matplotlib import pyplot as plt

    created = []
    real = plt.subplots
    monkey = pytest.MonkeyPatch()
    monkey.setattr(plt, "subplots", lambda *a, **k: created.append(real(*a, **k)) or created[-1])
    try:
        written = write_report([demo_like], tmp_path / "report")
    finally:
        monkey.undo()
    assert written["plot"]["log_y"]
    axis = created[-1][1].flat[0].yaxis
    assert not [t for t in axis.get_minorticklabels() if t.get_text()]
    labels = [t.get_text() for t in axis.get_majorticklabels() if t.get_text()]
    assert labels and all(label.replace(",", "").lstrip("0.")[:1] in "125" for label in labels), labels
