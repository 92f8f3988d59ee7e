"""How a joint stage runs (``adapt/plan/strategy_choice.py``): one function chooses one process, replicated (DDP) or sharded
(FSDP2), and the plan, the pricing, the dry run's advice and the run all read it, so what is priced is what runs."""

from __future__ import annotations

import pytest

from ladderize.adapt.plan.budget import parse_budget
from ladderize.adapt.plan.config import AdaptConfig
from ladderize.adapt.plan.cost import JointMemory, Launch, layer_parameters, usable_bytes
from ladderize.adapt.plan.adapt_plan import build_plan
from ladderize.adapt.plan.strategy_choice import ONE_PROCESS, REPLICATED, SETTINGS, SHARDED, choose_strategy
from ladderize.checkpoint.io import load_config
from ladderize.checkpoint.shapes import ModelShape
from ladderize.errors import LadderizeError
from ladderize.adapt.plan.config import GivenSettings
from tests.adapt.test_cost import _config_only
from tests.cli_helpers import run_cli

WHOLE_WEIGHTS = [({"train": "lora"}, "--train lora"), ({"ema": 0.999}, "ema"), ({"head_grouping": True}, "--head-grouping"),
                 ({"interpolate": 0.5}, "interpolate"), ({"train": "all"}, "--train all")]


def typed(**settings) -> AdaptConfig:
    """A stage's settings (flat names) over the sections' defaults."""
    return AdaptConfig.from_flat(settings)


def test_one_function_chooses_the_strategy_from_the_settings_and_the_launch():
    assert choose_strategy(typed(), 1).kind == ONE_PROCESS and choose_strategy(typed(), Launch(8, "h100")).kind == SHARDED
    assert choose_strategy(typed(shard="ddp"), 8).kind == REPLICATED
    assert choose_strategy(typed(shard="ddp"), 1).kind == ONE_PROCESS
    assert choose_strategy(typed(shard="fsdp"), 1).kind == SHARDED  # one process sharded, when asked
    assert [entry.flag for entry in SETTINGS] == [flag for _, flag in WHOLE_WEIGHTS]  # the table, in its order
    for settings, flag in WHOLE_WEIGHTS:
        chosen = choose_strategy(typed(**settings), 8)
        assert chosen.kind == REPLICATED and chosen.reason.startswith(flag), (settings, chosen)
        assert choose_strategy(typed(**settings), 1).kind == ONE_PROCESS
        with pytest.raises(LadderizeError, match=f"--shard fsdp trains the converted layers: {flag} needs"):
            choose_strategy(typed(**settings, shard="fsdp"), 8)
    config = AdaptConfig.from_flat(checkpoint="c", out="o", ema=0.9)  # a run's settings choose as a plan's stage does
    assert choose_strategy(config, 8) == choose_strategy(typed(ema=0.9), 8)


def _kd_plan(folder, **settings):
    """The single kd stage of ``--stage kd:...`` at 3B tokens of 2,048 on 8 x H100, priced from config.json alone."""
    stage = "kd" + (":" + ",".join(f"{k}={v}" for k, v in settings.items()) if settings else "")
    plan = build_plan(folder, shared=GivenSettings.of({"seq_len": 2048}), stages=[stage], budget=parse_budget("3B"), launch="8xH100", priced_only=True)
    return plan, plan.cost.stages[-1]


@pytest.mark.parametrize("settings", [{"train": "lora"}, {"ema": 0.999}, {"train": "all"}])
def test_a_setting_that_keeps_the_whole_weights_is_priced_replicated_and_advised_what_fits(tmp_path, settings):
    """``--stage kd:train=lora``, ``kd:ema=0.999`` and ``kd:train=all`` run replicated on 8 H100s (DDP: the whole fp32
    student and teacher on every GPU): they are priced so, not as the sharded stage's 59 GiB, and a refusal advises
    only changes that fit under the strategy they would run with."""
    folder = _config_only(tmp_path, "llama-3.1-8b", 16)
    config, converted, usable = load_config(folder), list(range(16, 32)), usable_bytes(Launch(8, "h100").memory_bytes)
    plan, stage = _kd_plan(folder, **settings)
    step = plan.steps[-1]
    assert choose_strategy(plan.stages[-1].resolved, plan.launch).kind == REPLICATED
    assert stage.strategy.startswith("replicated over 8 processes with DDP")
    every = ModelShape.from_config(config, "model").num_parameters
    memory = JointMemory(**stage.memory)
    assert memory.student >= 4 * every and memory.teacher == 4 * every and memory.gathered == 0  # whole, on every GPU
    local = -(-step["batch_size"] // 8)  # the global batch's rows on one of the 8 processes
    assert memory.total == JointMemory.estimate(config, converted, 8, 2048 * local, sharded=False,
                                                scope=step.get("train", "converted"), ema=bool(step.get("ema")),
                                                checkpointing=bool(step.get("activation_checkpointing")),
                                                head_loss=True, teacher_head=True).total
    sharded = JointMemory.estimate(config, converted, 8, 2048 * local,
                                   checkpointing=bool(step.get("activation_checkpointing")), head_loss=True,
                                   teacher_head=True)
    assert memory.total > sharded.total + 50 * 2**30  # what the sharded pricing missed
    if settings.get("train") == "all":
        assert memory.gradients == 4 * every and memory.optimizer == 8 * every  # every parameter trains, not 16 layers
    if plan.cost.refusal is None:
        assert memory.total <= usable
        return
    assert memory.total > usable
    advice = plan.cost.refusal.split("usable: ", 1)[1]
    assert "GPUs" not in advice  # more GPUs replicate the same weights: they would not fit either
    same = {"batch_size": step["batch_size"], **({"activation_checkpointing": "true"}
                                                  if step.get("activation_checkpointing") else {})}
    for fix in advice.split("; "):  # each fix, priced for the strategy it runs with, fits
        if fix.startswith("without "):
            off = {"train": "converted"} if "train" in settings else {"ema": 0.0}
            fixed = _kd_plan(folder, **{**settings, **off, **same})[1]
            assert fixed.strategy.startswith("sharded") and fixed.memory_bytes <= usable
        elif fix == "--activation-checkpointing":
            fixed = _kd_plan(folder, **{**settings, **same, "activation_checkpointing": "true"})[1]
            assert fixed.memory_bytes <= usable
        else:
            assert fix.startswith("--batch-size "), fix


def test_lora_ema_and_train_all_on_8_h100s_in_the_dry_run(tmp_path, capsys, monkeypatch):
    folder = _config_only(tmp_path, "llama-3.1-8b", 16)
    base = ["adapt", folder, tmp_path / "out", "--budget", "3B", "--seq-len", "2048", "--dry-run", "8xH100"]
    code, stdout, stderr = run_cli(base, capsys, monkeypatch)
    assert code == 0, stderr
    assert "runs sharded over 8 processes with FSDP2" in stdout and "expected:" in stdout and stdout.rstrip().endswith("fits")
    for setting, name in (("kd:ema=0.999", "ema"), ("kd:train=all", "--train all")):
        code, stdout, stderr = run_cli([*base, "--stage", setting], capsys, monkeypatch)
        assert code == 2, stdout
        assert f"runs replicated over 8 processes with DDP: {name} needs the whole weights" in stdout
        error = [line for line in stderr.splitlines() if line.startswith("error:")][0]
        assert f"without {name} (then sharded:" in error and "GPUs" not in error, error
    code, stdout, stderr = run_cli([*base, "--stage", "kd:train=lora"], capsys, monkeypatch)
    assert "runs replicated over 8 processes with DDP: --train lora" in stdout and "student 30.0 GiB" in stdout


def test_shard_ddp_is_advised_only_what_fits_replicated(tmp_path):
    """Under --shard ddp, more GPUs and a smaller batch do not bring the whole student and teacher under one H100:
    the advice is to shard, which fits."""
    folder = _config_only(tmp_path, "llama-3.1-8b", 16)
    plan = build_plan(folder, shared=GivenSettings.of({"seq_len": 2048, "shard": "ddp"}), budget=parse_budget("3B"), launch="8xH100", priced_only=True)
    refusal = plan.cost.refusal
    assert refusal is not None and "replicated over 8 processes with DDP: --shard ddp" in refusal
    advice = refusal.split("usable: ", 1)[1]
    assert "GPUs" not in advice and "--batch-size" not in advice and "--activation-checkpointing" not in advice
    assert advice.startswith("without --shard ddp (then sharded:")


def test_gradient_accumulation_prices_the_unsharded_gradients_fsdp2_keeps(tmp_path):
    """Between micro-batches FSDP2 keeps the accumulated gradients unsharded, in fp32 (``sharded.py`` syncs on the
    last micro-batch only): 16 layers of 8B, 13 GiB on every GPU."""
    folder = _config_only(tmp_path, "llama-3.1-8b", 16)
    layer = layer_parameters(load_config(folder))

    def kd(accum: int, **shared):
        plan = build_plan(folder, shared=GivenSettings.of({"seq_len": 2048, "grad_accum": accum, **shared}), budget=parse_budget("3B"), launch="8xH100",
                          priced_only=True)
        return plan.stages[-1], plan.cost.stages[-1]

    (_, one), (_, two) = kd(1, batch_size=8), kd(2, batch_size=16)  # one sequence per micro-batch
    assert two.strategy == one.strategy == "sharded over 8 processes with FSDP2"
    assert two.memory["accumulated"] == 4 * 16 * layer and one.memory["accumulated"] == 0
    assert two.memory_bytes == one.memory_bytes + 4 * 16 * layer
    (filled_one, _), (filled_two, cost) = kd(1), kd(2)
    # the micro-batch per process filled leaves room for them (the global batch is 8 processes x accumulation x it)
    assert filled_two.settings["batch_size"] // 16 < filled_one.settings["batch_size"] // 8
    assert cost.memory_bytes <= usable_bytes(Launch(8, "h100").memory_bytes)


@pytest.mark.parametrize("settings, world", [({}, 1), ({}, 2), ({"shard": "ddp"}, 2), ({"ema": 0.9}, 2),
                                             ({"shard": "fsdp"}, 1), ({"train": "lora"}, 2)])
def test_the_run_trains_by_the_strategy_its_plan_priced(settings, world, ladder_dir, text_file, tmp_path, monkeypatch):
    """The run (``train.adapt``) and the plan (``cost.plan_run``) read one choice: a launch of ``world`` processes
    runs the training the plan's stage names."""
    from ladderize.adapt.train import replicated
    from ladderize.adapt.train import sharded
    from ladderize.adapt.stage_run import adapt

    ran: list[str] = []

    def built(name: str):
        def run(*_args, **_kwargs):
            ran.append(name)
            raise _Built

        return run

    monkeypatch.setattr(sharded, "ShardedRun", built(SHARDED))
    monkeypatch.setattr(replicated, "ReplicatedRun", built("replicated"))
    monkeypatch.setenv("WORLD_SIZE", str(world))
    shared = {"data": str(text_file), "objectives": "kd", "seq_len": 32, "batch_size": 2, "tokens": 256, "device": "cpu",
              **settings}
    plan = build_plan(ladder_dir, single=GivenSettings.of(shared), launch=Launch(world, "h100"), priced_only=True)
    with pytest.raises(_Built):
        adapt(plan.stages[0].config(str(ladder_dir), str(tmp_path / "out")))
    chosen = choose_strategy(plan.stages[0].resolved, world)
    assert plan.cost.stages[0].strategy == chosen.describe()
    assert ran == [SHARDED if chosen.shards else "replicated"]



class _Built(Exception):
    """The run the trainer built: the test stops there."""
