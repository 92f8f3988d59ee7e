"""The shared records: phase and unit in every name, round trips, strict reading, and the legacy reader."""

from __future__ import annotations

import json

import pytest

from ladderize.errors import LadderizeError
from ladderize.records import (BENCH_RECORD, RECORD_VERSION, BenchRecord, BenchRow, EvalRecord, PredictRecord,
                               PredictRow, add_speedups, load_record, read_record)

TIMINGS = {"dense": (0.30, 0.010), "native": (0.30, 0.007)}  # schedule -> (prefill_s, decode_s_per_token)


def _rows(kind: type, layout: str = "ladder 0:4") -> list:
    rows = [kind(schedule=schedule, layout="dense" if schedule == "dense" else layout, tp=2, batch=4, prompt_len=64,
                 decode_steps=15, prefill_s=prefill, decode_s_per_token=decode, allreduces_per_decode_step=8)
            for schedule, (prefill, decode) in TIMINGS.items()]  # fmt: skip
    add_speedups(rows)
    return rows


@pytest.mark.parametrize("kind", [BenchRow, PredictRow])
def test_a_speedup_compares_a_phase_with_the_same_phase(kind):
    """A measured and a predicted row of the same layout and timings give the same speed-ups, phase by phase."""
    dense, native = _rows(kind)
    assert native.decode_tokens_per_s == pytest.approx(4 / 0.007)
    assert native.e2e_tokens_per_s == pytest.approx(4 * 16 / (0.30 + 15 * 0.007))
    assert native.decode_speedup_vs_dense == pytest.approx(10 / 7)
    assert native.e2e_speedup_vs_dense == pytest.approx((0.30 + 15 * 0.010) / (0.30 + 15 * 0.007))
    assert native.e2e_speedup_vs_dense < native.decode_speedup_vs_dense  # the unchanged prefill dilutes it
    assert dense.decode_speedup_vs_dense == dense.e2e_speedup_vs_dense == 1.0
    with pytest.raises(ValueError, match="cannot compare"):  # other lengths are not like for like
        native.speedups_against(kind(**{**vars(dense), "decode_steps": 31}))


def test_rows_without_a_dense_row_get_no_speedup():
    rows = [BenchRow(schedule="native", layout="ladder 0:4", tp=2, batch=1, prompt_len=8, decode_steps=4, prefill_s=0.1,
                     decode_s_per_token=0.01, allreduces_per_decode_step=8)]
    add_speedups(rows)
    assert rows[0].decode_speedup_vs_dense is None and rows[0].e2e_speedup_vs_dense is None


def test_records_round_trip(tmp_path):
    bench_rows = _rows(BenchRow)
    bench_rows[1].set_decode_runs([0.007, 0.006, 0.009])
    bench = BenchRecord("synthetic:tiny", "ladder 0:4", bench_rows, {"device": "cpu"}, {"summary": {"x": 1}})
    predict = PredictRecord(model={"name": "tiny"}, interconnect={"name": "h100-nvlink"}, compute={"label": "roofline"},
                            prompt_len=64, decode_steps=15, decode_kv_len=72, domino_chunks=2, layout=None,
                            schedules={"dense": "every layer dense"}, rows=_rows(PredictRow),
                            module_timings=[{"phase": "decode", "seconds": 1e-4}])
    evaluation = EvalRecord(checkpoint="/m/ladder", layout="ladder 2:4", layout_ranges={"ladder": "2:4"}, num_layers=4,
                            layers_converted=2, allreduces_per_decode_step=8, overlappable_allreduces_per_decode_step=4,
                            history=["convert"], results={"lambada_openai": {"acc,none": 0.5}}, limit={"lambada_openai": 4})
    for record in (bench, predict, evaluation):
        data = json.loads(json.dumps(record.to_json()))
        assert data["version"] == RECORD_VERSION
        assert read_record(data) == record
        path = tmp_path / f"{data['record']}.json"
        path.write_text(json.dumps(data))
        assert load_record(path) == record
    row = bench.to_json()["rows"][1]
    assert row["decode_tokens_per_s"] == pytest.approx(4 / 0.007) and row["e2e_tokens_per_s"] == bench_rows[1].e2e_tokens_per_s
    assert (row["decode_s_per_token_min"], row["decode_s_per_token_median"], row["decode_s_per_token_max"]) == (0.006, 0.007, 0.009)
    assert bench.checkpoint is None and BenchRecord("/m/x", "dense", []).checkpoint == "/m/x"


def test_reading_is_strict_and_says_why_in_one_line():
    data = BenchRecord("synthetic:tiny", "dense", _rows(BenchRow)).to_json()
    misspelt = json.loads(json.dumps(data))
    misspelt["rows"][0]["tokens_per_s"] = 1.0
    with pytest.raises(LadderizeError, match="row 0: unknown field\\(s\\) tokens_per_s in a BenchRow"):
        read_record(misspelt, "b.json")
    missing = json.loads(json.dumps(data))
    del missing["rows"][1]["decode_s_per_token"]
    with pytest.raises(LadderizeError, match="BenchRow lacks decode_s_per_token"):
        read_record(missing, "b.json")
    with pytest.raises(LadderizeError, match="version 3; this ladderize reads version 2"):
        read_record({**data, "version": 3}, "b.json")
    with pytest.raises(LadderizeError, match="unknown record kind 'ladderize-train'"):
        read_record({**data, "record": "ladderize-train"}, "b.json")


def test_legacy_files_map_old_names_by_their_kind():
    """Old bench ``tokens_per_s``/``speedup_vs_dense`` were decode-only; old predict ones were end-to-end."""
    old_bench = {"meta": {"model": "synthetic:cpu-512", "layout": "ladder 0:8", "device": "cpu"}, "summary": {"batch1": {}},
                 "rows": [{"schedule": s, "tp": 2, "batch": 1, "prompt_len": 64, "gen_len": 32, "prefill_s": 0.05,
                           "decode_s_per_token": d, "tokens_per_s": 1 / d, "allreduce_count": 16, "allreduce_share": 0.6,
                           "layout": "dense" if s == "dense" else "ladder 0:8", "domino_chunks": None,
                           "overlapped_allreduces": 15 if s == "native" else 0, "decode_s_per_token_runs": [d, d],
                           "speedup_vs_dense": 0.025 / d, "gap_closed": 0.2}
                          for s, d in (("native", 0.020), ("dense", 0.025))]}  # fmt: skip
    bench = read_record(old_bench, "old-bench.json")
    assert isinstance(bench, BenchRecord) and bench.model == "synthetic:cpu-512" and bench.layout == "ladder 0:8"
    assert bench.meta == {"device": "cpu"} and bench.annotations == {"summary": {"batch1": {}}}
    native = bench.rows[0]
    assert native.decode_steps == 32 and native.allreduces_per_decode_step == 16
    assert native.decode_speedup_vs_dense == pytest.approx(1.25) and native.e2e_speedup_vs_dense is None
    assert native.decode_tokens_per_s == pytest.approx(old_bench["rows"][0]["tokens_per_s"])
    assert native.decode_allreduce_share == 0.6 and native.decode_gap_closed == 0.2
    assert native.overlapped_allreduces_per_decode_step == 15
    assert bench.to_json()["record"] == BENCH_RECORD  # re-written as a record

    old_predict = {"model": {"name": "llama-3.1-70b"}, "interconnect": {"name": "h100-nvlink"}, "compute": {"label": "r"},
                   "prompt_tokens": 1024, "new_tokens": 512, "decode_kv_len": 1280, "domino_chunks": 2, "layout": None,
                   "schedules": {}, "module_timings": [],
                   "rows": [{"tp": 8, "batch": 1, "schedule": s, "layout": s, "prefill_s": p, "decode_s_per_token": d,
                             "tokens_per_s": 512 / (p + 511 * d), "speedup_vs_dense": e, "prefill_exposed_comm_s": 0.01,
                             "decode_exposed_comm_s": 0.003, "decode_allreduces_per_step": 160, "note": ""}
                            for s, p, d, e in (("dense", 0.0707, 0.012813, 1.0), ("ladder", 0.0595, 0.009770, 1.31))]}  # fmt: skip
    predicted = read_record(old_predict, "old-predict.json")
    assert isinstance(predicted, PredictRecord) and predicted.prompt_len == 1024 and predicted.decode_steps == 511
    ladder = predicted.rows[1]
    assert ladder.e2e_speedup_vs_dense == 1.31  # the old predict speed-up was end-to-end
    assert ladder.decode_speedup_vs_dense == pytest.approx(0.012813 / 0.009770)  # derived from the decode times
    assert ladder.e2e_tokens_per_s == pytest.approx(old_predict["rows"][1]["tokens_per_s"])  # and so was tokens_per_s
    assert ladder.decode_exposed_comm_s_per_token == 0.003 and ladder.allreduces_per_decode_step == 160

    old_eval = {"kind": "ladderize-eval", "format_version": 1, "checkpoint": "/m/ladder", "layout": "ladder 2:4",
                "num_layers": 4, "layers_converted": 2, "allreduces_per_token": {"total": 8, "overlappable": 4},
                "history": ["convert"], "results": {"t": {"acc,none": 0.5}}}
    evaluation = read_record(old_eval, "old-eval.json")
    assert isinstance(evaluation, EvalRecord)
    assert (evaluation.allreduces_per_decode_step, evaluation.overlappable_allreduces_per_decode_step) == (8, 4)

    with pytest.raises(LadderizeError, match="neither an eval record"):
        read_record({"rows": [{"tp": 1}]}, "other.json")
