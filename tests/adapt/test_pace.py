"""``pace.py``: the timed pieces of an adapt run, and the stage times and token counts that follow from them
(``stage_clock.py``)."""

from __future__ import annotations

import pytest

from ladderize.adapt.plan.budget import scale_stages
from ladderize.adapt.train.pace import measure
from ladderize.adapt.plan.stage_clock import CLOSED_FORM_TRAINS, FIXED_READS, Pace, recipe_seconds, stage_seconds, tokens_for_seconds
from ladderize.adapt.plan.stages import load_recipe, resolve_stages
from ladderize.checkpoint.placement import cpu_bf16
from tests.adapt.conftest import typed

PACE = Pace(device="cpu", precision="float32", tokens_per_call=1_000, layer_forward=0.1, layer_train=0.3, head_step=0.5,
            layer_read=0.01, layers=30, first_converted=15, last_converted=29, converted=15, measured_s=1.0)


def test_stage_seconds_follow_what_each_stage_runs():
    fixed = FIXED_READS * 30 * 0.01
    # sequential: 15 layers below once, then 15 layers x (teacher + student forward), and 15 x 2 epochs of training
    seq = {"local_schedule": "sequential", "tokens": 10_000, "epochs": 2.0}
    assert stage_seconds(PACE, typed(seq)) == pytest.approx(fixed + 10 * ((15 + 2 * 15) * 0.1 + 15 * 2 * 0.3))
    closed = stage_seconds(PACE, typed({**seq, "closed_form": True})) - stage_seconds(PACE, typed(seq))
    assert closed == pytest.approx(10 * 15 * CLOSED_FORM_TRAINS * 0.3)  # the refit's passes over the calibration set
    # kd: the teacher's forward through 30 layers and the student's from layer 15 up (the frozen prefix is the
    # teacher's, computed once), the backward from layer 15 up, the heads
    kd = {"objectives": "kd", "tokens": 10_000}
    assert stage_seconds(PACE, typed(kd)) == pytest.approx(fixed + 10 * ((30 + 15) * 0.1 + 15 * 0.2 + 0.5))
    # training every layer: the student's own forward and backward through all 30
    assert stage_seconds(PACE, typed({**kd, "train": "all"})) == pytest.approx(fixed + 10 * (2 * 30 * 0.1 + 30 * 0.2 + 0.5))


def test_tokens_for_seconds_is_the_most_that_fits(ladder_dir):
    steps = typed(resolve_stages(load_recipe("best"), str(ladder_dir)))
    tokens = tokens_for_seconds(PACE, steps, 1_800.0, scale_stages)
    assert recipe_seconds(PACE, scale_stages(steps, tokens)) <= 1_800.0
    assert recipe_seconds(PACE, scale_stages(steps, int(tokens * 1.01) + 4_096)) > 1_800.0
    assert tokens_for_seconds(PACE, steps, 0.5, scale_stages) == 0  # less than the weight reads alone


def test_measure_times_the_converted_layer(ladder_dir):
    pace = measure(str(ladder_dir), seq_len=32, batch_size=2, device="cpu", dtype="float32")
    assert (pace.first_converted, pace.last_converted, pace.converted, pace.layers) == (2, 3, 2, 4)
    assert pace.tokens_per_call == 64 and pace.precision == "float32"
    # auto times the precision the run trains in: bf16 autocast where the CPU multiplies bf16 natively
    assert measure(str(ladder_dir), seq_len=32, batch_size=2, device="cpu").precision == ("bf16" if cpu_bf16() else "float32")
    assert pace.layer_train > pace.layer_forward > 0 and pace.head_step > 0 and pace.layer_read > 0


def test_the_pace_counts_what_other_processes_ran_meanwhile(ladder_dir, monkeypatch):
    import ladderize.adapt.plan.kept_paces as pacing
    import ladderize.adapt.train.pace as timing

    readings = iter([100.0, 100.0 + 1e6])  # the CPUs' busy seconds before and after: far more than this process used
    monkeypatch.setattr(timing, "busy_cpu_seconds", lambda: next(readings))
    busy = measure(str(ladder_dir), seq_len=32, batch_size=2, device="cpu")
    assert busy.other_cpus > 1_000
    assert "other processes kept" in pacing.describe(busy)
    assert "other processes kept" not in pacing.describe(PACE)  # not known
    quiet = Pace(**{**PACE.record(), "other_cpus": pacing.BUSY_CPUS / 2})
    assert "other processes kept" not in pacing.describe(quiet)
    monkeypatch.setattr(timing, "busy_cpu_seconds", lambda: None)  # no /proc/stat
    assert measure(str(ladder_dir), seq_len=32, batch_size=2, device="cpu").other_cpus is None


def test_busy_cpu_seconds_grow_while_this_process_computes():
    import time

    from ladderize.adapt.train.pace import busy_cpu_seconds

    before, own = busy_cpu_seconds(), time.process_time()
    if before is None:
        pytest.skip("no /proc/stat on this system")
    while time.process_time() - own < 0.3:
        pass
    assert busy_cpu_seconds() - before >= 0.2  # this process's own work is in the count of the CPUs it runs on
