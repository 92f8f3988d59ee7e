"""The one device and dtype rule (``ladderize.checkpoint.placement``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ladderize.checkpoint import placement
from ladderize.errors import LadderizeError
from ladderize.checkpoint.placement import (
    TrainingPrecision, check_device, check_dtype, inference_dtype, parse_dtype, resolve_device, runtime_dtype,
    training_precision,
)


def test_dtype_names_and_aliases():
    assert parse_dtype("bf16") is torch.bfloat16 and parse_dtype("FLOAT32") is torch.float32
    assert parse_dtype("auto") is None and parse_dtype(None, auto=torch.float16) is torch.float16
    assert parse_dtype(torch.float16) is torch.float16
    assert check_dtype("half") == "float16"
    with pytest.raises(LadderizeError, match="unknown dtype 'int8'"):
        parse_dtype("int8")


def test_runtime_dtype_is_bf16_on_cuda_and_fp32_on_cpu():
    assert runtime_dtype("auto", "cpu") is torch.float32
    assert runtime_dtype("auto", torch.device("cuda", 1)) is torch.bfloat16
    assert runtime_dtype("fp16", "cpu") is torch.float16


def test_training_precision_rule(monkeypatch):
    monkeypatch.setattr(placement, "cpu_bf16", lambda: False)
    assert training_precision(None, "cpu") == TrainingPrecision(None, False)  # a CPU without native bf16: plain fp32
    monkeypatch.setattr(placement, "cpu_bf16", lambda: True)
    assert training_precision(None, "cpu") == TrainingPrecision(torch.bfloat16, False)  # with it: bf16 autocast
    assert training_precision("auto", "cpu").name == "bf16-autocast"
    assert training_precision("float32", "cpu") == TrainingPrecision(None, False)  # --dtype float32 keeps fp32
    auto_cuda = training_precision(None, torch.device("cuda", 1))
    assert auto_cuda == TrainingPrecision(torch.bfloat16, True) and auto_cuda.mixed_precision == "bf16"
    assert auto_cuda.name == "bf16-autocast+tf32"
    assert training_precision("float32", "cuda") == TrainingPrecision(None, False)  # exact fp32: TF32 off
    assert training_precision("bf16", "cpu") == TrainingPrecision(torch.bfloat16, False)
    assert training_precision("auto", "cpu", mixed_precision="bf16").autocast is torch.bfloat16  # --mixed-precision
    assert training_precision("fp16", "cuda").mixed_precision == "fp16"
    with pytest.raises(LadderizeError, match="unknown dtype"):
        training_precision("fp13", "cpu")


def test_inference_dtype_is_the_checkpoints_on_cuda_and_fp32_on_cpu():
    assert inference_dtype(None, "cpu") is torch.float32 and inference_dtype("auto", torch.device("cuda", 0)) is None
    assert inference_dtype("bf16", "cpu") is torch.bfloat16


def test_device_rule(monkeypatch):
    assert resolve_device("cpu") == torch.device("cpu")
    assert check_device(" CUDA:1 ") == "cuda:1" and check_device(None) == "auto"
    with pytest.raises(LadderizeError, match="unknown device 'tpu'"):
        check_device("tpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    for spec in ("cuda", "cuda:0"):
        with pytest.raises(LadderizeError, match="sees no CUDA device"):
            resolve_device(spec)


def test_auto_picks_the_local_rank_cuda_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setenv("LOCAL_RANK", "2")
    assert resolve_device("auto") == torch.device("cuda", 2) == resolve_device("cuda")
    assert resolve_device("cuda:3") == torch.device("cuda", 3)
    with pytest.raises(LadderizeError, match="only 4 CUDA device"):
        resolve_device("cuda:7")


def test_placement_imports_no_torch():
    code = "import sys, ladderize.checkpoint.placement as p; p.check_device('cpu'); print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"


def test_cpu_bf16_reads_the_cpus_flags():
    """``cpu_bf16`` is what the kernel reports: AVX512-BF16 or AMX's bf16 tiles in /proc/cpuinfo's flags."""
    flags = {flag for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags") for flag in line.split()}
    assert placement.cpu_bf16() == bool(flags & {"avx512_bf16", "amx_bf16"})
