"""What a run costs before it starts (``adapt/cost.py``): the true FLOP count, memory per GPU and ``adapt --dry-run``."""

from __future__ import annotations

import json
import time

import pytest

from ladderize.adapt.cost import FlopCount, JointMemory, Launch, head_parameters, layer_parameters
from ladderize.checkpoint.shapes import preset
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
                                    "--seq-len", "2048", "--batch-size", "4", *extra], capsys, monkeypatch)
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
