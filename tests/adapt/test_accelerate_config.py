"""A user's Accelerate config (``adapt/plan/accelerate_config.py``): each setting mapped onto adapt's or refused in one
line; ``accelerate launch`` with an FSDP config trains what torchrun does with the same settings, bit for bit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from ladderize.adapt.plan.accelerate_config import from_accelerate
from ladderize.adapt.plan.config import GivenSettings
from ladderize.errors import LadderizeError
from tests.adapt.test_sharded import _env, _torchrun, launch_failure

# what `accelerate launch` (1.x) sets for a config with distributed_type FSDP, full sharding, activation checkpointing
FSDP_ENV = {"ACCELERATE_MIXED_PRECISION": "no", "ACCELERATE_DYNAMO_BACKEND": "NO", "ACCELERATE_USE_FSDP": "true",
            "FSDP_VERSION": "2", "FSDP_SHARDING_STRATEGY": "FULL_SHARD", "FSDP_RESHARD_AFTER_FORWARD": "true",
            "FSDP_OFFLOAD_PARAMS": "false", "FSDP_ACTIVATION_CHECKPOINTING": "true",
            "FSDP_ACTIVATION_CHECKPOINTING_OFFLOAD": "false", "FSDP_STATE_DICT_TYPE": "SHARDED_STATE_DICT"}


def test_an_fsdp_config_maps_onto_the_sharded_training_and_says_so():
    mapped, note = from_accelerate(GivenSettings(), FSDP_ENV)
    assert mapped.record() == {"shard": "fsdp", "activation_checkpointing": True}
    assert mapped.config.parallelism.shard == "fsdp" and mapped.config.parallelism.activation_checkpointing is True
    assert note.startswith("Accelerate config: FSDP as --shard fsdp") and "state_dict_type" in note and "version" in note
    mapped, note = from_accelerate(GivenSettings(), {**FSDP_ENV, "ACCELERATE_MIXED_PRECISION": "bf16",
                                        "ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "4", "ACCELERATE_DYNAMO_BACKEND": "INDUCTOR"})
    assert mapped.record() == {"shard": "fsdp", "activation_checkpointing": True, "mixed_precision": "bf16",
                               "grad_accum": 4, "compile": True}
    assert mapped.config.training.grad_accum == 4
    assert from_accelerate(GivenSettings(), {}) == (GivenSettings(), None)  # not launched by Accelerate: nothing taken, nothing said


@pytest.mark.parametrize("change,words", [
    ({"FSDP_OFFLOAD_PARAMS": "true"}, "fsdp_offload_params"),
    ({"FSDP_SHARDING_STRATEGY": "SHARD_GRAD_OP"}, "fsdp_sharding_strategy SHARD_GRAD_OP"),
    ({"FSDP_SHARDING_STRATEGY": "4"}, "fsdp_sharding_strategy 4"),
    ({"FSDP_RESHARD_AFTER_FORWARD": "false"}, "fsdp_reshard_after_forward false"),
    ({"FSDP_ACTIVATION_CHECKPOINTING_OFFLOAD": "true"}, "fsdp_activation_checkpointing_offload"),
    ({"ACCELERATE_USE_DEEPSPEED": "true"}, "DeepSpeed"),
    ({"ACCELERATE_MIXED_PRECISION": "fp8"}, "mixed_precision fp8"),
    ({"ACCELERATE_DYNAMO_BACKEND": "AOT_EAGER"}, "dynamo_backend AOT_EAGER"),
])
def test_what_adapt_does_not_do_is_refused_in_one_line(change, words):
    with pytest.raises(LadderizeError, match=words) as refused:
        from_accelerate(GivenSettings(), {**FSDP_ENV, **change})
    assert "\n" not in str(refused.value)


def test_the_command_line_and_the_config_must_agree():
    with pytest.raises(LadderizeError, match="sets shard to 'fsdp', the command line to 'ddp'"):
        from_accelerate(GivenSettings.of({"shard": "ddp"}), FSDP_ENV)
    agreeing = GivenSettings.of({"shard": "fsdp", "activation_checkpointing": True})
    assert from_accelerate(agreeing, FSDP_ENV)[0].config.parallelism.shard == "fsdp"


FSDP_YAML = """compute_environment: LOCAL_MACHINE
distributed_type: FSDP
num_processes: 2
num_machines: 1
machine_rank: 0
mixed_precision: 'no'
use_cpu: true
fsdp_config:
  fsdp_sharding_strategy: FULL_SHARD
  fsdp_offload_params: {offload}
  fsdp_activation_checkpointing: true
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_state_dict_type: SHARDED_STATE_DICT
  fsdp_version: 2
"""


def test_accelerate_launch_with_an_fsdp_config_trains_as_torchrun(ladder_dir, text_file, tmp_path):
    args = ["adapt", str(ladder_dir), None, "--data", str(text_file), "--objective", "kd", "--tokens", "256",
            "--seq-len", "32", "--batch-size", "2", "--lr", "1e-3", "--dtype", "float32", "--device", "cpu", "--no-compile"]

    def with_out(out: Path) -> list[str]:
        return [str(out) if item is None else item for item in args]

    env = _env(tmp_path)
    runs = {}
    for offload in ("false", "true"):
        config = tmp_path / f"fsdp-{offload}.yaml"
        config.write_text(FSDP_YAML.format(offload=offload))
        launch = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config), "--main_process_port",
                  "0", "-m", "ladderize.cli", *with_out(tmp_path / f"accelerate-{offload}")]
        runs[offload] = subprocess.run(launch, env=env, capture_output=True, text=True, timeout=300)
    assert runs["false"].returncode == 0, launch_failure(runs["false"].stderr)
    assert "Accelerate config: FSDP as --shard fsdp" in runs["false"].stderr
    assert "sharded over 2 processes with FSDP2" in runs["false"].stdout + runs["false"].stderr
    refused = runs["true"]
    errors = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert refused.returncode != 0 and len(errors) == 1 and "fsdp_offload_params" in errors[0]
    assert not (tmp_path / "accelerate-true").exists()

    done = subprocess.run([*_torchrun(2), "-m", "ladderize.cli", *with_out(tmp_path / "torchrun"), "--shard", "fsdp",
                           "--activation-checkpointing"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, launch_failure(done.stderr)
    a, b = load_file(tmp_path / "accelerate-false" / "model.safetensors"), load_file(tmp_path / "torchrun" / "model.safetensors")
    assert all(torch.equal(a[name], b[name]) for name in a)


def test_the_replicated_training_refuses_an_fsdp_config_it_would_not_shard(ladder_dir, text_file, tmp_path, monkeypatch):
    """The replicated training is Accelerate's DDP only: handed an FSDP config (through the Python API, where the
    command line would have mapped it onto the sharded training) it says so in one line, before any step."""
    from ladderize.adapt.plan.config import AdaptConfig
    from ladderize.adapt.stage_run import adapt

    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    config = AdaptConfig.from_flat(checkpoint=str(ladder_dir), out=str(tmp_path / "out"), data=str(text_file), objectives="kd",
                         tokens=64, seq_len=32, batch_size=1, dtype="float32", device="cpu", compile=False, shard="ddp")
    with pytest.raises(LadderizeError, match="an Accelerate FSDP config runs the sharded training"):
        adapt(config)
    assert not (tmp_path / "out").exists()


def test_the_launch_arguments_are_found_in_each_form_of_accelerate_launch():
    from ladderize.adapt.plan.accelerate_config import launch_arguments

    tail = ["--gradient_accumulation_steps", "2", "-m", "ladderize.cli", "adapt"]
    assert launch_arguments(["/usr/bin/python3", "/venv/bin/accelerate", "launch", *tail]) == tail
    assert launch_arguments(["python", "-m", "accelerate.commands.launch", *tail]) == tail
    assert launch_arguments(["/venv/bin/accelerate-launch", *tail]) == tail
    assert launch_arguments(["torchrun", "--nproc_per_node", "2", "-m", "ladderize.cli", "adapt"]) is None
    assert launch_arguments(["/venv/bin/accelerate", "config"]) is None


def test_accelerate_launch_gradient_accumulation_steps_trains_as_grad_accum(ladder_dir, text_file, tmp_path):
    """``accelerate launch --gradient_accumulation_steps 2`` (which Accelerate exports only for DeepSpeed) reaches adapt
    from the launch's command line: the same weights, bit for bit, as ``--grad-accum 2`` without a launcher; and a
    ``--grad-accum`` that disagrees with it is refused in one line."""
    args = ["adapt", str(ladder_dir), None, "--data", str(text_file), "--objective", "kd", "--tokens", "256",
            "--seq-len", "32", "--batch-size", "2", "--lr", "1e-3", "--dtype", "float32", "--device", "cpu", "--no-compile"]

    def with_out(out: Path) -> list[str]:
        return [str(out) if item is None else item for item in args]

    env = _env(tmp_path)
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "1", "--cpu", "--main_process_port",
              "0", "--gradient_accumulation_steps", "2", "-m", "ladderize.cli"]
    launched = subprocess.run([*launch, *with_out(tmp_path / "accelerate")], env=env, capture_output=True, text=True,
                              timeout=300)
    assert launched.returncode == 0, launch_failure(launched.stderr)
    assert "gradient accumulation steps 2" in launched.stderr and "x 2 accumulated" in launched.stderr, launched.stderr[-3000:]
    plain = subprocess.run([sys.executable, "-m", "ladderize.cli", *with_out(tmp_path / "plain"), "--grad-accum", "2"],
                           env=env, capture_output=True, text=True, timeout=300)
    assert plain.returncode == 0, plain.stderr[-3000:]
    a, b = load_file(tmp_path / "accelerate" / "model.safetensors"), load_file(tmp_path / "plain" / "model.safetensors")
    assert all(torch.equal(a[name], b[name]) for name in a)
    refused = subprocess.run([*launch, *with_out(tmp_path / "refused"), "--grad-accum", "1"], env=env, capture_output=True,
                             text=True, timeout=300)
    errors = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert refused.returncode != 0 and errors and "grad_accum" in errors[0], refused.stderr[-3000:]
    assert not (tmp_path / "refused").exists()
