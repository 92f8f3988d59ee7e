"""Rows per (TP, batch, schedule), layouts, validation errors."""

from __future__ import annotations

import json

import pytest

from ladderize.errors import LadderizeError
from ladderize.model.layout import Layout, LayoutError
from ladderize.predict import PredictRequest, RooflineCompute, layout_from_checkpoint, load_model_shape, predict
from ladderize.predict.gpus import GPU_PROFILES
from ladderize.predict.interconnect import PROFILES
from ladderize.parsing import parse_int_list
from ladderize.predict.estimate import decode_kv_len, rank_memory_bytes, select_scenarios
from ladderize.records import e2e_tokens_per_s

from tests.conftest import tiny_config

H100 = RooflineCompute(GPU_PROFILES["h100"])
MODEL = load_model_shape("llama-3.1-70b")


def _rows(**overrides):
    fields = dict(model=MODEL, tps=(1, 8), batches=(1, 16), prompt_tokens=1024, new_tokens=512,
                  interconnect=PROFILES["h100-nvlink"])
    request = PredictRequest(**{**fields, **overrides})
    return predict(request, H100)


def test_one_row_per_tp_batch_schedule_and_sane_ordering():
    prediction = _rows()
    rows = {(r.tp, r.batch, r.schedule): r for r in prediction.rows}
    assert len(prediction.rows) == 2 * 2 * 5  # no layout: dense, ladder, spd, domino, upper-bound
    for batch in (1, 16):
        for schedule in ("dense", "ladder", "spd", "upper-bound"):
            assert rows[1, batch, schedule].e2e_speedup_vs_dense == pytest.approx(1.0)  # TP1: nothing to sync
        dense, ladder, spd, upper = (rows[8, batch, s] for s in ("dense", "ladder", "spd", "upper-bound"))
        assert 1.0 < spd.e2e_speedup_vs_dense < ladder.e2e_speedup_vs_dense < upper.e2e_speedup_vs_dense
        assert upper.decode_exposed_comm_s_per_token == 0
        assert dense.decode_exposed_comm_s_per_token > ladder.decode_exposed_comm_s_per_token
        assert dense.allreduces_per_decode_step == 160 and spd.allreduces_per_decode_step == 80
        # gpt-fast's convention: 512 new tokens per sequence, the first from prefill, then 511 decode steps
        assert dense.e2e_tokens_per_s == pytest.approx(batch * 512 / (dense.prefill_s + 511 * dense.decode_s_per_token))
        assert dense.e2e_tokens_per_s == pytest.approx(e2e_tokens_per_s(batch, 511, dense.prefill_s, dense.decode_s_per_token))
        assert dense.decode_tokens_per_s == pytest.approx(batch / dense.decode_s_per_token)
        # each speed-up compares one phase with the same phase of dense
        assert ladder.decode_speedup_vs_dense == pytest.approx(dense.decode_s_per_token / ladder.decode_s_per_token)
        assert ladder.e2e_speedup_vs_dense == pytest.approx(ladder.e2e_tokens_per_s / dense.e2e_tokens_per_s)
        prefill_speedup = dense.prefill_s / ladder.prefill_s  # end-to-end mixes the two phases' gains
        low, high = sorted((prefill_speedup, ladder.decode_speedup_vs_dense))
        assert low - 1e-9 <= ladder.e2e_speedup_vs_dense <= high + 1e-9
    assert "does not split" in rows[8, 1, "domino"].note
    assert rows[8, 16, "domino"].prefill_s < rows[8, 16, "dense"].prefill_s  # compute-bound prefill overlaps
    assert rows[8, 16, "domino"].decode_s_per_token > rows[8, 16, "dense"].decode_s_per_token  # re-reads weights
    json.dumps(prediction.to_record().to_json())  # serialisable
    timings = prediction.module_timings
    assert {t["kind"] for t in timings} == {"attention", "mlp", "head"}
    assert {t["phase"] for t in timings} == {"prefill", "decode"}
    assert all(t["source"] == "roofline H100-SXM5-80GB" for t in timings)


def test_memory_note_when_a_rank_cannot_hold_the_model():
    rows = {(r.tp, r.schedule): r for r in _rows(batches=(1,)).rows}
    assert "needs 142 GB per rank" in rows[1, "dense"].note and "80 GB of H100" in rows[1, "dense"].note
    assert "GB per rank" not in rows[8, "dense"].note
    assert rank_memory_bytes(MODEL, 8, 1, 1536) / 1e9 == pytest.approx(21.4, abs=0.1)  # logs: 22.4 GB used


def test_layout_row_and_spd_note():
    layout = Layout.from_ranges(80, ladder="40:80", spd="0:20", spd_tp_size=4)
    rows = [r for r in _rows(layout=layout, tps=(4, 8), batches=(1,)).rows if r.schedule == "layout"]
    assert [r.layout for r in rows] == ["ladder 40:80 + spd@tp4 0:20"] * 2
    assert rows[0].note == "" and "converted for TP=4" in rows[1].note
    assert rows[1].allreduces_per_decode_step == 160 - 20


def test_bad_requests_raise_user_errors():
    with pytest.raises(LayoutError, match="does not divide"):
        _rows(tps=(3,))  # 8 KV heads
    with pytest.raises(LayoutError, match="layers"):
        _rows(layout=Layout.dense(32))
    with pytest.raises(LadderizeError, match="unknown schedule"):
        _rows(schedules=("dense", "pipeline"))
    with pytest.raises(LadderizeError):
        _rows(prompt_tokens=0)
    with pytest.raises(LadderizeError):
        parse_int_list("1,two", "--tp")
    with pytest.raises(LadderizeError, match="needs --layout"):
        select_scenarios("dense,layout", has_layout=False)
    assert decode_kv_len(1024, 512) == 1280


def test_layout_from_a_converted_checkpoint(tmp_path):
    config = tiny_config(num_attention_heads=8, num_key_value_heads=4, hidden_size=64, intermediate_size=128,
                         layer_modes=["dense", "spd", "ladder", "ladder"], spd_tp_size=2)
    config.save_pretrained(tmp_path)
    layout, shape = layout_from_checkpoint(tmp_path)
    assert layout.describe() == "ladder 2:4 + spd@tp2 1:2"
    assert shape.num_hidden_layers == 4 and shape.num_key_value_heads == 4
    with pytest.raises(LadderizeError, match="no config.json"):
        layout_from_checkpoint(tmp_path / "missing")


class _NoisyCompute:
    """Module times as a loaded CPU gave them (issue 37 item 1): a half-batch or half-prompt chunk timed far faster
    than half the whole module, so chunked schedules look like gains where nothing was split or communicated."""

    label, device_name, is_gpu, memory_bytes, one_wave_gemms = "noisy timings", "a loaded CPU", False, 0.0, False

    def module_s(self, work):
        whole = 1e-3 * work.batch * work.q_len if work.kind != "head" else 1e-4
        chunked = (work.batch in (2, 8, 32) and work.q_len == 1) or work.q_len in (512,)
        return whole * (0.05 if chunked else 1.0)

    def source(self, work):
        return "measured"


def test_domino_at_tp1_is_the_dense_path_exactly():
    """Issue 37 item 1: domino showed 1.72x at TP 1, batch 1 (nothing communicates; batch 1 cannot split)."""
    request = PredictRequest(MODEL, (1,), (1, 4), 1024, 512, PROFILES["h100-nvlink"], schedules=("dense", "domino"))
    rows = {(r.batch, r.schedule): r for r in predict(request, _NoisyCompute()).rows}
    for batch in (1, 4):
        assert rows[batch, "domino"].e2e_speedup_vs_dense == 1.0 and rows[batch, "domino"].prefill_s == rows[batch, "dense"].prefill_s


def test_a_row_beating_its_upper_bound_is_refused():
    """Issue 37 item 1: domino showed 18.07x at TP 8, batch 4, ten times the no-communication upper bound."""
    request = PredictRequest(MODEL, (8,), (4,), 1024, 512, PROFILES["h100-nvlink"], schedules=("dense", "domino"))
    with pytest.raises(LadderizeError, match="faster than the no-communication upper bound"):
        predict(request, _NoisyCompute())


def test_unsteady_cpu_timings_are_retried_then_flagged(tmp_path, monkeypatch):
    """Issue 37 item 1: CPU runs 16x apart were printed as answers; repeats that disagree are retried, then flagged."""
    import itertools

    from ladderize.predict import measured

    clock = itertools.count()
    durations = itertools.cycle([1.0, 1.0, 9.0])  # every third call 9x slower: a loaded machine
    now = [0.0]

    def perf_counter():
        next(clock)
        return now[0]

    def call():
        now[0] += next(durations) * 1e-3

    monkeypatch.setattr(measured.time, "perf_counter", perf_counter)
    compute = measured.MeasuredCompute(cache_dir=tmp_path, device="cpu", repeats=3)
    compute._time_cpu(call)
    assert compute.unsteady == 1 and "noise" in compute.warnings[0]
    steady = measured.MeasuredCompute(cache_dir=tmp_path, device="cpu", repeats=3)
    durations = itertools.repeat(1.0)
    steady._time_cpu(lambda: now.__setitem__(0, now[0] + next(durations) * 1e-3))
    assert steady.unsteady == 0 and steady.warnings == []
