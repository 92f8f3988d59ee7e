"""One rule for a speed-up: bench's table, its JSON, the report (table, CSV, plot) and the demo's line show the same
number with the same noise mark; a bench says the load it ran under, and its title and progress line the same rounds."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest
from rich.console import Console

from ladderize.records import BenchRecord, BenchRow, EvalRecord, load_record
from ladderize.runtime.bench import add_comparisons
from tests.cli_helpers import run_cli

# three rounds whose medians disagree with their rounds: dense's median time over native's is 0.020 / 0.014 = 1.43,
# while the rounds' own speed-ups are 0.74, 1.43 and 0.83 (median 0.83, range straddling 1.00x: noise)
DENSE_RUNS, NATIVE_RUNS = [0.010, 0.020, 0.030], [0.0135, 0.014, 0.036]


def _rows(prefill_dense: list[float], prefill_native: list[float]) -> list[BenchRow]:
    rows = []
    for schedule, runs, prefill in (("native", NATIVE_RUNS, prefill_native), ("dense", DENSE_RUNS, prefill_dense)):
        row = BenchRow(schedule=schedule, layout="ladder 2:4" if schedule == "native" else "dense", tp=3, batch=1,
                       prompt_len=16, decode_steps=8, prefill_s=sorted(prefill)[1], decode_s_per_token=sorted(runs)[1],
                       allreduces_per_decode_step=8)
        row.set_decode_runs(runs, prefill)
        rows.append(row)
    add_comparisons(rows)
    return rows


def _table_text(record: BenchRecord) -> str:
    from ladderize.cli.render import bench_table

    console = Console(width=300, record=True)
    console.print(bench_table(record, "ckpt"))
    return console.export_text()


def _cells(text: str, schedule: str) -> list[str]:
    line = next(line for line in text.splitlines() if line.lstrip("│ ").startswith(schedule + " "))
    return [cell.strip() for cell in line.strip("│ ").split("│")]


def test_bench_json_report_plot_and_demo_show_one_speedup(tmp_path: Path):
    """Issue 64: bench printed ~1.16x (JSON 1.163), report printed and plotted 0.83x (0.74-1.81) for the same rounds."""
    from ladderize.demo.pipeline import _speeds
    from ladderize.report import write_report

    rows = _rows([0.1, 0.1, 0.1], [0.1, 0.1, 0.1])
    path = tmp_path / "runs" / "bench.json"
    path.parent.mkdir()
    path.write_text(json.dumps(BenchRecord("/m/ladder", "ladder 2:4", rows, {"device": "cpu", "dtype": "float32"}).to_json()))
    eval_record = EvalRecord(checkpoint="/m/ladder", layout="ladder 2:4", layout_ranges={}, num_layers=4, layers_converted=2,
                             allreduces_per_decode_step=8, overlappable_allreduces_per_decode_step=4, history=["convert"],
                             lm_eval={"higher_is_better": {"lambada_openai": {"acc": True}}},
                             results={"lambada_openai": {"acc,none": 0.3, "acc_stderr,none": 0.01}})
    (path.parent / "eval.json").write_text(json.dumps(eval_record.to_json()))

    record = load_record(path)
    native = next(r for r in record.rows if r.schedule == "native")
    assert native.decode_speedup_vs_dense == pytest.approx(0.020 / 0.024)  # the JSON's number is the rounds' median
    expected = "~0.83x (0.74–1.43)"
    assert _cells(_table_text(record), "native")[8] == expected  # bench's "decode vs dense"
    assert _speeds(record.rows) == f"b1 {expected}"  # the demo's line
    written = write_report([path.parent], tmp_path / "report")
    assert f"| {expected} |" in written["markdown"].read_text()
    (row,) = list(csv.DictReader(written["csv"].open()))
    assert float(row["decode_speedup_vs_dense/tp3/batch1"]) == pytest.approx(native.decode_speedup_vs_dense)
    assert row["decode_speedup_vs_dense/tp3/batch1/noise"] == "1"
    (point,) = written["plot"]["points"]
    assert point["decode_speedup"] == pytest.approx(native.decode_speedup_vs_dense) and point["noise"]


def test_e2e_speedup_is_marked_as_noise_like_the_decode_one():
    """Issue 64: the 'e2e vs dense' column showed 1.15x without the noise mark its rounds called for."""
    prefill = [0.10, 0.12, 0.10]
    rows = _rows([0.10, 0.10, 0.10], prefill)
    # each round's whole generation (prefill + 8 decode steps), dense's over native's
    ratios = sorted((0.10 + 8 * d) / (p + 8 * n) for d, p, n in zip(DENSE_RUNS, prefill, NATIVE_RUNS))
    assert ratios[0] < 1.0 < ratios[-1]
    cell = _cells(_table_text(BenchRecord("m", "ladder 2:4", rows, {"device": "cpu", "dtype": "float32"})), "native")[9]
    assert cell == f"~{ratios[1]:.2f}x ({ratios[0]:.2f}–{ratios[2]:.2f})"
    assert rows[0].e2e_speedup_vs_dense == pytest.approx(ratios[1])  # the JSON's number is the rounds' median


def test_a_bench_under_load_says_so_beside_its_table():
    """Issue 64: bench at load 7 printed dense 2,237 ms/token with no warning on screen (only in the JSON)."""
    rows = _rows([0.1, 0.1, 0.1], [0.1, 0.1, 0.1])
    meta = {"device": "cpu", "dtype": "float32", "cpu_cores": 2, "busy_cores_elsewhere": {"before": 1.9, "during": 1.4}}
    text = _table_text(BenchRecord("m", "ladder 2:4", rows, meta))
    assert "load: this bench was measured while other processes kept 1.4 of the 2 CPU cores busy during the run " \
           "(1.9 just before it), so its speed figures are noise" in " ".join(text.split())
    quiet = dict(meta, busy_cores_elsewhere={"before": 0.1, "during": 0.2})
    assert "load:" not in _table_text(BenchRecord("m", "ladder 2:4", rows, quiet))


def test_bench_then_report_on_its_json_print_the_same_speedup(tmp_path: Path, monkeypatch, capsys):
    """Issue 64, end to end on a real tiny bench: bench's table and report's print one speed-up with one mark; the
    load measured before the run is printed; the title and the progress line count the same rounds."""
    monkeypatch.setattr("ladderize.runtime.timing.busy_elsewhere", lambda window_s=1.0: 1.5)  # others busy before
    json_path = tmp_path / "b.json"
    code, out, err = run_cli(["bench", "--synthetic", "tiny", "--ladder", "2:4", "--tp", "1", "--batch", "1", "--prompt", "4",
                              "--gen", "2", "--warmup", "2", "--repeats", "3", "--schedules", "native,dense",
                              "--json", json_path], capsys, monkeypatch)
    assert code == 0, err
    rounds = "5 round(s) (2 untimed, 3 timed)"
    assert f"x {rounds} of a 4-token prefill" in " ".join(err.split())
    flat = " ".join(out.split())
    assert f"prompt 4, gen 2, {rounds}: medians of the timed" in flat
    assert re.search(r"load: this bench was measured while other processes kept [^,]*\b1\.5\b[^,]* just before it\)?, "
                     r"so its speed figures are noise", flat), out
    data = json.loads(json_path.read_text())
    assert data["meta"]["busy_cores_elsewhere"]["before"] == 1.5 and "during" in data["meta"]["busy_cores_elsewhere"]
    assert all(len(row["decode_s_per_token_runs"]) == 3 == len(row["prefill_s_runs"]) for row in data["rows"])
    bench_cell = _cells(out, "native")[8]

    code, out, err = run_cli(["report", json_path, "--out", tmp_path / "report"], capsys, monkeypatch)
    assert code == 0, err
    report_line = next(line for line in out.splitlines() if line.startswith("| ladder 2:4 |"))
    assert report_line.rstrip(" |").split("|")[-1].strip() == bench_cell
    native = next(row for row in data["rows"] if row["schedule"] == "native")
    assert bench_cell.lstrip("~").startswith(f"{native['decode_speedup_vs_dense']:.2f}x")
    assert "- Load: bench b.json was measured while other processes kept" in (tmp_path / "report" / "report.md").read_text()



def test_bench_says_tp1_speedups_measure_noise():
    """Issue 64: at TP 1 bench printed the identical computation at 0.56x of dense, and nothing said it was noise."""
    rows = _rows([0.1, 0.1, 0.1], [0.1, 0.1, 0.1])
    assert "TP 1" not in _table_text(BenchRecord("m", "ladder 2:4", rows, {"device": "cpu", "dtype": "float32"}))
    for row in rows:
        row.tp = 1
    text = " ".join(_table_text(BenchRecord("m", "ladder 2:4", rows, {"device": "cpu", "dtype": "float32"})).split())
    assert "TP 1: no all-reduce to hide or drop, so every schedule does the same work there; its speed-ups measure noise" in text


def test_the_demos_bench_says_its_speedup_and_load_as_bench_does(tmp_path: Path, monkeypatch):
    """Issue 64: the demo's 'done bench' line and its load note come from the record, by bench's rule and words."""
    from ladderize.demo.pipeline import DemoSettings, _bench

    rows = _rows([0.1, 0.1, 0.1], [0.1, 0.1, 0.1])
    meta = {"device": "cpu", "dtype": "float32", "cpu_cores": 2, "busy_cores_elsewhere": {"before": 0.2, "during": 1.1}}
    monkeypatch.setattr("ladderize.runtime.bench.run_bench", lambda *args, **kwargs: BenchRecord("/m/ladder", "ladder 2:4", rows, meta))
    events: list[tuple[str, str]] = []
    note = _bench("ladder", tmp_path / "ckpt", tmp_path / "bench" / "ladder.json", DemoSettings(),
                  lambda kind, message: events.append((kind, message)), "cpu")
    assert ("done", "bench ladder: decode speed-up against dense b1 ~0.83x (0.74–1.43)") in events
    assert note == "bench ladder was measured while other processes kept 1.1 of the 2 CPU cores busy during the run " \
                   "(0.2 just before it), so its speed figures are noise" and ("note", note) in events
    assert json.loads((tmp_path / "bench" / "ladder.json").read_text())["meta"]["busy_cores_elsewhere"]["during"] == 1.1
