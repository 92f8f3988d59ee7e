"""``ladderize report --metric/--task`` (the plot's quality axis, refused in one line when unknown) and the plot's label
placement (no label covers a point; an adapted triangle shows inside the zero-shot circle it coincides with)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ladderize.records import BenchRecord, BenchRow, EvalRecord
from ladderize.report import write_report
from ladderize.runtime.bench import add_comparisons
from tests.cli_helpers import error_lines, run_cli

HIGHER = {"lambada_openai": {"acc": True, "perplexity": False}, "shakespeare": {"word_perplexity": False}}


def _eval(ckpt: str, layout: str, acc: float, ppl: float, word_ppl: float, adapted: bool = False) -> dict:
    results = {"lambada_openai": {"acc,none": acc, "acc_stderr,none": 0.01, "perplexity,none": ppl},
               "shakespeare": {"word_perplexity,none": word_ppl}}
    return EvalRecord(checkpoint=ckpt, layout=layout, layout_ranges={}, num_layers=30, layers_converted=0 if layout == "dense" else 8,
                      allreduces_per_decode_step=60, overlappable_allreduces_per_decode_step=0,
                      history=["convert", "adapt"] if adapted else ["convert"], lm_eval={"higher_is_better": HIGHER},
                      results=results).to_json()


def _bench(ckpt: str, layout: str, dense_runs: list[float], native_runs: list[float]) -> dict:
    rows = []
    for schedule, runs in (("native", native_runs), ("dense", dense_runs)):
        row = BenchRow(schedule=schedule, layout=layout if schedule == "native" else "dense", tp=3, batch=1, prompt_len=16,
                       decode_steps=8, prefill_s=0.1, decode_s_per_token=sorted(runs)[1], allreduces_per_decode_step=60)
        row.set_decode_runs(runs)
        rows.append(row)
    add_comparisons(rows)
    return BenchRecord(ckpt, layout, rows, {"device": "cpu"}).to_json()


@pytest.fixture
def crowded(tmp_path: Path) -> Path:
    """Five checkpoints whose points crowd one corner: the adapted ones share their zero-shot twin's speed-up (and
    ladder's adapted accuracy equals its zero-shot one: the two markers coincide)."""
    folder = tmp_path / "runs"
    folder.mkdir()
    files = {
        "dense.json": _eval("/m/dense", "dense", 0.400, 20.0, 50.0),
        "ladder.json": _eval("/m/ladder", "ladder 22:30", 0.395, 21.0, 52.0),
        "ladder-adapted.json": _eval("/m/ladder-adapted", "ladder 22:30", 0.395, 20.5, 51.0, adapted=True),
        "spd.json": _eval("/m/spd", "spd@tp3 22:30", 0.397, 20.8, 51.5),
        "spd-adapted.json": _eval("/m/spd-adapted", "spd@tp3 22:30", 0.398, 20.2, 50.5, adapted=True),
        "bench-ladder.json": _bench("/m/ladder", "ladder 22:30", [0.030, 0.030, 0.030], [0.0297, 0.0296, 0.0298]),
        "bench-spd.json": _bench("/m/spd", "spd@tp3 22:30", [0.030, 0.030, 0.030], [0.0295, 0.0296, 0.0294]),
    }
    for name, record in files.items():
        (folder / name).write_text(json.dumps(record))
    return folder


def _figure_of(monkeypatch, run):
    """Run ``run()`` and return the last figure matplotlib's ``subplots`` made in it."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    from matplotlib import pyplot as plt

    made = []
    real = plt.subplots
    monkeypatch.setattr(plt, "subplots", lambda *a, **k: made.append(real(*a, **k)) or made[-1])
    result = run()
    return result, made[-1][0]


def _scatters(ax) -> list:
    """The panel's markers: one scatter collection per point."""
    from matplotlib.collections import PathCollection

    return [c for c in ax.collections if isinstance(c, PathCollection) and len(c.get_offsets())]


def _boxes_overlap(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def test_no_label_covers_a_point_nor_another_label(crowded: Path, tmp_path: Path, monkeypatch):
    """Issue 64 item 5: labels were drawn over other points (here five points within a few pixels of each other)."""
    from matplotlib.transforms import Bbox

    from matplotlib.backends.backend_agg import FigureCanvasAgg

    written, fig = _figure_of(monkeypatch, lambda: write_report([crowded], tmp_path / "report"))
    canvas = FigureCanvasAgg(fig)  # the figure as saved (closed figures lose their canvas)
    canvas.draw()
    renderer = canvas.get_renderer()
    scale = fig.dpi / 72.0
    checked = 0
    for ax in fig.axes:
        labels = [text for text in ax.texts if text.get_text()]
        if not labels:
            continue
        markers = []
        for collection in _scatters(ax):
            radius = (collection.get_sizes()[0] ** 0.5 / 2 + max(collection.get_linewidths(), default=0) / 2) * scale
            for x, y in ax.transData.transform(collection.get_offsets()):
                markers.append(Bbox.from_extents(x - radius, y - radius, x + radius, y + radius))
        assert len(markers) == len(labels) == 5
        boxes = [label.get_window_extent(renderer) for label in labels]
        for label, box in zip(labels, boxes):
            assert not any(_boxes_overlap(box, marker) for marker in markers), label.get_text()
        for i, box in enumerate(boxes):
            assert not any(_boxes_overlap(box, other) for other in boxes[i + 1:]), labels[i].get_text()
        checked += 1
    assert checked == 1


def test_an_adapted_triangle_shows_inside_the_circle_it_coincides_with(crowded: Path, tmp_path: Path, monkeypatch):
    """Issue 64 item 5: the adapted triangle was hidden under the zero-shot circle at the same place."""
    written, fig = _figure_of(monkeypatch, lambda: write_report([crowded], tmp_path / "report"))
    (ax,) = [ax for ax in fig.axes if ax.texts]
    markers = [(tuple(c.get_offsets()[0]), c.get_sizes()[0], c.get_zorder(), c) for c in _scatters(ax)]
    places = [marker[0] for marker in markers]
    shared = [place for place in places if places.count(place) == 2]
    assert shared, "the fixture puts ladder's zero-shot and adapted points at one place"
    under, above = sorted((m for m in markers if m[0] == shared[0]), key=lambda m: m[2])
    assert above[2] > under[2] and above[1] < under[1]  # drawn on top, and smaller: both markers show
    # of one colour, the triangle's edge sets it off the circle beneath it
    assert tuple(above[3].get_facecolors()[0]) == tuple(under[3].get_facecolors()[0])
    assert len(above[3].get_edgecolors()) and tuple(above[3].get_edgecolors()[0]) != tuple(under[3].get_facecolors()[0])


def test_report_metric_and_task_choose_the_plot_axis(crowded: Path, tmp_path: Path):
    assert write_report([crowded], tmp_path / "a")["plot"]["y_label"] == "lambada_openai acc"
    assert write_report([crowded], tmp_path / "b", task="shakespeare")["plot"]["y_label"] == "shakespeare word ppl"
    plot = write_report([crowded], tmp_path / "c", metric="perplexity")["plot"]
    assert plot["y_label"] == "lambada_openai ppl" and plot["title"].startswith("dense: lambada_openai ppl vs")


@pytest.mark.parametrize("option, value, expected", [
    ("--metric", "accuracy", "error: --metric 'accuracy' is not a metric report reads; choose from: acc, acc_norm,"),
    ("--task", "hellaswag", "error: --task 'hellaswag' is in none of the runs; choose from: lambada_openai, shakespeare"),
])
def test_report_refuses_an_unknown_metric_or_task_in_one_line(crowded: Path, tmp_path: Path, capsys, monkeypatch,
                                                             option: str, value: str, expected: str):
    out = tmp_path / "report"
    code, _out, err = run_cli(["report", crowded, "--out", out, option, value], capsys, monkeypatch)
    assert code == 2 and len(error_lines(err)) == 1 and error_lines(err)[0].startswith(expected), err
    assert not out.exists()  # refused before anything is written


def test_report_refuses_a_metric_the_task_lacks(crowded: Path, tmp_path: Path, capsys, monkeypatch):
    code, _out, err = run_cli(["report", crowded, "--out", tmp_path / "r", "--task", "shakespeare", "--metric", "acc"],
                              capsys, monkeypatch)
    assert code == 2 and error_lines(err) == ["error: --metric 'acc' is not in task 'shakespeare'; choose from: word_perplexity"]
