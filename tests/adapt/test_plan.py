"""The run's plan (``adapt/plan/adapt_plan.py``): one typed object built before any weight loads, which the dry run prints, every
stage reads and the provenance records; on a known GPU it sizes each joint stage's batch to fill the device."""

from __future__ import annotations

import json

from ladderize.adapt.plan.budget import parse_budget
from ladderize.adapt.plan.config import AdaptConfig
from ladderize.adapt.plan.cost import JointMemory, Launch, usable_bytes
from ladderize.adapt.plan.adapt_plan import FILL_MARGIN, MIN_FILLED_STEPS, AdaptPlan, PlannedStage, build_plan
from ladderize.adapt.recipe_run import RunOptions, run_recipe
from ladderize.checkpoint.io import load_config, read_provenance
from ladderize.adapt.plan.config import GivenSettings
from tests.adapt.test_cost import _config_only
from tests.adapt.test_recipe import TINY_SHARED, tiny_best


def test_the_plan_is_typed_priced_and_built_from_config_json_alone(tmp_path):
    folder = _config_only(tmp_path, "llama-3.1-8b", 16)  # no weights, no tokenizer: nothing else could be read
    # the global batch: 4 sequences per process on 8
    plan = build_plan(folder, shared=GivenSettings.of({"seq_len": 2048, "batch_size": 32}), budget=parse_budget("3B"), launch="8xH100", priced_only=True)
    assert isinstance(plan, AdaptPlan) and all(isinstance(stage, PlannedStage) for stage in plan.stages)
    assert [(stage.number, stage.name, stage.sequential) for stage in plan.stages] == [(1, "seq-local", True),
                                                                                      (2, "kd", False)]
    assert plan.launch == Launch(8, "h100") and plan.cost.refusal is None
    assert abs(sum(stage.tokens for stage in plan.stages) - 3e9) < 1e6  # the budget, in whole steps
    assert plan.expected_s == plan.cost.seconds and 10 * 3600 < plan.expected_s < 13 * 3600
    config = plan.stages[1].config(str(folder), str(tmp_path / "out"), run_dir=str(tmp_path / "run"))
    assert isinstance(config, AdaptConfig) and (config.objective.objectives, config.training.seq_len, config.training.batch_size) == ("kd", 2048, 32)
    record = json.loads(json.dumps(plan.record()))
    assert record["plan"] == plan.steps and record["launch"] == {"processes": 8, "gpu": "h100"}
    assert record["budget"]["tokens"] == 3_000_000_000 and record["expected_s"] == plan.expected_s
    assert plan.lines()[-1].startswith("  expected: 11h")


def test_a_known_gpu_fills_each_joint_stage_s_batch_unless_the_user_set_it(tmp_path):
    folder = _config_only(tmp_path, "llama-3.1-8b", 16)
    said: list[str] = []
    filled = build_plan(folder, shared=GivenSettings.of({"seq_len": 2048}), budget=parse_budget("3B"), launch="8xH100", priced_only=True, say=said.append)
    kd = filled.stages[1]
    config, converted = load_config(folder), list(range(16, 32))
    usable = usable_bytes(Launch(8, "h100").memory_bytes)

    def memory(batch: int) -> float:
        return JointMemory.estimate(config, converted, 8, 2048 * batch, head_loss=True, teacher_head=True).total

    local, rest = divmod(kd.settings["batch_size"], 8)  # the global batch: 8 processes x the micro-batch of each
    assert kd.settings["batch_size"] > 2 and rest == 0  # the preset's batch grew ...
    room = usable * (1 - FILL_MARGIN)
    assert memory(local) <= room < memory(local + 1)  # ... to the largest that leaves the margin free
    assert kd.tokens // (kd.settings["batch_size"] * 2048) >= MIN_FILLED_STEPS
    assert any(f"batch {8 * local} = {local} per process x 8 processes" in line for line in said)
    assert any("the largest that fits the GPU's memory" in line for line in said)
    assert filled.stages[0].settings["batch_size"] == 2  # the sequential stage's batch is its own
    assert filled.cost.refusal is None
    given = build_plan(folder, shared=GivenSettings.of({"seq_len": 2048, "batch_size": 16}), budget=parse_budget("3B"), launch="8xH100", priced_only=True)
    assert given.stages[1].settings["batch_size"] == 16  # --batch-size is kept
    short = build_plan(folder, shared=GivenSettings.of({"seq_len": 2048}), budget=parse_budget("10M"), launch="8xH100", priced_only=True)
    assert short.stages[1].settings["batch_size"] == 8  # the preset's 2, rounded up to divide over the 8 processes,
    # and no further: too few tokens to fill the device and keep 1,000 steps
    one_each = build_plan(folder, shared=GivenSettings.of({"seq_len": 2048}), budget=parse_budget("20M"), launch="8xH100", priced_only=True)
    assert one_each.stages[1].settings["batch_size"] == 8  # one sequence per process keeps 1,000 steps; two would not
    here = build_plan(folder, shared=GivenSettings.of({"seq_len": 2048}), budget=parse_budget("3B"), launch="1xH100", priced_only=True)
    assert here.stages[1].settings["batch_size"] == 2 and here.cost.refusal is not None  # nothing larger fits one GPU


def test_a_run_records_the_plan_it_was_built_from(ladder_dir, text_file, tmp_path):
    shared = {**TINY_SHARED, "data": str(text_file), "device": "cpu"}
    plan = build_plan(ladder_dir, shared=GivenSettings.of(shared), recipe=tiny_best())
    assert plan.launch == Launch(1, None) and plan.expected_s is None  # a CPU: no GPU to price the time with
    out = tmp_path / "o"
    done = run_recipe(plan, str(out), RunOptions(keep_state=True))
    assert done.finished
    # one unit: the plan's tokens trained are what each stage's progress and result count
    assert [plan.tokens_trained(stage) for stage in plan.stages] == [result.tokens for result in done.stages]
    assert plan.stages[0].sequential and plan.tokens_trained(plan.stages[0]) > plan.stages[0].tokens  # every layer
    assert any(line.startswith("  tokens trained: seq-local ") for line in plan.lines())
    written = json.loads((tmp_path / "o.adapt-run" / "recipe.json").read_text())
    assert written == json.loads(json.dumps(plan.record()))
    recorded = [step["recipe"] for step in read_provenance(out)["history"] if step["step"] == "adapt"]
    assert [entry["stage"] for entry in recorded] == [1, 2]
    for entry in recorded:
        assert entry["name"] == plan.recipe and entry["launch"] == {"processes": 1, "gpu": None}
        assert [step["tokens"] for step in entry["plan"]] == [stage.tokens for stage in plan.stages]


def test_the_last_line_s_rate_is_the_whole_run_s():
    from pathlib import Path

    from ladderize.adapt.plan.config import AdaptResult
    from ladderize.adapt.entrance import whole_run_pace
    from ladderize.cli.render import adapt_summary

    sequential = AdaptResult(Path("o"), 8, 3_000, 90.0)  # the sequential stage reports no pace of its own
    kd = AdaptResult(Path("o"), 4, 1_000, 10.0, [{"loss_total": 1.0}],
                     throughput={"tokens_per_s": 100.0, "tokens_per_s_per_process": 100.0, "processes": 1})
    whole = whole_run_pace([sequential, kd])
    assert whole == {"tokens_per_s": 40.0, "tokens_per_s_per_process": 40.0, "processes": 1}  # 4,000 tokens in 100 s
    total = AdaptResult(Path("o"), 12, 4_000, 100.0, kd.curve, throughput=whole)
    assert "4,000 tokens trained, 1.7 min (40 tokens/s, 40 per process)" in adapt_summary(total)[0]
    timed = [AdaptResult(Path("o"), 1, 1_000, 10.0, throughput={"processes": 2, "mfu": 0.3}),
             AdaptResult(Path("o"), 1, 1_000, 30.0, throughput={"processes": 2, "mfu": 0.1})]
    assert whole_run_pace(timed)["mfu"] == 0.15  # weighted by each stage's seconds


def test_a_run_whose_plan_does_not_fit_its_gpus_is_refused_before_anything_loads(tmp_path, monkeypatch):
    import pytest

    from ladderize.adapt.plan import cost
    from ladderize.adapt.entrance import AdaptRequest, adapt_checkpoint
    from ladderize.errors import LadderizeError

    import ladderize.convert.inspect as inspect

    folder = _config_only(tmp_path, "llama-3.1-8b", 16)  # no weights: a run that got as far as loading would fail
    # (so the request's check of the weights' headers, which reads no weight, finds none to read: it passes here)
    monkeypatch.setattr(inspect, "count_parameters", lambda _folder: 8_000_000_000)
    monkeypatch.setattr(cost.Launch, "current", classmethod(lambda cls, _device: cls(1, "h100")))  # on one H100
    with pytest.raises(LadderizeError, match=r"^the plan does not fit: stage 2 \(kd\) needs .* per GPU on 1 x H100"):
        adapt_checkpoint(AdaptRequest.of(folder, str(tmp_path / "out"), seq_len=2048, budget="3B", device="cpu",
                                      teacher=folder))  # (a teacher that is there: the plan is what refuses)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["llama-3.1-8b"]  # nothing written


def test_a_stage_s_batch_that_does_not_fit_is_accumulated_and_checkpointed_where_it_must(tmp_path):
    folder = _config_only(tmp_path, "llama-3b", 14, max_position_embeddings=131_072)  # Llama 3.2 3B's positions
    said: list[str] = []
    split = build_plan(folder, shared=GivenSettings.of({"seq_len": 8192}), budget=parse_budget("3B"), launch="1xH100", priced_only=True, say=said.append)
    kd = split.stages[1].settings  # the preset's 2 sequences do not fit one H100; 1 does, twice per step
    assert (kd["batch_size"], kd["grad_accum"], kd.get("activation_checkpointing")) == (2, 2, None)
    assert split.cost.refusal is None and any("batch 2 = 1 per process x 2 accumulated" in line for line in said)
    checked = build_plan(folder, shared=GivenSettings.of({"seq_len": 32_768}), budget=parse_budget("3B"), launch="1xH100", priced_only=True)
    assert checked.stages[1].settings["activation_checkpointing"] is True and checked.cost.refusal is None
    assert checked.stages[1].settings["batch_size"] == 2  # not one sequence fits without it: with it, the preset's
    mine = build_plan(folder, shared=GivenSettings.of({"seq_len": 8192, "batch_size": 2}), budget=parse_budget("3B"), launch="1xH100", priced_only=True)
    assert (mine.stages[1].settings["batch_size"], mine.stages[1].settings["grad_accum"]) == (2, 2)  # the user's batch,
    assert mine.cost.refusal is None  # accumulated as the memory requires
    theirs = build_plan(folder, shared=GivenSettings.of({"seq_len": 8192, "batch_size": 2, "grad_accum": 1}), budget=parse_budget("3B"), launch="1xH100",
                        priced_only=True)
    assert theirs.cost.refusal is not None and "--grad-accum 2" in theirs.cost.refusal  # the user's accumulation too


def test_the_launch_a_run_is_under_follows_its_device(monkeypatch):
    import torch

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a machine with an H100 that --device cpu leaves idle
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: "NVIDIA H100 80GB HBM3")
    assert Launch.current("cpu") == Launch(2, None)  # no GPU memory to fill or to refuse by
    assert Launch.current("auto") == Launch(2, "h100")


def test_each_stage_is_typed_and_its_settings_checked_before_it_is_sized_or_priced(tmp_path, monkeypatch):
    import pytest

    from ladderize.adapt.plan import budget as budgeting
    from ladderize.errors import LadderizeError

    folder = _config_only(tmp_path, "llama-3.1-8b", 16)
    plan = build_plan(folder, shared=GivenSettings.of({"seq_len": 2048}), launch="8xH100", priced_only=True)
    seq, kd = (stage.resolved for stage in plan.stages)
    assert isinstance(seq, AdaptConfig) and (seq.sequential.local_schedule, seq.training.seq_len, seq.sequential.window) == ("sequential", 2048, 1)
    defaults = AdaptConfig.from_flat(checkpoint="", out="")
    assert (kd.objective.objectives, kd.training.grad_accum, kd.saving.save_minutes) == ("kd", defaults.training.grad_accum, defaults.saving.save_minutes)
    assert kd.training.batch_size == plan.stages[1].settings["batch_size"]  # the filled batch, read through the typed stage

    def never(*_args, **_kwargs):
        raise AssertionError("sized before the settings were checked")

    monkeypatch.setattr(budgeting, "scale_stages", never)
    with pytest.raises(LadderizeError, match="window groups the sequential stage's layers"):  # kd gets window too
        build_plan(folder, shared=GivenSettings.of({"window": 2}), budget=parse_budget("3B"), launch="8xH100", priced_only=True)
