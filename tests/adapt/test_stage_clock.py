"""One time model of a stage (``adapt/plan/stage_clock.py``): a pace timed here and a launch priced from afar are two
sources of rates for the same function."""

from __future__ import annotations

import pytest

import ladderize.adapt.plan.stage_clock as stage_clock
from ladderize.adapt.plan.budget import parse_budget
from ladderize.adapt.plan.cost import Launch, PricedDevice, head_parameters, layer_parameters
from ladderize.adapt.plan.adapt_plan import AdaptPlan, PlannedStage, build_plan
from ladderize.adapt.plan.stage_clock import Pace, stage_seconds
from ladderize.checkpoint.shapes import preset
from ladderize.adapt.plan.config import GivenSettings
from tests.adapt.test_cost import _config_only
from tests.adapt.conftest import typed

EIGHT_B = preset("llama-3.1-8b")
KD = {"stage": 2, "name": "kd", "objectives": "kd", "tokens": 64 * 2048 * 4, "seq_len": 2048, "batch_size": 4}


def test_a_pace_at_the_launch_s_assumed_rate_times_a_kd_stage_as_the_launch_prices_it():
    """Each piece of the pace takes what its FLOPs take at one H100's assumed rate (a layer's forward 2 x its
    parameters a token, its training step 6 x, the kd head 6 x the head's): the kd stage's seconds are the launch's,
    with the teacher's layers and without them (stored teacher states)."""
    priced = PricedDevice.of(EIGHT_B, list(range(16, 32)), Launch(1, "h100"))
    rate, per_call = priced.flops_per_s(sequential=False), 4096
    layer, head = layer_parameters(EIGHT_B), head_parameters(EIGHT_B)
    pace = Pace(device="cuda", precision="bf16", tokens_per_call=per_call, layer_forward=2 * layer * per_call / rate,
                layer_train=6 * layer * per_call / rate, head_step=6 * head * per_call / rate, layer_read=0.0, layers=32,
                first_converted=16, last_converted=31, converted=16, measured_s=1.0)
    for stored in (False, True):
        assert stage_seconds(pace, typed(KD), stored) == pytest.approx(stage_seconds(priced, typed(KD), stored), rel=1e-9)
    assert stage_seconds(priced, typed(KD), True) < 0.7 * stage_seconds(priced, typed(KD))  # the teacher's 32 layers not run


def test_the_pricing_the_budget_and_the_plan_time_stages_by_the_one_function(tmp_path, monkeypatch):
    """``cost.plan_run`` (the launch), ``budget.replan`` (the pace) and ``AdaptPlan.expected_s`` (either) all time a
    stage by ``stage_clock.stage_seconds``: a path that bypassed it would not take its answer."""
    from ladderize.adapt.plan.budget import Sizing, replan

    calls: list[tuple[str, str]] = []

    def timed(clock, step, stored_teacher=False) -> float:
        calls.append((type(clock).__name__, step.name))
        return 100.0

    monkeypatch.setattr(stage_clock, "stage_seconds", timed)
    folder = _config_only(tmp_path, "llama-3.1-8b", 16)
    plan = build_plan(folder, shared=GivenSettings.of({"seq_len": 2048, "batch_size": 32}), budget=parse_budget("3B"), launch="8xH100", priced_only=True)
    assert [stage.seconds for stage in plan.cost.stages] == [100.0, 100.0] and plan.expected_s == 200.0
    assert ("PricedDevice", "seq-local") in calls and ("PricedDevice", "kd") in calls

    calls.clear()
    pace = Pace(device="cpu", precision="float32", tokens_per_call=1024, layer_forward=0.05, layer_train=0.15,
                head_step=0.2, layer_read=0.01, layers=32, first_converted=16, last_converted=31, converted=16,
                measured_s=1.0)
    record = Sizing("1000s", seconds=1_000.0, pace=pace, planned_s=(1.0, 2.0))
    timed_plan = AdaptPlan("best", str(folder), [PlannedStage.from_step(step) for step in plan.steps], Launch(8, "h100"),
                           budget=record, cost=plan.cost)
    assert timed_plan.expected_s == 200.0 and calls == [("Pace", "seq-local"), ("Pace", "kd")]
    assert timed_plan.lines()[-1].endswith("(timed on this device)")
    _steps, replanned = replan(plan.stages, 0, record, [100.0])
    assert replanned.planned_s == (1.0, 100.0) and ("Pace", "kd") in calls  # stage 1's own, then kd by the pace


@pytest.mark.parametrize("processes,batch_size,grad_accum", [(3, 6, 1), (8, 32, 2), (3, 4, 1), (3, 2, 1)])
def test_a_pace_timed_under_a_launch_splits_each_step_over_its_processes_as_the_launch_prices_it(
        processes, batch_size, grad_accum):
    """A pace timed on each of N processes (its pieces at one H100's assumed rate) times a kd stage as ``NxH100`` is
    priced: each step the busiest process's rows (a batch that does not divide waits on them), so a wall budget under N
    processes buys what N do; a sequential stage's passes are split over the processes its batch reaches."""
    from dataclasses import replace

    priced = PricedDevice.of(EIGHT_B, list(range(16, 32)), Launch(processes, "h100"))
    rate, per_call = priced.flops_per_s(sequential=False), 4096
    layer, head = layer_parameters(EIGHT_B), head_parameters(EIGHT_B)
    one = Pace(device="cuda", precision="bf16", tokens_per_call=per_call, layer_forward=2 * layer * per_call / rate,
               layer_train=6 * layer * per_call / rate, head_step=6 * head * per_call / rate, layer_read=0.0,
               layers=32, first_converted=16, last_converted=31, converted=16, measured_s=1.0)
    launch = replace(one, processes=processes)
    kd = {**KD, "tokens": 2048 * batch_size * 64, "batch_size": batch_size, "grad_accum": grad_accum}
    for stored in (False, True):
        assert stage_seconds(launch, typed(kd), stored) == pytest.approx(stage_seconds(priced, typed(kd), stored), rel=1e-9)
    busiest = -(-batch_size // (processes * grad_accum)) * grad_accum  # rows a step of the busiest process
    assert stage_seconds(launch, typed(kd)) == pytest.approx(stage_seconds(one, typed(kd)) * busiest / batch_size, rel=1e-9)
    sequential = {"stage": 1, "name": "seq-local", "local_schedule": "sequential", "tokens": 2048 * 64, "epochs": 2.0,
                  "seq_len": 2048, "batch_size": batch_size}
    assert stage_seconds(launch, typed(sequential)) == pytest.approx(
        stage_seconds(one, typed(sequential)) / min(processes, batch_size), rel=1e-9)
