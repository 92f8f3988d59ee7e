"""What a run costs before it starts (``adapt/plan/cost.py``): the true FLOP count, memory per GPU and ``adapt --dry-run``."""

from __future__ import annotations

import json
import time

import pytest

from ladderize.adapt.plan.budget import parse_budget
from ladderize.adapt.plan.cost import FlopCount, JointMemory, Launch, head_parameters, layer_parameters, usable_bytes
from ladderize.checkpoint.shapes import preset
from ladderize.adapt.plan.config import GivenSettings
from tests.cli_helpers import run_cli
from tests.conftest import tiny_config, tiny_model

EIGHT_B = preset("llama-3.1-8b")


def test_layer_and_head_parameters_are_the_models_own():
    model = tiny_model()
    assert layer_parameters(model.config) == sum(p.numel() for p in model.model.layers[0].parameters())
    assert head_parameters(model.config) == model.lm_head.weight.numel()


def test_kd_of_the_upper_half_of_llama_8b_costs_38_gflop_a_token():
    """6 x the 16 trained layers, 4 x the head the gradient passes, 2 x the shared prefix, the teacher's upper 16
    layers and its head: about 38 GFLOP, not the 6 x 8B = 48 GFLOP of counting every parameter as trained."""
    layer, head = layer_parameters(EIGHT_B), head_parameters(EIGHT_B)
    count = FlopCount.for_stage(EIGHT_B, list(range(16, 32)), {"kd"})
    assert count == FlopCount(trained=16 * layer, backward_through=head, forward_only=32 * layer + head)
    assert count.per_token == 6 * 16 * layer + 4 * head + 2 * (32 * layer + head)
    assert 37.5e9 < count.per_token < 38.5e9
    unshared = FlopCount.for_stage(EIGHT_B, list(range(16, 32)), {"kd"}, share_prefix=False)
    assert unshared.forward_only == count.forward_only + 16 * layer  # the prefix runs twice
    every = FlopCount.for_stage(EIGHT_B, list(range(16, 32)), {"kd"}, scope="all")
    assert every.trained == 32 * layer + head and every.backward_through == 0


def test_activation_checkpointing_prices_a_second_forward_of_every_layer_the_backward_passes():
    """Checkpointed, the 16 trained layers of 8B's kd run their forward again in the backward (the head is not
    checkpointed): 2 x 16 layers more executed per token, while the model's count (MFU's) is unchanged."""
    layer = layer_parameters(EIGHT_B)
    plain = FlopCount.for_stage(EIGHT_B, list(range(16, 32)), {"kd"})
    checked = FlopCount.for_stage(EIGHT_B, list(range(16, 32)), {"kd"}, checkpointing=True)
    assert checked.per_token == plain.per_token and plain.executed_per_token == plain.per_token
    assert checked.recomputed == 16 * layer and checked.executed_per_token == plain.per_token + 2 * 16 * layer
    lora = FlopCount.for_stage(EIGHT_B, list(range(16, 32)), {"kd"}, scope="lora", checkpointing=True)
    assert lora.recomputed == 16 * layer  # the frozen layers the adapters' gradient passes
    every = FlopCount.for_stage(EIGHT_B, list(range(16, 32)), {"kd"}, scope="all", checkpointing=True)
    assert every.recomputed == 32 * layer
    local = FlopCount.for_stage(tiny_config(), [1, 2], {"local"}, checkpointing=True)
    assert local.recomputed == 2 * layer_parameters(tiny_config())


def test_a_dry_run_with_checkpointing_says_so_and_prices_the_recompute(tmp_path):
    from ladderize.adapt.entrance import AdaptRequest, dry_run

    folder = _config_only(tmp_path, "llama-3.1-8b", 16)
    priced = {checked: dry_run(AdaptRequest.of(folder, "", batch_size=64, activation_checkpointing=checked, budget="3B"),
                               "8xH100").cost for checked in (False, True)}
    plain, checked = priced[False].stages[-1], priced[True].stages[-1]
    layer = layer_parameters(EIGHT_B)
    assert plain.recomputed_flops_per_token == 0 and checked.recomputed_flops_per_token == 2 * 16 * layer
    assert checked.flops_per_token == plain.flops_per_token
    executed = checked.flops_per_token + checked.recomputed_flops_per_token
    assert checked.seconds == pytest.approx(plain.seconds * executed / plain.flops_per_token, rel=1e-9)
    assert any("recomputed: activation checkpointing" in line for line in priced[True].lines())
    assert not any("recomputed" in line for line in priced[False].lines())


def test_local_alone_stops_at_the_last_converted_layer_and_reads_no_head():
    config = tiny_config()
    layer = layer_parameters(config)
    count = FlopCount.for_stage(config, [1, 2], {"local"})
    assert count == FlopCount(trained=2 * layer, backward_through=0, forward_only=layer + 2 * layer)


def test_sharding_divides_what_the_processes_hold():
    one = JointMemory.estimate(EIGHT_B, list(range(16, 32)), 1, 1024)
    eight = JointMemory.estimate(EIGHT_B, list(range(16, 32)), 8, 1024)
    assert eight.student == one.student / 8 and eight.optimizer == one.optimizer / 8
    assert one.optimizer == 8 * 16 * layer_parameters(EIGHT_B)  # AdamW's two fp32 moments of the trained layers
    assert eight.activations == one.activations and eight.gathered > 0 == one.gathered
    checked = JointMemory.estimate(EIGHT_B, list(range(16, 32)), 8, 1024, checkpointing=True)
    assert checked.activations < eight.activations / 4


def test_a_launch_names_processes_and_a_known_gpu():
    assert Launch.parse("8xH100") == Launch(8, "h100") and Launch.parse(" 2 x h200 ") == Launch(2, "h200")
    from ladderize.errors import LadderizeError

    for bad in ("8xV100", "H100", "0xH100"):
        with pytest.raises(LadderizeError, match="give the launch as NxGPU"):
            Launch.parse(bad)


def _config_only(tmp_path, name: str, first: int, **overrides):
    """A folder holding only a converted config.json of a public shape, ladder on layers ``first`` and up
    (``overrides``: config values set over the shape's)."""
    shape = preset(name)
    values = shape.config_dict()
    layers = values["num_hidden_layers"]
    values.update(model_type="ladder_llama", architectures=["LadderLlamaForCausalLM"],
                  layer_modes=["dense"] * first + ["ladder"] * (layers - first), **overrides)
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(values))
    return folder


def test_dry_run_prices_llama_8b_on_8_h100s_from_its_config_alone(tmp_path, capsys, monkeypatch):
    folder = _config_only(tmp_path, "llama-3.1-8b", 16)
    started = time.perf_counter()
    code, stdout, stderr = run_cli(["adapt", folder, tmp_path / "out", "--dry-run", "8xH100", "--budget", "3B"],
                                   capsys, monkeypatch)
    assert code == 0, stderr
    assert time.perf_counter() - started < 30
    assert "dry run: llama-3.1-8b (ladder 16:32) on 8 x H100; no weights read" in stdout
    assert "38.0 GFLOP per token" in stdout and "memory per GPU:" in stdout and "expected:" in stdout
    assert "saves:" in stdout and stdout.rstrip().endswith("fits")
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.adapt-run").exists()


def test_dry_run_refuses_llama_70b_on_one_h100_in_one_line_naming_what_to_change(tmp_path, capsys, monkeypatch):
    folder = _config_only(tmp_path, "llama-3.1-70b", 40)
    code, stdout, stderr = run_cli(["adapt", folder, tmp_path / "out", "--dry-run", "1xH100"], capsys, monkeypatch)
    assert code == 2
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "does not fit" in errors[0] and "at least" in errors[0] and "GPUs" in errors[0], stderr
    assert "1 x H100" in errors[0] and "GiB usable" in errors[0]


def test_dry_run_here_prices_the_launch_it_runs_under(tmp_path, capsys, monkeypatch):
    folder = _config_only(tmp_path, "llama-3.1-8b", 16)
    monkeypatch.setenv("WORLD_SIZE", "1")
    code, stdout, stderr = run_cli(["adapt", folder, tmp_path / "out", "--dry-run", "here", "--budget", "1M"],
                                   capsys, monkeypatch)
    assert code == 0, stderr
    assert "on 1 x device; no weights read" in stdout and "expected:" not in stdout  # no GPU here: no time estimate
    code, _, stderr = run_cli(["adapt", folder, tmp_path / "out", "--dry-run", "here", "--budget", "30m"], capsys,
                              monkeypatch)
    assert code == 2 and "--dry-run prices a token budget" in stderr


def _numbers(text: str) -> list[float]:
    import re

    return [float(n.replace(",", "")) for n in re.findall(r"\d[\d,]*(?:\.\d+)?", text)]


@pytest.mark.parametrize("extra", [
    [],  # the default recipe: seq-local (2 epochs through each of 16 layers in turn), then kd
    ["--stage", "seq-local:epochs=1.5,window=3,epochs_ramp=0.5,batch_size=3", "--stage", "kd"],  # windows, odd steps
])  # fmt: skip
def test_each_dry_run_lines_arithmetic_holds_as_written(extra, tmp_path, capsys, monkeypatch):
    """``1. seq-local (sequential): A tokens x E epochs x L layers in turn = T tokens = S steps x B tokens``: every
    product a stage line writes is true (a step that is not whole says ``up to``)."""
    folder = _config_only(tmp_path, "llama-3.1-8b", 16)
    code, stdout, stderr = run_cli(["adapt", folder, tmp_path / "out", "--dry-run", "8xH100", "--budget", "3B",
                                    "--seq-len", "2048", "--batch-size", "8", *extra], capsys, monkeypatch)
    assert code == 0, stderr
    stages = [line for line in stdout.splitlines() if line.startswith(("  1. ", "  2. "))]
    assert len(stages) == 2, stdout
    for line in stages:
        arithmetic = line.split("): ", 1)[1].rsplit(", ", 1)[0]  # between the stage's kind and its GFLOP per token
        sides = arithmetic.split(" = ")
        if "(sequential)" in line:
            calibration, epochs, groups = _numbers(sides[0])[:3]
            trained = _numbers(sides[1])[0]
            # the epochs are the groups' mean (a ramp gives each its own), written to 6 digits
            assert calibration * epochs * groups == pytest.approx(trained, rel=1e-5), line
            assert f"{groups:g} {'layers' if 'window=' not in str(extra) else 'windows of up to 3 layers'} in turn" in line
            if len(sides) == 3:
                steps, per_step = _numbers(sides[2])
                assert steps * per_step == trained, line
            else:
                steps, per_step = _numbers(sides[1].split(" in ", 1)[1])
                assert "steps of up to" in line and trained < steps * per_step < trained + groups * per_step, line
        else:
            tokens, (steps, per_step) = _numbers(sides[0])[0], _numbers(sides[1])
            assert len(sides) == 2 and tokens == steps * per_step, line


def test_the_memory_plan_counts_the_kd_head_and_the_activations_as_autograd_saves_them(tmp_path):
    """At Llama-3.1-8B's shape: 200,840 bytes per token and layer (bf16: 6 x 4,096 + 2 x 1,024 + 4 x 14,336 values, the
    two norms' float32 inputs and inverse norms, 32 heads' float32 log-sum-exp); sharded kd on 8 processes holds the
    gathered bf16 head, the student's bf16 logits and their gradient, 6 float32 blocks of 1,046 rows and the rows
    around the head; the 8B dry run fits at its automatic batch with the margin named."""
    from ladderize.adapt.plan.cost import activation_bytes_per_token
    from ladderize.adapt.plan.adapt_plan import FILL_MARGIN, build_plan

    folder = _config_only(tmp_path, "llama-3.1-8b", 16)
    assert activation_bytes_per_token(EIGHT_B) == 200_840
    tokens, vocab, hidden = 6 * 2048, 128_256, 4096
    memory = JointMemory.estimate(EIGHT_B, list(range(16, 32)), 8, tokens, head_loss=True, teacher_head=True)
    assert memory.head == vocab * hidden * 2  # 0.98 GiB
    assert memory.logits == 2 * tokens * vocab * 2 + 6 * 1046 * vocab * 4
    assert memory.rows == tokens * hidden * (4 + 3 * 2)
    assert memory.activations == tokens * 16 * 200_840
    without = JointMemory.estimate(EIGHT_B, list(range(16, 32)), 8, tokens)
    assert memory.total == without.total + memory.head + memory.logits + memory.rows
    said: list[str] = []
    plan = build_plan(folder, shared=GivenSettings.of({"seq_len": 2048}), budget=parse_budget("3B"), launch="8xH100", priced_only=True, say=said.append)
    kd = plan.cost.stages[-1]
    assert plan.cost.refusal is None and kd.memory_bytes <= (1 - FILL_MARGIN) * usable_bytes(Launch(8, "h100").memory_bytes)
    line = next(line for line in plan.cost.lines() if "memory per GPU" in line and "LM head" in line)
    assert "LM head 1.0 GiB" in line and "logits and blocks" in line and "head rows" in line
    assert any("with 5% of it left free" in line for line in said)


def test_the_8b_dry_run_prices_each_stages_writes_in_their_dtypes(tmp_path, capsys, monkeypatch):
    """The stage-1 checkpoint in float32 (8.03e9 x 4 bytes = 29.9 GiB), OUT in the checkpoint's bf16 (15.0 GiB), each
    with its write time at the stated disk rate; the teacher's states only where the sharded kd reads them all."""
    import json

    from ladderize.adapt.plan.cost import DISK_BYTES_PER_S

    folder = _config_only(tmp_path, "llama-3.1-8b", 16)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "dtype": "bfloat16"}))  # as Meta's checkpoint says
    code, stdout, stderr = run_cli(["adapt", folder, tmp_path / "out", "--dry-run", "8xH100", "--budget", "3B"],
                                   capsys, monkeypatch)
    assert code == 0, stderr
    writes = [line.strip() for line in stdout.splitlines() if line.strip().startswith("writes:")]
    assert len(writes) == 2, stdout
    assert writes[0].startswith("writes: its checkpoint (float32) 29.9 GiB") and "teacher's states" not in writes[0]
    assert writes[1].startswith("writes: OUT (bfloat16) 15.0 GiB: about ") and f"at {DISK_BYTES_PER_S / 1e9:g} GB/s" in writes[1]
    assert "about 16s at" in writes[1]  # 16.06e9 bytes at 1 GB/s
    # the free space each target needs: OUT, and the run folder (stage 1's checkpoint and one training state)
    assert "  disk: free space needed, OUT 15.0 GiB, the run folder 68.9 GiB" in stdout, stdout
