"""The fitted compute model: the H100 table split, the re-run fit, held-out rows, and the 8B cross-check.

Which rows fit which parameter (``fit.H100_TABLE_SPLIT``): the batch 1 and 64 decode rows (TP 1 and 8,
attention and MLP) fix ``weight_bytes_per_s``, ``kv_bytes_per_s``, ``overhead_s[attention]`` and
``overhead_s[mlp]``; the batch 1 and 64 prefill rows fix ``flops_efficiency[kind]`` at the TP8 and TP1
widths. The 8 batch-16 rows are held out and never reach ``fit_compute``.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from ladderize.errors import LadderizeError
from ladderize.predict import fit as F
from ladderize.predict.compute import RooflineCompute
from ladderize.predict.estimate import PredictRequest, predict
from ladderize.predict.gpus import GPU_PROFILES, H100_FIT
from ladderize.predict.interconnect import PROFILES
from ladderize.predict.presets import PUBLIC_PRESETS

PEAK = GPU_PROFILES["h100"].peak_flops_per_s


@pytest.fixture(scope="module")
def rows():
    return F.table_timings(F.h100_table())


def test_the_split_fits_batch_1_and_64_and_holds_out_batch_16(rows):
    fit_rows = [t for t in rows if F.is_fit_row(t)]
    held = [t for t in rows if not F.is_fit_row(t)]
    assert len(rows) == 24 and len(fit_rows) == 16 and len(held) == 8
    assert {t.work.batch for t in held} == {16} and {t.work.batch for t in fit_rows} == {1, 64}
    # Held-out rows never reach the fit: changing their measured times changes nothing.
    doctored = fit_rows + [replace(t, seconds=t.seconds * 3) for t in held]
    doctored_fit = F.fit_compute([t for t in doctored if F.is_fit_row(t)], PEAK, "x")
    assert doctored_fit.to_dict() == F.fit_compute(fit_rows, PEAK, "x").to_dict()
    # Each decode parameter moves with the decode fit rows, each efficiency with its prefill rows.
    slower = F.fit_compute([replace(t, seconds=t.seconds * (1.2 if t.phase == "decode" else 1)) for t in fit_rows],
                           PEAK, "x")
    base = F.fit_compute(fit_rows, PEAK, "x")
    assert slower.weight_bytes_per_s < base.weight_bytes_per_s and slower.overhead_s["mlp"] > base.overhead_s["mlp"]


def test_the_shipped_h100_fit_is_the_fit_rerun():
    refit = F.fit_h100_table()
    assert H100_FIT.weight_bytes_per_s == pytest.approx(refit.weight_bytes_per_s, rel=1e-3)
    assert H100_FIT.kv_bytes_per_s == pytest.approx(refit.kv_bytes_per_s, rel=1e-3)
    for kind in ("attention", "mlp", "head"):
        assert H100_FIT.overhead_s[kind] == pytest.approx(refit.overhead_s[kind], rel=1e-3), kind
        for (w0, e0), (w1, e1) in zip(H100_FIT.flops_efficiency[kind], refit.flops_efficiency[kind]):
            assert w0 == w1 and e0 == pytest.approx(e1, rel=1e-3), kind


def test_roofline_against_every_h100_row(rows):
    errors = {e["row"]: e["error"] for e in F.errors(H100_FIT, rows, PEAK)}
    fit_labels = {t.label for t in rows if F.is_fit_row(t)}
    assert all(abs(errors[label]) < 0.08 for label in fit_labels)
    # Target: every module within +-25%; measured and roofline within 15% on all but one held-out row.
    assert all(abs(e) < 0.25 for e in errors.values())
    beyond = sorted(label for label, e in errors.items() if abs(e) > 0.15)
    assert beyond == ["tp8 b16 decode attention"]  # -15.6%: the TP8 attention steps up from batch 1 to 16


def test_the_8b_bench_is_a_held_out_cross_check():
    """A different model and mode (synthetic llama-8b, whole model, CUDA graphs + compile) within 15%."""
    bench = json.loads(F._data_text(F.H100_BENCH_FILE))
    model = PUBLIC_PRESETS["llama-3.1-8b"]
    for run in bench["rows"]:
        request = PredictRequest(model, (1,), (run["batch"],), run["prompt_len"], run["decode_steps"] + 1,
                                 PROFILES["h100-nvlink"], schedules=("dense",))
        row = predict(request, RooflineCompute(GPU_PROFILES["h100"])).rows[0]
        assert row.prefill_s == pytest.approx(run["prefill_s"], rel=0.15)
        assert row.decode_s_per_token == pytest.approx(run["decode_s_per_token"], rel=0.15)


def test_table_compute_replays_rows_and_falls_back(rows):
    compute = F.TableCompute(RooflineCompute(GPU_PROFILES["h100"]))
    t = rows[0]
    assert compute.module_s(t.work) == t.seconds and compute.source(t.work).startswith("measured on")
    other = replace(t.work, batch=3)
    assert compute.module_s(other) == RooflineCompute(GPU_PROFILES["h100"]).module_s(other)
    assert compute.source(other).startswith("roofline")


def test_fit_round_trips_and_rejects_bad_input():
    assert F.ComputeFit.from_dict(json.loads(json.dumps(H100_FIT.to_dict()))) == H100_FIT
    with pytest.raises(LadderizeError, match="compute fit"):
        F.ComputeFit.from_dict({"weight_bytes_per_s": 1.0})
    with pytest.raises(LadderizeError, match="need at least"):
        F.fit_compute([], PEAK, "x")
    assert H100_FIT.efficiency("mlp", 1) == H100_FIT.flops_efficiency["mlp"][0][1]  # flat outside the anchors
    middle = H100_FIT.efficiency("mlp", 3584 * 2 ** 1.5)
    assert H100_FIT.flops_efficiency["mlp"][0][1] < middle < H100_FIT.flops_efficiency["mlp"][1][1]


def test_a_noisy_prefill_row_is_held_at_the_efficiency_cap_and_said(rows):
    """A prefill row barely above its fixed cost (a loaded CPU's calibration) would fit an efficiency far above the
    peak; the fit holds it at MAX_EFFICIENCY and its sources name the anchor, instead of failing the calibration."""
    fit_rows = [t for t in rows if F.is_fit_row(t)]
    base = F.fit_compute(fit_rows, PEAK, "x")
    assert "flops_efficiency_clamped" not in base.sources
    fast = [replace(t, seconds=base.overhead_s[t.work.kind] * 1.0001)
            if t.phase == "prefill" and t.work.kind == "mlp" else t for t in fit_rows]
    noisy = F.fit_compute(fast, PEAK, "x")
    assert all(e == F.MAX_EFFICIENCY for _, e in noisy.flops_efficiency["mlp"])
    assert "mlp@" in noisy.sources["flops_efficiency_clamped"]
    assert noisy.flops_efficiency["attention"] == base.flops_efficiency["attention"]
