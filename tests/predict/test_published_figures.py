"""The shipped constants are what the logs and published figures fix (``benchmarks/published_figures.py``); the
validation table is complete."""

from __future__ import annotations

import pytest

from ladderize.predict.compute import RooflineCompute
from ladderize.predict.fit import TableCompute
from ladderize.predict.gpus import GPU_PROFILES
from ladderize.predict.interconnect import PROFILES
from tests.script_modules import script_module

published = script_module("benchmarks", "published_figures")


@pytest.fixture(scope="module")
def fitted():
    return published.calibrate()


def test_calibration_reproduces_the_shipped_constants(fitted):
    shipped = published.Calibration(GPU_PROFILES["h100-gpt-fast"], dict(PROFILES)).parameters()
    for name, value in fitted.parameters().items():
        assert shipped[name] == pytest.approx(value, rel=2e-3), name


def test_fits_read_only_the_listed_logged_runs():
    # The logged runs at TP8 batch 4 and 16 and TP4 batch 16 are never read by a fit.
    assert set(published.FIT_RUNS) == {(8, 1), (4, 1), (8, 64)}
    rows = published.roofline_vs_logged()
    assert {(r["tp"], r["batch"]) for r in rows if r["role"] == "fit"} == {(8, 1), (4, 1), (8, 64)}
    held = {(r["tp"], r["batch"]) for r in rows if r["role"] == "held out" and r["phase"].startswith("decode")}
    assert held == {(8, 4), (8, 16), (4, 16)}
    for r in rows:
        if r["role"] == "fit":
            assert abs(r["error"]) < 0.005, r
        else:  # held out: the compute-only latencies within 15%
            assert abs(r["error"]) < 0.15, r


def test_no_p2p_allreduce_against_the_p2p_disabled_logs():
    """Issue 35: the P2P-disabled logs' all-reduces (two groups of 4): the fitted runs exact, the held-out TP4 prefill
    ones within 12%, and large messages far above PCIe's 40 GB/s (the profile before fitted 40 GB/s)."""
    rows = published.no_p2p_allreduce_vs_logged()
    fit = [r for r in rows if r["role"] == "fit"]
    assert len(fit) == 6 and all(abs(r["error"]) < 0.005 for r in fit)
    held_prefill = [r for r in rows if r["role"] == "held out" and r["phase"] == "prefill"]
    assert len(held_prefill) == 3 and all(abs(r["error"]) < 0.13 for r in held_prefill)
    no_p2p = PROFILES["h100-no-p2p"]
    assert no_p2p.bus_rate(2**30, 8) > 250e9 and no_p2p.group_size == 4
    # A ring across the two groups pays more per small all-reduce than one inside a group, hop for hop.
    assert no_p2p.allreduce_s(16 * 1024, 8) - no_p2p.launch_s > (14 / 6) * (no_p2p.allreduce_s(16 * 1024, 4) - no_p2p.launch_s)


def test_allreduce_curve_against_the_logs():
    rows = published.allreduce_vs_logged()
    assert len(rows) == 12
    decode_fit = [r for r in rows if r["role"] == "fit" and r["phase"] == "decode"]
    assert len(decode_fit) == 3 and all(abs(r["error"]) < 0.005 for r in decode_fit)
    # Held out at TP8: every message size from 64 KB to 268 MB within 6%.
    tp8_held = [r for r in rows if r["tp"] == 8 and r["role"] == "held out"]
    assert len(tp8_held) == 4 and all(abs(r["error"]) < 0.06 for r in tp8_held)
    nvlink = PROFILES["h100-nvlink"]
    # Small messages latency-bound, large ones near the link's bus bandwidth (nccl-tests: 460-480 GB/s).
    assert nvlink.bus_rate(16 * 1024, 8) < 5e9 < 300e9 < nvlink.bus_rate(2**30, 8) < 480e9


def test_validation_table_errors(fitted):
    table = {row["key"]: row for row in published.validation_table()}
    assert set(table) == {f.key for f in published.FIGURES}
    for key in ("ub-tp8-b1", "ub-tp4-b1", "ub-tp8-b64"):
        assert abs(table[key]["error"]) < 0.005 and table[key]["role"].startswith("fit")
    # The paper's 1.60x without P2P fitted the host-staged hop latency before issue 35; now the P2P-disabled logs' own
    # all-reduce costs fit the profile and the figure is held out, within 4% (-3.7%; -1.8% before the host-staged
    # per-channel term). The logs' own run of that setting gives 1.500x (+2.7%): the model's 1.540x lies between the two.
    assert table["ladder-nop2p-tp8-b1"]["role"] == "held out" and abs(table["ladder-nop2p-tp8-b1"]["error"]) < 0.04
    assert table["ladder-nop2p-tp8-b1"]["predicted"] > table["ladder-nop2p-70b-tp8-b1-log"]["published"]
    # Issue 35: the overlap's interference is derived (NCCL's channels against the SMs), so no Ladder figure on
    # NVLink fits anything: the headline 1.31x is held out, and still within 2%.
    assert table["ladder-tp8-b1"]["role"] == "held out" and abs(table["ladder-tp8-b1"]["error"]) < 0.02
    # Every Ladder figure on NVLink, paper, blog and the authors' gpt_ladder logs of 8B and 70B (TP 2-8, batch 1-64):
    # the targets, mean within 5% and no point beyond 10%, on the held-out ones.
    ladder = [row for row in table.values() if row["schedule"] == "ladder"]
    held = [row for row in ladder if row["role"] == "held out" and row["interconnect"] == "h100-nvlink"]
    assert len(held) >= 19 and {r["model"] for r in held} == {"llama-3.1-8b", "llama-3.1-70b"}
    assert {r["tp"] for r in held} == {2, 4, 8} and {1, 64} <= {r["batch"] for r in held}
    assert all(abs(row["error"]) < 0.10 for row in held), [(r["key"], r["error"]) for r in held]
    assert sum(abs(row["error"]) for row in held) / len(held) < 0.05
    assert sum(abs(row["error"]) for row in held) / len(held) < 0.02  # 1.9% since prefill GEMMs are one wave
    # Peer-to-peer disabled (the paper's 1.60x and the authors' P2P-disabled logs, TP4 and 8, batch 1-64). The
    # host-staged per-channel slowdown is fitted on 70B TP4 batch 64 (1 MB, 16 channels), so that figure is a fit
    # point; the other six are held out: mean 2.0%, worst -3.7% (the paper's 1.60x), within the 10%. Main
    # ed5eb21 (no host-staged term): 4.1% and +10.4% (70B TP4 batch 16) over the seven; 00a91f1: 9.6% and 25.6%.
    no_p2p = [row for row in ladder if row["interconnect"] == "h100-no-p2p"]
    assert len(no_p2p) == 7
    assert [r["key"] for r in no_p2p if r["role"] != "held out"] == [published.NO_P2P_OVERLAP_FIT]
    assert abs(table[published.NO_P2P_OVERLAP_FIT]["error"]) < 0.001
    held_no_p2p = [row for row in no_p2p if row["role"] == "held out"]
    assert len(held_no_p2p) == 6 and "ladder-nop2p-70b-tp4-b16-log" in {r["key"] for r in held_no_p2p}
    assert all(abs(row["error"]) < 0.10 for row in held_no_p2p)  # the 10%
    assert sum(abs(row["error"]) for row in held_no_p2p) / len(held_no_p2p) < 0.021
    assert all(abs(row["error"]) < 0.04 for row in held_no_p2p), [(r["key"], r["error"]) for r in held_no_p2p]
    assert abs(table["ladder-nop2p-70b-tp4-b16-log"]["error"]) < 0.025  # +10.4% at ed5eb21
    # SPD on every layer (the logs' gpt_ensemble runs, blocking, half the all-reduces): within 5% each.
    spd_all = [row for row in table.values() if row["source"] == published.SYNC_DROP_LOGS]
    assert len(spd_all) == 13 and all(row["schedule"] == "spd" and row["role"] == "held out" for row in spd_all)
    assert all(abs(row["error"]) < 0.05 for row in spd_all), [(r["key"], r["error"]) for r in spd_all]
    summary = published.validation_summary(list(table.values()))
    assert {"fit", "held out"} <= {s["role"] for s in summary}
    assert abs(table["spd-nop2p"]["error"]) < 0.15 and table["spd-nvlink"]["error"] < -0.3


def test_the_8b_logs_were_spd_not_ladder():
    """Issue 35: the logs' gpt_ensemble runs (attention all-reduce dropped, SPD on every layer) read as Ladder put the
    model 10% off on average and 22% at worst; as SPD they are within 5%, and the gpt_ladder runs of the same settings
    are within 10%. The paper's and the blog's figures are the gpt_ladder logs' (70B TP8 batch 1 and 4, 8B TP8 batch 4)."""
    misread = published.validation_table(figures=published.ENSEMBLE_READ_AS_LADDER)
    assert len(misread) == 8 and all(row["schedule"] == "ladder" for row in misread)
    summary = published.validation_summary(misread)
    assert len(summary) == 1 and summary[0]["mean_abs_error"] > 0.08 and summary[0]["worst_error"] > 0.15
    by_key = {f.key: f for f in published.FIGURES}
    for log, paper in (("ladder-tp8-b1-log", "ladder-tp8-b1"), ("ladder-tp8-b4-log", "ladder-tp8-b4"),
                       ("ladder-8b-tp8-b4-log", "ladder-8b-tp8-b4-blog")):
        assert by_key[log].published == pytest.approx(by_key[paper].published, abs=0.005)
    for old in published.ENSEMBLE_READ_AS_LADDER:  # the same runs, now SPD figures
        spd = by_key[old.key.replace("ensemble-as-ladder-8b", "spd-all-8b")]
        assert (spd.tp, spd.batch, spd.published, spd.schedule) == (old.tp, old.batch, old.published, "spd")


def test_speedup_falls_with_batch_for_8b_and_70b():
    """Issue 35: the published Ladder speed-ups fall as the batch grows; the default prediction follows."""
    from ladderize.predict.pipeline import run_prediction

    for model in ("llama-3.1-8b", "llama-3.1-70b"):
        rows = run_prediction(model=model, tp="8", batch="1,4,16,64", compute="roofline", schedules="ladder")
        ladder = [r.e2e_speedup_vs_dense for r in rows.rows if r.schedule == "ladder"]
        assert all(a > b for a, b in zip(ladder, ladder[1:])), (model, ladder)


def test_measured_column_replays_the_h100_table():
    made = []

    def compute():
        made.append(TableCompute(RooflineCompute(GPU_PROFILES["h100"])))
        return made[-1]

    table = {row["key"]: row for row in published.validation_table(compute=compute)}
    assert sum(c.hits for c in made) > 0 and sum(c.misses for c in made) > 0  # table rows and fallbacks both used
    # NVLink only: ladderize's modules are a different runtime from the one the P2P-disabled logs measured.
    held_out = [row for row in table.values() if row["role"] == "held out" and row["model"] == "llama-3.1-70b"
                and not row["key"].startswith("spd") and row["interconnect"] == "h100-nvlink"]
    assert all(abs(row["error"]) < 0.10 for row in held_out)


def test_prefill_gemms_run_as_one_wave_on_hopper():
    """Issue 35: Hopper GEMMs are persistent (one CTA per SM), so an all-reduce overlapped with a prefill GEMM pushes
    part of it into a second wave; the 70B TP8 batch-64 Ladder figure (a quarter of its e2e time is prefill) comes
    within 2.5% where the SM-share model was 3.8% high."""
    from dataclasses import replace as _replace

    gpu = GPU_PROFILES["h100-gpt-fast"]
    assert gpu.persistent_gemm_grid and GPU_PROFILES["h100"].persistent_gemm_grid and gpu.sources["persistent_gemm_grid"]
    assert not GPU_PROFILES["a100"].persistent_gemm_grid
    assert type(gpu).from_dict(gpu.to_dict()) == gpu
    figure = {f.key: f for f in published.FIGURES}["ladder-tp8-b64-log"]
    after = published.predict_figure(figure, gpu, PROFILES["h100-nvlink"])
    before = published.predict_figure(figure, _replace(gpu, persistent_gemm_grid=False), PROFILES["h100-nvlink"])
    assert after < before
    assert abs(after / figure.published - 1) < 0.025 < abs(before / figure.published - 1)
