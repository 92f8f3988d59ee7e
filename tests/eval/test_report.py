"""Report rendering from fixture eval and bench JSON: table, CSV, PNG, Pareto front; records and legacy files."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from ladderize.errors import LadderizeError
from ladderize.records import BenchRecord, BenchRow, EvalRecord, SpeedupSpread
from ladderize.report import build_report, write_report
from ladderize.report.plot import pareto_front

HIGHER = {"lambada_openai": {"acc": True, "perplexity": False}, "shakespeare": {"word_perplexity": False}}


def _results(acc: float, ppl: float, word_ppl: float) -> dict:
    return {
        "lambada_openai": {"alias": "lambada_openai", "acc,none": acc, "acc_stderr,none": 0.01, "perplexity,none": ppl, "perplexity_stderr,none": 1.0},
        "shakespeare": {"alias": "shakespeare", "word_perplexity,none": word_ppl, "word_perplexity_stderr,none": "N/A", "bits_per_byte,none": 1.2},
    }


def _eval(ckpt: str, layout: str, converted: int, allreduces: int, overlappable: int, acc: float, ppl: float, word_ppl: float, history=("convert",)):
    """The format of ``ladderize eval --json``."""
    return EvalRecord(checkpoint=ckpt, layout=layout, layout_ranges={}, num_layers=30, layers_converted=converted,
                      allreduces_per_decode_step=allreduces, overlappable_allreduces_per_decode_step=overlappable,
                      history=list(history), lm_eval={"higher_is_better": HIGHER}, results=_results(acc, ppl, word_ppl)).to_json()


def _row(schedule: str, tp: int, batch: int, tps: float, layout: str, speedup: float | None) -> BenchRow:
    return BenchRow(schedule=schedule, layout=layout, tp=tp, batch=batch, prompt_len=128, decode_steps=32, prefill_s=0.1,
                    decode_s_per_token=batch / tps, allreduces_per_decode_step=60, decode_allreduce_share=0.5,
                    decode_speedup_vs_dense=speedup)


def _set_spread(row: BenchRow, spread: SpeedupSpread) -> None:
    """The round speed-ups a bench file carries beside its ``decode_speedup_vs_dense``."""
    row.decode_speedup_vs_dense_min, row.decode_speedup_vs_dense_median = spread.min, spread.median
    row.decode_speedup_vs_dense_max, row.decode_speedup_vs_dense_stderr = spread.max, spread.stderr


def _bench(ckpt: str, layout: str, native_tps: dict, dense_tps: dict, speedups: bool = True):
    """The format of ``ladderize bench --json`` (decode_speedup_vs_dense per row unless ``speedups`` is False)."""
    rows = []
    for (tp, batch), tps in native_tps.items():
        speedup = tps / dense_tps[(tp, batch)] if (tp, batch) in dense_tps and speedups else None
        rows.append(_row("native", tp, batch, tps, layout, speedup))
    for (tp, batch), tps in dense_tps.items():
        rows.append(_row("dense", tp, batch, tps, "dense", 1.0))
    rows.append(_row("upper-bound", 3, 1, 999.0, "dense", 99.0))
    return BenchRecord(ckpt, layout, rows, {"device": "cpu"}).to_json()


def _legacy_eval(ckpt: str, layout: str, converted: int, allreduces: int, overlappable: int, acc: float, ppl: float, word_ppl: float, history=("convert",)):
    """An eval file written before the records (kind and format_version 1)."""
    return {
        "kind": "ladderize-eval",
        "format_version": 1,
        "checkpoint": ckpt,
        "layout": layout,
        "num_layers": 30,
        "layers_converted": converted,
        "allreduces_per_token": {"total": allreduces, "overlappable": overlappable},
        "history": list(history),
        "lm_eval": {"higher_is_better": HIGHER},
        "results": _results(acc, ppl, word_ppl),
    }


def _legacy_bench(ckpt: str, layout: str, native_tps: dict, dense_tps: dict, speedups: bool = True):
    """A bench file written before the records: meta + rows, decode-only ``tokens_per_s`` and ``speedup_vs_dense``."""
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
    if not speedups:  # a leaner file: no meta, no dense rows, no speed-up; the dense layout's bench is the reference
        return {"checkpoint": ckpt, "rows": [{k: v for k, v in r.items() if k != "speedup_vs_dense"}
                                             for r in rows if r["schedule"] == "native"]}
    return {"meta": {"model": ckpt, "layout": layout}, "rows": rows}


@pytest.fixture(params=["records", "legacy"])
def runs(tmp_path: Path, request) -> Path:
    """The same runs as records, and as files written before the records (read by the legacy reader)."""
    eval_, bench = (_eval, _bench) if request.param == "records" else (_legacy_eval, _legacy_bench)
    folder = tmp_path / "runs"
    folder.mkdir()
    spd_bench = bench("/m/spd", "spd@tp3 22:30", {(3, 1): 11.0, (3, 4): 36.0}, {}, speedups=False)
    if request.param == "records":  # no dense rows and no speed-ups: the dense layout's bench is the reference
        spd_bench["rows"] = [r for r in spd_bench["rows"] if r["schedule"] == "native"]
    files = {
        "eval-dense.json": eval_("/m/dense", "dense", 0, 60, 0, 0.40, 20.0, 50.0),
        "eval-ladder.json": eval_("/m/ladder", "ladder 22:30", 8, 60, 16, 0.30, 35.0, 80.0),
        "eval-ladder-adapted.json": eval_("/m/ladder-adapted", "ladder 22:30", 8, 60, 16, 0.36, 24.0, 60.0, ("convert", "adapt")),
        "eval-spd.json": eval_("/m/spd", "spd@tp3 22:30", 8, 52, 0, 0.38, 22.0, 55.0),
        "bench-dense.json": bench("/m/dense", "dense", {(3, 1): 10.0, (3, 4): 30.0}, {(3, 1): 10.0, (3, 4): 30.0}),
        "bench-ladder.json": bench("/m/ladder", "ladder 22:30", {(3, 1): 12.0, (3, 4): 33.0}, {(3, 1): 10.0, (3, 4): 30.0}),
        "bench-spd.json": spd_bench,
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
    assert by["dense"].decode_speedups == {(3, 1): 1.0, (3, 4): 1.0}
    assert by["ladder 22:30"].decode_speedups == pytest.approx({(3, 1): 1.2, (3, 4): 1.1})
    assert by["spd@tp3 22:30"].decode_speedups == pytest.approx({(3, 1): 1.1, (3, 4): 1.2})
    # the adapted checkpoint has no bench of its own: it shares its layout's speed
    assert by["ladder 22:30, adapted"].decode_speedups == by["ladder 22:30"].decode_speedups
    acc = next(m for m in report.metrics if m.name == "acc")
    assert report.delta(by["ladder 22:30"], acc) == pytest.approx(-0.10)
    assert report.delta(by["dense"], acc) == 0.0
    cols = report.columns()
    assert cols[:3] == ["layout", "layers converted", "all-reduces / token"]
    assert "Δ lambada_openai acc" in cols and "decode speed-up TP3 b4" in cols
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
    assert float(rows[1]["decode_speedup_vs_dense/tp3/batch1"]) == pytest.approx(1.2)
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


def test_report_keeps_predicted_rows_out_of_measured_speedups(runs: Path, tmp_path: Path):
    """A predict record beside bench records: named, it is refused in one line; in a folder, it is left out."""
    from ladderize.model.layout import Layout
    from ladderize.predict import PredictRequest, RooflineCompute, load_model_shape, predict
    from ladderize.predict.gpus import GPU_PROFILES
    from ladderize.predict.interconnect import PROFILES

    shape = load_model_shape("llama-3.1-8b")
    request = PredictRequest(shape, (4,), (1, 4), 128, 33, PROFILES["h100-nvlink"],
                             layout=Layout.from_ranges(shape.num_hidden_layers, ladder="22:32"), schedules=("dense", "layout"))
    predicted = predict(request, RooflineCompute(GPU_PROFILES["h100"])).to_record()
    assert {r.decode_steps for r in predicted.rows} == {32}
    path = runs / "predict-ladder.json"
    path.write_text(json.dumps(predicted.to_json()))
    with pytest.raises(LadderizeError, match="is a 'ladderize predict' JSON \\(predicted, not measured\\)") as error:
        build_report([runs / "bench-ladder.json", path])
    assert "\n" not in str(error.value)
    report = build_report([runs])  # the folder: the predict record is not a run
    assert all(str(path) not in r.sources for r in report.runs)
    by = {r.label: r for r in report.runs}
    assert by["ladder 22:30"].decode_speedups == pytest.approx({(3, 1): 1.2, (3, 4): 1.1})


def test_report_speedups_are_decode_speedups_even_when_end_to_end_differs(tmp_path: Path):
    """A bench row carries both phases; the report's columns are the decode one, and say so."""
    rows = [_row("dense", 2, 1, 10.0, "dense", None), _row("native", 2, 1, 12.0, "ladder 22:30", None)]
    rows[0].prefill_s = rows[1].prefill_s = 5.0  # a long prefill, the same for both: e2e gains far less
    from ladderize.records import add_speedups

    add_speedups(rows)
    assert rows[1].decode_speedup_vs_dense == pytest.approx(1.2) and rows[1].e2e_speedup_vs_dense < 1.1
    (tmp_path / "bench.json").write_text(json.dumps(BenchRecord("/m/ladder", "ladder 22:30", rows).to_json()))
    (tmp_path / "eval.json").write_text(json.dumps(_eval("/m/ladder", "ladder 22:30", 8, 60, 16, 0.30, 35.0, 80.0)))
    report = build_report([tmp_path])
    assert report.columns()[-1] == "decode speed-up TP2 b1"
    assert report.runs[0].decode_speedups == {(2, 1): pytest.approx(1.2)}


def test_report_refuses_runs_of_different_models(tmp_path: Path):
    """Issue 37 item 4: a synthetic bench's row went into a SmolLM2 table."""
    (tmp_path / "eval.json").write_text(json.dumps(_eval("/m/smollm2", "dense", 0, 60, 0, 0.4, 20.0, 30.0)))
    rows = [_row("native", 2, 1, 50.0, "dense", None), _row("dense", 2, 1, 50.0, "dense", 1.0)]
    synthetic = BenchRecord("synthetic:tiny", "dense", rows, {"device": "cpu", "num_layers": 4, "params": 100_000})
    (tmp_path / "bench.json").write_text(json.dumps(synthetic.to_json()))
    with pytest.raises(LadderizeError, match=r"one model, but these runs hold 2: synthetic:tiny \(4 layers, 0.1M parameters\): "
                                             r"bench.json; smollm2 \(30 layers\): eval.json"):
        build_report([tmp_path])


def test_report_headline_is_the_median_and_load_is_noted(tmp_path: Path):
    """The headline was the ratio of median times (1.0326), neither the rounds' median (1.0191) nor said to be the mean;
    a bench measured under load said nothing in report.md."""
    dense = _row("dense", 3, 1, 100.0, "dense", 1.0)
    native = _row("native", 3, 1, 103.26, "ladder 22:30", 1.0326)
    _set_spread(native, SpeedupSpread(0.96, 1.0191, 1.17, 0.04))
    record = BenchRecord("/m/ladder", "ladder 22:30", [native, dense], {"device": "cpu", "load_average": [3.93, 2, 1], "cpu_cores": 2})
    (tmp_path / "bench.json").write_text(json.dumps(record.to_json()))
    (tmp_path / "eval.json").write_text(json.dumps(_eval("/m/ladder", "ladder 22:30", 8, 60, 8, 0.4, 20.0, 30.0)))
    written = write_report([tmp_path], tmp_path / "rep")
    text = written["markdown"].read_text()
    assert "1.02x (0.96–1.17)" in text and "1.03x" not in text
    assert "median over the bench's rounds" in text and "standard error" in text
    assert "- Load: bench bench.json was measured at load average 3.9 on 2 CPU cores" in text


def test_report_cli_says_when_the_png_is_a_placeholder(tmp_path: Path, capsys, monkeypatch):
    from tests.cli_helpers import run_cli

    path = tmp_path / "e.json"
    path.write_text(json.dumps(_eval("/m/dense", "dense", 0, 60, 0, 0.4, 20.0, 50.0)))
    code, out, err = run_cli(["report", path, "--out", tmp_path / "out"], capsys, monkeypatch)
    assert code == 0, err
    assert "accuracy_vs_speedup.png (no plot: no layout has both an accuracy and a speed-up)" in out.replace("\n", "")


def test_dense_gets_no_row_at_a_tp_it_cannot_run(tiny_llama_dir: Path, tmp_path: Path):
    """Issue 37 item 4: SmolLM2 dense showed 1.00x at TP 2, which its 9 heads cannot run (here: 3 KV heads)."""
    record = EvalRecord(checkpoint=str(tiny_llama_dir), layout="dense", layout_ranges={}, num_layers=4, layers_converted=0,
                        allreduces_per_decode_step=8, overlappable_allreduces_per_decode_step=0, history=[],
                        lm_eval={"higher_is_better": HIGHER}, results=_results(0.4, 20.0, 30.0)).to_json()
    (tmp_path / "dense.json").write_text(json.dumps(record))
    rows = [_row(schedule, tp, 1, tps, "ladder 2:4", None) for tp in (2, 3) for schedule, tps in (("native", 110.0), ("dense", 100.0))]
    (tmp_path / "bench.json").write_text(json.dumps(BenchRecord("/gone/ladder", "ladder 2:4", rows, {"num_layers": 4}).to_json()))
    report = build_report([tmp_path])
    dense = next(run for run in report.runs if run.is_dense)
    assert (3, 1) in dense.decode_speedups and (2, 1) not in dense.decode_speedups


def test_the_demos_bench_line_shows_the_reports_headline(tmp_path: Path):
    """The demo's 'done bench' line said the ratio of median times (1.05x) where its report, printed just after, said the
    rounds' median (1.01x (1.01–1.06)) for the same row."""
    from ladderize.demo.pipeline import _speeds

    dense = _row("dense", 3, 1, 100.0, "dense", 1.0)
    native = _row("native", 3, 1, 105.4, "ladder 22:30", 1.054)
    _set_spread(native, SpeedupSpread(1.0112, 1.0129, 1.0643, 0.017))
    pooled = _row("native", 3, 4, 95.3, "ladder 22:30", 0.953)  # a row without rounds keeps its one figure
    line = _speeds([native, dense, pooled])
    assert line == "b1 1.01x (1.01–1.06), b4 0.95x"
    record = BenchRecord("/m/ladder", "ladder 22:30", [native, dense], {"device": "cpu"})
    (tmp_path / "bench.json").write_text(json.dumps(record.to_json()))
    (tmp_path / "eval.json").write_text(json.dumps(_eval("/m/ladder", "ladder 22:30", 8, 60, 8, 0.4, 20.0, 30.0)))
    assert "| 1.01x (1.01–1.06) |" in write_report([tmp_path], tmp_path / "rep")["markdown"].read_text()


def test_report_never_mixes_records_made_with_other_settings(tmp_path: Path):
    """Two dense records of one checkpoint and task at two max lengths (the model's own and 2048) are refused in one
    line naming the setting and both files, whichever order they are named in; records made alike give the same
    figures in either order."""
    dense_own = _eval("/m/dense", "dense", 0, 60, 0, 0.40, 508.2, 50.0)
    dense_2048 = {**_eval("/m/dense", "dense", 0, 60, 0, 0.40, 526.0, 50.0), "max_length": 2048}
    ladder = {**_eval("/m/ladder", "ladder 22:30", 8, 60, 16, 0.30, 593.5, 80.0), "max_length": 2048}
    for name, record in {"dense.json": dense_own, "demo/dense.json": dense_2048, "demo/ladder.json": ladder}.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(json.dumps(record))
    for order in ([tmp_path / "dense.json", tmp_path / "demo"], [tmp_path / "demo", tmp_path / "dense.json"]):
        with pytest.raises(LadderizeError) as refused:
            build_report(order)
        line = str(refused.value)
        assert "\n" not in line and "max length" in line and "2048" in line and "the model's own" in line
        assert "dense.json" in line and "demo" in line
    # a ladder record measured at the model's own length beside the demo's dense one: refused the same way
    (tmp_path / "dense.json").unlink()
    (tmp_path / "ladder-own.json").write_text(json.dumps(_eval("/m/ladder2", "ladder 22:30", 8, 60, 16, 0.3, 1.0, 1.0)))
    with pytest.raises(LadderizeError, match="max length"):
        build_report([tmp_path / "demo", tmp_path / "ladder-own.json"])
    (tmp_path / "ladder-own.json").unlink()
    one, other = build_report([tmp_path / "demo"]), build_report([tmp_path / "demo" / "ladder.json",
                                                                 tmp_path / "demo" / "dense.json"])
    ppl = next(m for m in one.metrics if m.name == "perplexity")
    assert [(r.label, one.delta(r, ppl)) for r in one.runs] == [(r.label, other.delta(r, ppl)) for r in other.runs]
    assert one.delta(next(r for r in one.runs if not r.is_dense), ppl) == pytest.approx(593.5 - 526.0)


def test_report_refuses_benches_of_different_devices(tmp_path: Path):
    one = _bench("/m/dense", "dense", {(3, 1): 10.0}, {(3, 1): 10.0})
    other = _bench("/m/ladder", "ladder 22:30", {(3, 1): 12.0}, {(3, 1): 10.0})
    other["meta"]["device"] = "cuda"
    (tmp_path / "a.json").write_text(json.dumps(one))
    (tmp_path / "b.json").write_text(json.dumps(other))
    with pytest.raises(LadderizeError, match="the device is cpu in .*a.json and cuda in .*b.json"):
        build_report([tmp_path])
