"""--device/--dtype in every adapt stage, driven on the CPU through the same plumbing a GPU run takes.

The CUDA side of these paths (parameters and states on the GPU, the loss curve against the CPU's,
peak memory flat in depth) is in ``tests/gpu/test_adapt_gpu.py``.
"""

from __future__ import annotations

import json

import pytest
import torch

from ladderize.adapt.plan.config import AdaptConfig
from ladderize.adapt.plan.settings_sections import SequentialSettings
from ladderize.adapt.stage_run import adapt
from tests.adapt.test_streaming import _config, assert_same_checkpoint
from tests.cli_helpers import error_lines, run_cli


def _devices_seen(record: list) -> callable:
    def progress(info, model) -> None:
        layer = model.model.layers[info.layer]
        record.append({p.device.type for p in layer.parameters()})

    return progress


@pytest.mark.parametrize("stream", [True, False])
def test_sequential_on_the_named_device_equals_the_default_path(stream, ladder_dir, text_file, tmp_path):
    seen: list = []
    named = adapt(_config(ladder_dir, tmp_path / "named", text_file, device="cpu", stream_layers=stream),
                  progress=_devices_seen(seen))
    default = adapt(_config(ladder_dir, tmp_path / "default", text_file, stream_layers=stream))
    assert seen and all(devices == {"cpu"} for devices in seen)  # the layer in training is where it was asked
    assert [r["loss_local"] for r in named.curve] == [r["loss_local"] for r in default.curve]
    assert_same_checkpoint(tmp_path / "named", tmp_path / "default")


def test_sequential_bf16_autocast_trains_near_fp32_and_keeps_fp32_weights(ladder_dir, text_file, tmp_path):
    # lr 1e-3 (the measured sequential rate): per-step losses measured 0.1-2.7% apart; 3e-3 overshoots and reaches 6%
    fp32 = adapt(_config(ladder_dir, tmp_path / "fp32", text_file, device="cpu", dtype="float32", lr=1e-3))
    bf16 = adapt(_config(ladder_dir, tmp_path / "bf16", text_file, device="cpu", dtype="bfloat16", lr=1e-3))
    a, b = [r["loss_local"] for r in fp32.curve], [r["loss_local"] for r in bf16.curve]
    assert a != b  # autocast really ran in bf16
    assert all(abs(x - y) <= 0.05 * abs(x) for x, y in zip(a, b)), (a, b)  # bf16 keeps 3 digits: a few % apart
    config = json.loads((tmp_path / "bf16" / "config.json").read_text())
    assert config.get("dtype", config.get("torch_dtype")) == "float32"  # the master weights stay fp32


def test_sequential_refuses_float16_in_one_line(ladder_dir, text_file, tmp_path, capsys, monkeypatch):
    args = ["adapt", ladder_dir, tmp_path / "out", "--data", text_file, "--local-schedule", "sequential", "--tokens", 64,
            "--seq-len", 32, "--dtype", "float16", "--device", "cpu"]
    code, _, stderr = run_cli(args, capsys, monkeypatch)
    lines = error_lines(stderr)
    assert code == 2 and len(lines) == 1 and "float16" in lines[0] and "bfloat16" in lines[0], stderr


def test_states_go_to_the_device_when_they_fit_else_pinned_host_memory(monkeypatch, tmp_path):
    from ladderize.adapt.sequential import sequential_run

    config = AdaptConfig.from_flat(checkpoint="c", out=str(tmp_path / "o"))
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (16 * 2**20, 80 * 2**30))  # 16 MiB free
    fits = sequential_run.state_store(config, cuda, tmp_path, 2**20)  # 8 x 1 MiB <= half of 16 MiB
    assert fits.device == cuda and fits.where == "cuda:0 memory"
    spills = sequential_run.state_store(config, cuda, tmp_path, 2**21)  # 8 x 2 MiB > 8 MiB
    assert spills.device.type == "cpu" and not spills.on_disk
    assert spills.pin == torch.cuda.is_available()  # pinned where a CUDA runtime can pin
    config = config.with_fields(SequentialSettings, states="disk")
    assert sequential_run.state_store(config, cuda, tmp_path, 1).on_disk  # asked for: disk, whatever fits
    assert sequential_run.state_store(AdaptConfig.from_flat(checkpoint="c", out="o"), torch.device("cpu"), tmp_path, 2**40).where == "memory"


def test_kd_with_bf16_autocast_on_cpu_runs_near_fp32(ladder_dir, text_file, tmp_path):
    settings = dict(checkpoint=str(ladder_dir), data=str(text_file), objectives="kd", tokens=3 * 2 * 32, seq_len=32,
                    batch_size=2, lr=1e-3, device="cpu")
    fp32 = adapt(AdaptConfig.from_flat(out=str(tmp_path / "fp32"), dtype="float32", **settings))
    bf16 = adapt(AdaptConfig.from_flat(out=str(tmp_path / "bf16"), dtype="bfloat16", **settings))
    a, b = [r["loss_kd"] for r in fp32.curve], [r["loss_kd"] for r in bf16.curve]
    assert len(a) == len(b) == 3 and a != b
    assert all(abs(x - y) <= 0.1 * abs(x) + 1e-3 for x, y in zip(a, b)), (a, b)
    from ladderize.checkpoint.io import read_provenance

    assert read_provenance(tmp_path / "bf16")["history"][-1]["precision"] == "bf16-autocast"
    assert read_provenance(tmp_path / "fp32")["history"][-1]["precision"] == "float32"


def test_sensitivity_on_the_named_device_equals_the_default(dense_dir, text_file):
    from ladderize.convert.sensitivity import checkpoint_sensitivity
    from ladderize.model import LayerMode

    args = (dense_dir, LayerMode.SPD, 3, str(text_file), 2, 32, "all")
    named = checkpoint_sensitivity(*args, device="cpu")
    default = checkpoint_sensitivity(*args)
    assert named.to_json() == default.to_json() and named.dense_ppl > 1


def test_head_grouping_on_the_named_device_equals_the_default(dense_dir, text_file, tmp_path):
    from ladderize.convert.convert_support import head_group_checkpoint
    from tests.adapt.conftest import convert

    a = convert(dense_dir, tmp_path / "a", spd="0:4", spd_tp_size=3)
    b = convert(dense_dir, tmp_path / "b", spd="0:4", spd_tp_size=3)
    named = head_group_checkpoint(a, teacher=str(dense_dir), data=str(text_file), samples=2, seq_len=32, device="cpu")
    default = head_group_checkpoint(b, teacher=str(dense_dir), data=str(text_file), samples=2, seq_len=32)
    assert named == default and set(named) == {0, 1, 2, 3}
    assert_same_checkpoint(a, b)


def test_sample_records_its_device_and_dtype_and_equals_the_default(dense_dir, tmp_path):
    from ladderize.adapt.teacher_text import sample_text

    kwargs = dict(sequences=4, new_tokens=8, batch_size=2)
    named = sample_text(str(dense_dir), tmp_path / "named.jsonl", device="cpu", **kwargs)
    default = sample_text(str(dense_dir), tmp_path / "default.jsonl", **kwargs)
    assert named.out.read_bytes() == default.out.read_bytes() and named.records == 4
    provenance = json.loads((tmp_path / "named.jsonl.json").read_text())
    assert provenance["device"] == "cpu" and provenance["dtype"] == "float32"
    bf16 = sample_text(str(dense_dir), tmp_path / "bf16.jsonl", device="cpu", dtype="bf16", **kwargs)
    assert json.loads((tmp_path / "bf16.jsonl.json").read_text())["dtype"] == "bfloat16" and bf16.records == 4


def test_a_stage_puts_the_process_wide_tf32_switches_back(ladder_dir, text_file, tmp_path, monkeypatch):
    """A CUDA stage turns TF32 on for its training (``TrainingPrecision.apply``); what runs after it in the same
    process (the demo's eval) must compute as before. Here ``apply`` turns them on as it would on CUDA."""
    from ladderize.checkpoint.placement import TrainingPrecision

    def apply_as_on_cuda(self) -> None:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True

    monkeypatch.setattr(TrainingPrecision, "apply", apply_as_on_cuda)
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        seen: list = []
        adapt(_config(ladder_dir, tmp_path / "out", text_file, device="cpu"),
              progress=lambda info, model: seen.append(torch.backends.cuda.matmul.allow_tf32))
        after = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before
    assert seen and all(seen)  # on while the stage trained
    assert after == (False, False)
