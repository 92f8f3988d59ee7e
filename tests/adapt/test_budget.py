"""``adapt --budget``: parsing, the stages sized to tokens or wall time, the plan record, resume, errors."""

from __future__ import annotations

import json
import re

import pytest

from ladderize.adapt.plan.budget import Budget, parse_budget, recipe_cost, scale_stages
from ladderize.adapt.plan.stages import load_recipe, resolve_stages
from ladderize.adapt.plan.config import GivenSettings
from ladderize.adapt.plan.settings_sections import ScopeSettings, TrainingSettings
from ladderize.checkpoint.placement import cpu_bf16
from ladderize.errors import LadderizeError
from tests.adapt.conftest import plan_and_run, steps_of, timed, typed
from tests.adapt.test_recipe import TINY_SHARED, tiny_best
from tests.cli_helpers import error_lines, run_cli


@pytest.mark.parametrize("text,tokens,seconds", [
    ("30m", None, 1800.0), ("90s", None, 90.0), ("1.5h", None, 5400.0), ("2min", None, 120.0),
    ("20M", 20_000_000, None), ("500K", 500_000, None), ("1G", 10**9, None), ("163840", 163_840, None),
])
def test_budget_forms(text, tokens, seconds):
    assert parse_budget(text) == Budget(text, tokens=tokens, seconds=seconds)


@pytest.mark.parametrize("text", ["", "30x", "0m", "-5M", "m", "1.5.2h"])
def test_bad_budget_is_refused(text):
    with pytest.raises(LadderizeError, match="--budget"):
        parse_budget(text)


def test_default_budget_is_the_recipe_as_it_is(ladder_dir):
    steps = typed(resolve_stages(load_recipe("best"), str(ladder_dir)))
    assert recipe_cost(steps) == 65_536 * 2 + 32_768
    assert scale_stages(steps, recipe_cost(steps)) == steps  # the default changes nothing, warm-up included


def test_budget_scales_every_stage_in_whole_steps(ladder_dir):
    steps = typed(resolve_stages(load_recipe("best"), str(ladder_dir)))
    double = steps_of(scale_stages(steps, 2 * recipe_cost(steps)))
    assert [s["tokens"] for s in double] == [131_072, 65_536] and [s["warmup_steps"] for s in double] == [4, 10]
    small = steps_of(scale_stages(steps, 10_000))  # 8,000 / 2 epochs -> 4 steps of 1,024; 2,000 -> 2 steps
    assert [s["tokens"] for s in small] == [4_096, 2_048] and [s["warmup_steps"] for s in small] == [1, 1]
    # a weight average's horizon, 1 / (1 - decay) steps, grows with its stage: 10 steps of 32 -> 20 steps of 64
    averaged = steps_of(scale_stages([steps[0], steps[1].with_fields(ScopeSettings, ema=0.9)], 2 * recipe_cost(steps)))
    assert averaged[1]["ema"] == 0.95 and "ema" not in averaged[0]
    tiny = steps_of(scale_stages(steps, 1))  # at least one step per stage
    assert [s["tokens"] for s in tiny] == [1_024, 1_024]
    # the sequential stage's cached states capped: what it cannot take goes to kd
    capped = steps_of(scale_stages(steps, 4 * recipe_cost(steps), max_calibration=100_000))
    assert capped[0]["tokens"] == 99_328  # 100,000 rounded to whole steps of 1,024
    assert capped[1]["tokens"] == round((4 * 163_840 - 200_000) / 1_024) * 1_024
    # a sequential stage alone keeps its tokens past the cap (nothing to hand them to)
    alone = typed(resolve_stages(load_recipe("seq-local"), str(ladder_dir)))
    assert scale_stages(alone, 4 * recipe_cost(alone), max_calibration=100_000)[0].step["tokens"] == 262_144


def test_token_budget_runs_records_its_plan_and_says_it(ladder_dir, text_file, tmp_path, capsys, monkeypatch):
    out = tmp_path / "o"
    args = ["adapt", ladder_dir, out, "--data", text_file, "--seq-len", 32, "--batch-size", 2, "--save-every", 1,
            "--stage", "seq-local:tokens=128,epochs=1", "--stage", "kd:tokens=64", "--budget", "640", "--keep-state"]
    code, stdout, stderr = run_cli(args, capsys, monkeypatch)
    assert code == 0, stderr
    # 640 token passes over 192 -> x3.33: seq-local 426.7 -> 7 steps of 64 (448), kd 213.3 -> 3 steps (192)
    assert ("budget 640 tokens (--budget 640: a bare number counts token passes; 30m is wall time): 640 token passes "
            "(seq-local 448 tokens x 1, kd 192 tokens)\n") in stdout + stderr  # all of them: not more than the budget
    assert "1. seq-local: local (sequential), 448 tokens x 1 epoch" in stdout
    assert "  expected: " in stdout and "(timed on this device)" in stdout  # a token budget's plan gives its time too
    assert "adapted 17 steps" in stdout  # 7 steps of 2 x 32 tokens for each of the 2 ladder layers, 3 kd steps
    record = json.loads((tmp_path / "o.adapt-run" / "recipe.json").read_text())
    assert record["budget"]["tokens"] == 640 and [s["tokens"] for s in record["plan"]] == [448, 192]


def test_wall_budget_is_timed_planned_and_kept_on_resume(ladder_dir, text_file, tmp_path):
    # (no state saved every step: a tiny model's steps are too short for the timed pace to include the saves)
    common = dict(shared={**TINY_SHARED, "data": str(text_file), "save_every": 10**6}, budget=Budget("2s", seconds=2.0))
    messages: list[str] = []
    out = str(tmp_path / "o")
    partial = plan_and_run(tiny_best(), str(ladder_dir), out, stop_after_steps=2, on_message=messages.append, **common)
    assert not partial.finished
    record = json.loads((tmp_path / "o.adapt-run" / "recipe.json").read_text())
    pace, planned = record["budget"]["pace"], record["budget"]["planned_s"]
    assert pace["converted"] == 2 and pace["layer_train"] > pace["layer_forward"] > 0
    assert record["budget"]["tokens"] > 0 and sum(planned) <= 2.0
    precision = "bf16" if cpu_bf16() else "float32"  # auto: bf16 autocast where the CPU multiplies bf16 natively
    assert any(m.startswith(f"budget 2 s on cpu ({precision}): timed in") for m in messages)
    assert any(m.startswith("planned wall time: seq-local") and m.endswith("(of 2 s)") for m in messages)
    # a resume keeps the sizes planned when the run began (a new timing could change them); once stage 1 has finished,
    # kd is re-planned to the time left (stopped there, before kd's first step), and a resume after that keeps the re-plan
    first_steps = record["plan"][0]["tokens"] // 64 * 2  # 2 x 32 tokens a step, 2 converted layers, one epoch
    to_kd = plan_and_run(tiny_best(), str(ladder_dir), out, resume=True, stop_after_steps=first_steps,
                       on_message=messages.append, **common)
    replanned = json.loads((tmp_path / "o.adapt-run" / "recipe.json").read_text())
    entry, = replanned["budget"]["replanned"]
    assert not to_kd.finished and replanned["plan"][0] == record["plan"][0] and to_kd.plan == replanned["plan"]
    assert not (tmp_path / "o.adapt-run" / "stage2-kd.run").exists()  # kd has not begun
    assert entry["after_stage"] == 1 and entry["tokens"] == replanned["plan"][1]["tokens"] >= 64, entry
    assert [m for m in messages if "re-planned kd" in m] == [
        m for m in messages if m.startswith(f"budget 2 s: seq-local ran {entry['ran_s']:.0f} s")]
    del messages[:]
    resumed = plan_and_run(tiny_best(), str(ladder_dir), out, resume=True, on_message=messages.append, **common)
    assert resumed.finished and resumed.plan == replanned["plan"]
    assert not [m for m in messages if "re-planned" in m]


def timed_plan():
    """A pace of SmolLM2's shape (ladder 15-29) and the default recipe's two stages at 1024-token steps, with the
    seconds the pace gives each stage."""
    from ladderize.adapt.plan.stage_clock import Pace, stage_seconds

    pace = Pace(device="cpu", precision="bf16", tokens_per_call=1024, layer_forward=0.05, layer_train=0.15,
                head_step=0.2, layer_read=0.01, layers=30, first_converted=15, last_converted=29, converted=15, measured_s=20.0)
    steps = typed([{"stage": 1, "name": "seq-local", "local_schedule": "sequential", "tokens": 102_400, "epochs": 2.0,
                    "seq_len": 512, "batch_size": 2},
                   {"stage": 2, "name": "kd", "tokens": 51_200, "seq_len": 512, "batch_size": 2, "warmup_steps": 5}])
    return pace, steps, [stage_seconds(pace, step) for step in steps]


def test_a_wall_budget_replans_the_stages_left_to_the_time_left():
    """``replan``: the time spent is the pace's measurement and the finished stages' seconds; the stages left are sized
    to the rest at the pace, slowed by as much as the finished stages ran over their plan, never sped up."""
    from ladderize.adapt.plan.budget import Sizing, replan
    from ladderize.adapt.plan.stage_clock import stage_seconds

    pace, steps, planned = timed_plan()

    def record() -> Sizing:
        return Sizing("20s", seconds=20.0 + sum(planned), pace=pace, planned_s=tuple(planned))

    def kd_seconds(plan: list) -> float:
        return stage_seconds(pace, plan[1])

    said: list[str] = []
    on_plan = record()
    on_time = replan(steps, 0, on_plan, [planned[0]], said.append)[0][1].step["tokens"]  # the same plan, to a step
    assert 51_200 - 1024 <= on_time <= 51_200
    faster = record()  # stage 1 in half its time: kd gets the rest, timed at the pace (not at the faster one)
    grown, faster_after = replan(steps, 0, faster, [planned[0] / 2], said.append)
    assert grown[0] == steps[0] and grown[1].step["tokens"] > 51_200 and grown[1].step["warmup_steps"] > 5
    assert kd_seconds(grown) <= planned[1] + planned[0] / 2 < kd_seconds(replan(steps, 0, record(), [0.0])[0]) + 1
    assert faster_after.replanned[0]["slower"] == 1.0 and faster_after.planned_s[1] == kd_seconds(grown)
    assert faster == record() and faster_after.replanned[0]["before_s"] == list(planned)  # a new sizing; the old one kept
    slower = record()  # stage 1 at 1.2x its plan: kd gets what is left, timed 1.2x slower too
    shrunk, slower_after = replan(steps, 0, slower, [1.2 * planned[0]], said.append)
    left = planned[1] - 0.2 * planned[0]
    step_s = 1.2 * (stage_seconds(pace, steps[1].with_fields(TrainingSettings, tokens=2048)) - stage_seconds(pace, steps[1].with_fields(TrainingSettings, tokens=1024)))
    assert 0 < left - step_s < 1.2 * kd_seconds(shrunk) <= left  # within a step of the time left
    entry, = slower_after.replanned
    assert entry["slower"] == 1.2 and entry["left_s"] == round(left, 3) and entry["expected_s"] == [1.2 * kd_seconds(shrunk)]
    assert said[-1].startswith("budget ") and "re-planned kd 51,200 -> " in said[-1] and "1.20x slower pace" in said[-1]
    spent = record()  # nothing left: kd runs its one step, and says so
    assert replan(steps, 0, spent, [3 * planned[0]], said.append)[0][1].step["tokens"] == 1024
    assert "0 s left, less than the smallest stage left: it runs one step" in said[-1]


def test_budget_errors_are_one_line(ladder_dir, text_file, tmp_path, capsys, monkeypatch):
    base = ["adapt", ladder_dir, tmp_path / "o", "--data", text_file]
    for extra, message in ((["--budget", "30x"], "--budget '30x': give wall time"),
                           (["--budget", "1M", "--tokens", "64"], "a single stage takes --tokens instead"),
                           (["--budget", "0.001s", "--seq-len", "32"], "shorter than what the run spends before it trains")):
        code, _, stderr = run_cli([*base, *extra], capsys, monkeypatch)
        errors = [line for line in error_lines(stderr) if "timing this device's pace" not in line]  # (what it did)
        assert code == 2 and len(errors) == 1 and errors[0].startswith("error: ") and message in stderr, stderr


def test_a_joint_stage_that_rereads_the_data_says_so(ladder_dir, text_file):
    """Past the data the sequential stage can cache, a budget's rest goes to kd, which then reads the same text again:
    the plan says how many times (on SmolLM2, past one pass, the runs measured gained WikiText and lost LAMBADA)."""
    from ladderize.adapt.plan.budget import rereads

    shared = GivenSettings.of({"data": str(text_file), "seq_len": 32, "batch_size": 2})
    steps = resolve_stages(load_recipe("best"), str(ladder_dir), shared)
    said: list[str] = []
    sized, _ = timed(steps, parse_budget("100K"), str(ladder_dir), said.append)
    held = sized[0].step["tokens"]  # capped by the data: every whole 32-token window of the text
    assert held < 100_000 // 2 and sized[1].step["tokens"] > held
    passes = sized[1].step["tokens"] / held
    assert rereads(sized, sized[0], held) == [("kd", passes)]
    plan_line = next(line for line in said if line.startswith("budget 100,000 tokens: ") and "token passes (" in line)
    assert f"kd reads the data {passes:.1f} times over" in plan_line and "capped at" in plan_line, plan_line
    assert said[-1].startswith("planned wall time: seq-local ")  # a token budget's plan says its time too
    # a small budget reads the data less than once: nothing to say; another kd data: its size is not known here
    small, _ = timed(steps, parse_budget("2K"), str(ladder_dir), said.append)
    assert "reads the data" not in said[-2] and rereads(small, small[0], held) == []
    assert rereads([sized[0], sized[1].with_fields(TrainingSettings, data="other.txt")], sized[0], held) == []


def test_the_memory_cap_on_calibration_counts_a_window_s_extra_states(monkeypatch):
    """``window=3`` holds two more teacher output pairs: 12 state tensors where one layer holds 8."""
    from ladderize.adapt.plan import budget
    from ladderize.adapt.plan.sequential_schedule import STATE_COPIES, state_copies

    monkeypatch.setattr(budget, "_available_memory", lambda device: 96 * 2**30)
    assert (state_copies(1), state_copies(3)) == (STATE_COPIES, STATE_COPIES + 4) == (8, 12)
    one, three = (budget.max_calibration_tokens(576, "cpu", window=w) for w in (1, 3))
    assert one == int(0.25 * 96 * 2**30 / (8 * 576 * 4)) and three == int(0.25 * 96 * 2**30 / (12 * 576 * 4))


def test_a_pace_timed_before_refuses_a_short_wall_budget_before_anything_is_timed_or_read(
        ladder_dir, text_file, tmp_path, capsys, monkeypatch):
    from ladderize.adapt.plan import budget as budgets
    from ladderize.adapt.plan import kept_paces
    from ladderize.adapt.train import pace as pacing

    monkeypatch.setenv("LADDERIZE_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(kept_paces, "machine_load", lambda: 1.0)  # the same load both times: the kept pace's refusal stands
    monkeypatch.setattr(budgets, "fixed_costs_refusal", lambda *_args: None)  # the pace's floor alone (its own test)
    args = ["adapt", ladder_dir, tmp_path / "o", "--data", text_file, "--budget", "0.001s", "--seq-len", "32"]
    code, stdout, stderr = run_cli(args, capsys, monkeypatch)  # the first time: timed, said so, refused, kept
    assert code == 2 and "timing this device's pace" in stdout + stderr
    assert "too short for this recipe on cpu" in stderr and "(by the pace timed now)" in stderr
    assert len(list((tmp_path / "home" / kept_paces.PACE_CACHE).glob("*.json"))) == 1

    def untouched(*_args, **_kwargs):
        raise AssertionError("timed or read again")

    monkeypatch.setattr(pacing, "measure", untouched)
    monkeypatch.setattr(budgets, "_data_tokens", untouched)
    code, stdout, stderr = run_cli(args, capsys, monkeypatch)
    assert code == 2 and len(error_lines(stderr)) == 1, stderr
    assert re.search(r"takes about [\d.]+ (s|min) \(by the pace timed here before, its fastest\): give at least "
                     r"--budget \d+[sm]$",
                     error_lines(stderr)[0]), stderr
    assert "timing this device's pace" not in stdout + stderr
    assert not (tmp_path / "o").exists() and not (tmp_path / "o.adapt-run").exists()


def test_the_pace_kept_is_the_fastest_timed_piece_by_piece(tmp_path, monkeypatch):
    """A pace timed on a busy machine must not refuse a budget a quiet one fits: the kept one is the fastest seen."""
    from dataclasses import replace

    from ladderize.adapt.plan.kept_paces import cached_pace, store_pace
    from ladderize.adapt.plan.stage_clock import Pace

    monkeypatch.setenv("LADDERIZE_HOME", str(tmp_path / "home"))
    quiet = Pace("cpu", "float32", 64, layer_forward=0.01, layer_train=0.03, head_step=0.02, layer_read=0.001, layers=4,
                 first_converted=2, last_converted=3, converted=2, measured_s=1.0)
    busy = replace(quiet, layer_forward=0.04, layer_train=0.02, head_step=0.05, measured_s=3.0)
    store_pace("k", quiet)
    store_pace("k", busy)
    kept = cached_pace("k")
    assert (kept.layer_forward, kept.layer_train, kept.head_step) == (0.01, 0.02, 0.02)
    assert cached_pace("other") is None


def test_paces_are_kept_per_load_band_with_the_load_and_time_they_were_timed_at(tmp_path, monkeypatch):
    """A pace timed at one load (per CPU) is kept for that band of loads only: a run at another finds none and times
    its own, so a quiet time's pace never sizes a busy run, nor a busy time's a quiet one."""
    from dataclasses import replace

    from ladderize.adapt.plan.kept_paces import cached_pace, load_band, store_pace
    from ladderize.adapt.plan.stage_clock import Pace

    monkeypatch.setenv("LADDERIZE_HOME", str(tmp_path / "home"))
    assert [load_band(load) for load in (None, 0.2, 0.5, 0.9, 1.0, 3.0, 7.9, 8.0, 40.0)] == [0, 0, 1, 1, 2, 3, 4, 5, 6]
    quiet = Pace("cpu", "float32", 64, layer_forward=0.01, layer_train=0.03, head_step=0.02, layer_read=0.001, layers=4,
                 first_converted=2, last_converted=3, converted=2, measured_s=1.0, load=0.3, timed_at=1.0e9)
    busy = replace(quiet, layer_forward=0.1, layer_train=0.3, head_step=0.2, load=5.0, timed_at=2.0e9)
    store_pace("k", quiet)
    store_pace("k", busy)
    assert cached_pace("k", load_band(0.4)) == quiet and cached_pace("k", load_band(6.0)) == busy
    assert cached_pace("k", load_band(1.5)) is None  # nothing timed at that load
    later = replace(busy, layer_train=0.2, load=6.5, timed_at=3.0e9)  # the same band: the fastest, the lower load
    store_pace("k", later)
    kept = cached_pace("k", load_band(6.0))
    assert (kept.layer_forward, kept.layer_train, kept.load, kept.timed_at) == (0.1, 0.2, 5.0, 3.0e9)


def test_a_pace_kept_at_a_busier_time_does_not_refuse_a_budget_a_timing_now_fits(ladder_dir, text_file, tmp_path,
                                                                                 monkeypatch):
    """A slow pace kept from a busier time (a load of 1.9 per CPU, the band's top) would refuse ``--budget 2m``; at a
    load of 1.1 now the budget check times the pace again, and the fresh timing fits it. Kept at the load of now or
    below, the kept pace's refusal stands, answered without a timing."""
    import json
    from dataclasses import replace

    from ladderize.adapt.plan import kept_paces

    from ladderize.adapt.train import pace as pacing
    from ladderize.adapt.plan.stage_clock import Pace

    monkeypatch.setenv("LADDERIZE_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(kept_paces, "machine_load", lambda: 1.1)
    steps = resolve_stages(load_recipe("best"), str(ladder_dir), GivenSettings.of({"data": str(text_file), "seq_len": 32,
                                                                                 "batch_size": 2}))
    timed(steps, parse_budget("10m"), str(ladder_dir))  # times this machine's pace once and keeps it
    file, = (tmp_path / "home" / kept_paces.PACE_CACHE).glob("*.json")
    kept = Pace(**json.loads(file.read_text()))
    slow = replace(kept, layer_forward=600.0, layer_train=1800.0, head_step=600.0, load=1.9)  # minutes a layer
    file.write_text(json.dumps(slow.record()))

    real, calls = pacing.measure, []

    def measure(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(pacing, "measure", measure)
    said: list[str] = []
    sized, record = timed(steps, parse_budget("2m"), str(ladder_dir), said.append)
    assert len(calls) == 1 and record.tokens > 0 and record.pace.layer_train < 1800.0, said
    assert any("timing this device's pace again: the one kept here, timed at load 1.9 per CPU, refuses it; the load 1.1 per CPU now"
               in line for line in said), said
    assert Pace(**json.loads(file.read_text())).layer_train == record.pace.layer_train  # the fastest, kept

    file.write_text(json.dumps(replace(slow, load=1.1).record()))  # kept at the load of now: its refusal stands
    del calls[:]
    with pytest.raises(LadderizeError, match=r"too short for this recipe on cpu; .*\(by the pace timed here before"):
        timed(steps, parse_budget("2m"), str(ladder_dir))
    assert not calls


def _last_line_wall_s(stdout: str) -> float:
    """The wall time the last line of ``adapt`` gives (``45 s`` or ``12.5 min``)."""
    match = re.search(r"tokens trained, ([\d.]+) (s|min) wall time \(", stdout)
    assert match, stdout
    return float(match.group(1)) * (60 if match.group(2) == "min" else 1)


def test_a_refused_wall_budget_names_a_floor_that_runs_and_a_run_keeps_its_budget(
        ladder_dir, text_file, tmp_path, capsys, monkeypatch):
    """A budget is a promise: the floor a refusal names is accepted by the next run (by the pace kept, not timed
    again), and a run ends within 10% of its budget past the fixed cost of loading and writing the model (measured
    here as the floor run's wall time less its training), its last line giving the wall time it measured."""
    import time

    from ladderize.adapt.plan import kept_paces

    from ladderize.adapt.train import pace as pacing

    from ladderize.adapt.plan import budget as budgets

    monkeypatch.setenv("LADDERIZE_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(kept_paces, "machine_load", lambda: 1.0)  # one load band: the second run reads the kept pace
    monkeypatch.setattr(budgets, "fixed_costs_refusal", lambda *_args: None)  # the pace's floor alone (its own test)
    base = ["adapt", ladder_dir, tmp_path / "o", "--data", text_file, "--seq-len", 32, "--force"]
    code, stdout, stderr = run_cli([*base, "--budget", "0.001s"], capsys, monkeypatch)
    assert code == 2 and "(by the pace timed now)" in stderr, stderr
    refusal, = [line for line in error_lines(stderr) if "timing this device's pace" not in line]
    floor = re.search(r"give at least --budget (\d+)s$", refusal).group(1)

    def untouched(*_args, **_kwargs):
        raise AssertionError("timed again")

    monkeypatch.setattr(pacing, "measure", untouched)  # the second answer reads the kept pace
    started = time.perf_counter()
    code, stdout, stderr = run_cli([*base, "--budget", f"{floor}s"], capsys, monkeypatch)
    outer = time.perf_counter() - started
    assert code == 0 and "too short" not in stderr, stderr
    assert "kept in " in stdout + stderr  # the plan says where the pace it read is kept
    wall = _last_line_wall_s(stdout)
    assert wall <= outer + 0.5 and wall >= 0.5 * outer  # the command's own clock, not its budget or training time
    training = float(re.search(r"\(([\d.]+) min training", stdout).group(1)) * 60
    load = max(0.0, outer - training)  # what a run costs past its training: loading, states, writing
    # a budget of twice the floor run's wall time: its stages are sized to it, and the deadlines keep it
    budget = max(int(floor), round(2 * outer))
    started = time.perf_counter()
    code, stdout, stderr = run_cli([*base, "--budget", f"{budget}s"], capsys, monkeypatch)
    outer = time.perf_counter() - started
    assert code == 0, stderr
    assert abs(_last_line_wall_s(stdout) - outer) <= 0.5 + 0.05 * outer
    assert outer <= 1.1 * budget + load, (outer, budget, load, stdout + stderr)


def test_a_sequential_stage_is_counted_at_the_epochs_it_trains():
    """A sequential stage that leaves its epochs to the section's default trains them (2 per layer): the budget counts
    those passes, as it counts a stage that sets them."""
    from ladderize.adapt.plan.settings_sections import SequentialSettings

    default = SequentialSettings().epochs
    left = typed({"objectives": "local", "local_schedule": "sequential", "tokens": 1000})
    assert left.resolved.sequential.epochs == default != 1
    assert recipe_cost([left]) == 1000 * default == recipe_cost(typed([{**left.step, "epochs": default}]))


def test_a_wall_budget_below_the_runs_fixed_costs_is_refused_before_the_pace_is_timed(ladder_dir, text_file, tmp_path):
    """``--budget 1s``: the command has spent more than that starting (imports, data) before it would time the
    device, so it is refused then, in one line naming a budget that holds the fixed costs; no pace is timed."""
    import subprocess
    import sys

    from tests.adapt.test_sharded import _env

    done = subprocess.run([sys.executable, "-m", "ladderize.cli", "adapt", str(ladder_dir), str(tmp_path / "out"),
                           "--data", str(text_file), "--budget", "1s", "--device", "cpu"], env=_env(tmp_path),
                          capture_output=True, text=True, timeout=300)
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 2 and len(errors) == 1, done.stderr[-2000:]
    assert "shorter than what the run spends before it trains" in errors[0] and "give at least --budget" in errors[0]
    assert "timing this device's pace" not in done.stdout + done.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.adapt-run").exists()


def test_the_sequential_stage_regrows_its_layers_when_it_runs_faster_again(ladder_dir, text_file, tmp_path, monkeypatch):
    """A deadline that shortened the layers left (a slow start) gives them back their planned steps, never more,
    once the pace allows: the fit reads each window's plan, not the steps a slower moment left it."""
    import time

    from ladderize.adapt.plan import stage_clock
    from ladderize.adapt.plan.config import AdaptConfig
    from ladderize.adapt.train import deadline as deadline_module
    from ladderize.adapt.stage_run import adapt

    asked = []

    def fit(planned, left_s, spent_s, steps_done):  # behind at the first layer, on time after it
        asked.append(dict(planned))
        return dict.fromkeys(planned, 1) if len(asked) == 1 else stage_clock.fit_steps(planned, 1e9, 1.0, 1)

    monkeypatch.setattr(deadline_module, "fit_steps", fit)
    config = AdaptConfig.from_flat(checkpoint=str(ladder_dir), out=str(tmp_path / "out"), data=str(text_file),
                                   objectives="local", local_schedule="sequential", tokens=32 * 8, seq_len=32,
                                   batch_size=2, epochs=2.0, dtype="float32", device="cpu", compile=False)
    messages = []
    result = adapt(config, deadline=time.perf_counter() + 3600, on_message=messages.append)
    steps = {}
    for record in result.curve:
        steps[record["layer"]] = steps.get(record["layer"], 0) + 1
    assert asked[1] == {3: 8}  # the second layer's fit reads its plan (8 steps), not the 1 the first fit left it
    assert steps == {2: 1, 3: 8}, steps
    assert any("runs faster now" in line and "at most the 8 planned" in line for line in messages), messages


def test_the_sizing_is_typed_and_records_as_before():
    """``AdaptPlan.budget`` is a ``Sizing``; its record is ``RUN/recipe.json``'s ``budget`` key for key (a run folder
    written before resumes), read back equal, and the deadlines it implies are its own."""
    from ladderize.adapt.plan.budget import Sizing

    pace, steps, planned = timed_plan()
    written = {"text": "15m", "seconds": 900.0, "calibration_cap": None, "data_tokens": 4096, "spent_s": 3.5,
               "pace": pace.record(), "tokens": 256_000, "timed_s": 1.25, "planned_s": list(planned),
               "replanned": [{"after_stage": 1, "ran_s": 1.0, "spent_s": 2.0, "left_s": 3.0, "slower": 1.0,
                              "tokens": 1024, "expected_s": [40.0], "before_s": list(planned)}]}
    written = json.loads(json.dumps(written))  # as recipe.json holds it
    sizing = Sizing.from_record(written)
    assert json.loads(json.dumps(sizing.record())) == written and sizing.pace.layer_train == pace.layer_train
    assert sizing.wall and sizing.replanned_after(1) and not sizing.replanned_after(2)
    assert Sizing("3B", 3_000_000_000, None).record() == {"text": "3B", "tokens": 3_000_000_000, "calibration_cap": None}
    began = 100.0
    assert sizing.deadline(1, steps, began, reused_s=10.0) == began + 900.0 - 10.0  # the last stage: the budget's end
    import time

    before = time.perf_counter()
    first = Sizing.from_record({**written, "replanned": []}).deadline(0, steps, began, 0.0)
    assert before + planned[0] <= first <= time.perf_counter() + planned[0]  # from now, its planned time
    assert Sizing("3B", 3_000_000_000, None).deadline(0, steps, began, 0.0) is None  # tokens: no deadline


def test_the_plan_asks_for_the_pace_and_takes_it_as_data(ladder_dir, text_file, tmp_path, monkeypatch):
    """Planning times nothing: a budget with no pace kept for this machine asks for one (``PaceNeeded``: what to
    time), the caller times it (``pace.measure_launch``) and hands it back; the plan sizes by it and keeps it, so the
    next plan asks for none."""
    from ladderize.adapt.plan import kept_paces
    from ladderize.adapt.plan.budget import PaceNeeded, size_recipe
    from ladderize.adapt.train.pace import measure_launch

    monkeypatch.setenv("LADDERIZE_HOME", str(tmp_path / "home"))  # no pace kept
    monkeypatch.setattr(kept_paces, "machine_load", lambda: 1.1)
    steps = resolve_stages(load_recipe("best"), str(ladder_dir), GivenSettings.of({"data": str(text_file), "seq_len": 32,
                                                                                 "batch_size": 2}))
    with pytest.raises(PaceNeeded) as asked:
        size_recipe(steps, parse_budget("10m"), str(ladder_dir))
    needed = asked.value
    assert "timing this device's pace" in needed.line and (needed.timing["seq_len"], needed.timing["batch_size"]) == (32, 2)
    pace = measure_launch(needed.checkpoint, **needed.timing)
    sized, record = size_recipe(steps, parse_budget("10m"), str(ladder_dir), pace=pace)
    assert record.pace == pace and record.timed_s == pace.measured_s and record.tokens > 0
    again, kept = size_recipe(steps, parse_budget("10m"), str(ladder_dir))  # the pace kept here: nothing to time
    assert kept.timed_s == 0.0 and kept.pace.layer_train == pace.layer_train


def test_the_lines_of_a_plan_that_asks_for_its_pace_are_said_once_in_order(monkeypatch):
    """``with_timed_pace``: what the first plan said before it asked, the line that asks, then the second plan's
    lines past the ones it repeats; the second plan gets the pace timed."""
    from ladderize.adapt import entrance
    from ladderize.adapt.plan.budget import PaceNeeded
    from ladderize.adapt.train import pace as pacing

    timed: list[dict] = []

    def plan(pace, say):
        say("batch rounded up")
        say("eager layers")
        if pace is None:
            raise PaceNeeded("timing this device's pace", "ckpt", {"seq_len": 32})
        say(f"sized by {pace}")
        return pace

    said: list[str] = []
    monkeypatch.setattr(pacing, "measure_launch",
                        lambda checkpoint, **timing: timed.append({"checkpoint": checkpoint, **timing}) or "pace")
    assert entrance.with_timed_pace(plan, said.append) == "pace"
    assert said == ["batch rounded up", "eager layers", "timing this device's pace", "sized by pace"]
    assert timed == [{"checkpoint": "ckpt", "seq_len": 32}]
    said.clear()
    assert entrance.with_timed_pace(lambda pace, say: (say("kept"), pace)[1], said.append) is None and said == ["kept"]
