"""OUT in the input checkpoint's dtype: a bf16 checkpoint adapts into a bf16 OUT (one process, replicated or
streamed, and two processes sharded under gloo) whose tensors are the fp32 masters cast once, half the bytes;
``--output-dtype float32`` writes the fp32 masters; a recipe's stage before the last writes fp32."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from ladderize.adapt.plan.config import AdaptConfig
from ladderize.adapt.stage_run import adapt
from ladderize.checkpoint.architectures import read_provenance
from ladderize.convert.inspect import inspect_checkpoint
from tests.adapt.conftest import convert


@pytest.fixture(scope="module")
def bf16_ladder(dense_dir, tmp_path_factory) -> Path:
    return convert(dense_dir, tmp_path_factory.mktemp("bf16") / "ladder", ladder="2:4", dtype="bfloat16")


def _weights(path: Path) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(path.glob("*.safetensors")):
        tensors.update(load_file(file))
    return tensors


def _bytes(path: Path) -> int:
    return sum(file.stat().st_size for file in path.glob("*.safetensors"))


def _logits(path: Path, dtype: torch.dtype) -> torch.Tensor:
    from ladderize.checkpoint.io import load_model

    model = load_model(str(path), dtype=dtype).eval()
    with torch.no_grad():
        return model(torch.arange(1, 17).unsqueeze(0)).logits


def _check_cast(low: Path, full: Path, dtype: str = "bfloat16") -> None:
    """``low`` is ``full`` (the fp32 masters) cast to ``dtype``: tensors, config, provenance, inspect, logits, bytes."""
    wanted = getattr(torch, dtype)
    a, b = _weights(low), _weights(full)
    assert a.keys() == b.keys()
    for name in a:
        assert b[name].dtype == torch.float32 and a[name].dtype == wanted, name
        assert torch.equal(a[name], b[name].to(wanted)), name
    assert json.loads((low / "config.json").read_text())["dtype"] == dtype
    assert json.loads((full / "config.json").read_text())["dtype"] == "float32"
    record = read_provenance(low)
    assert record["dtype"] == dtype and record["history"][-1]["dtype"] == dtype
    assert inspect_checkpoint(low)["dtype"] == dtype and inspect_checkpoint(full)["dtype"] == "float32"
    assert abs(_bytes(low) / _bytes(full) - 0.5) < 0.01, (_bytes(low), _bytes(full))
    assert torch.equal(_logits(low, wanted), _logits(full, torch.float32).to(wanted)) or torch.equal(
        _logits(low, wanted), _logits(full, wanted))


@pytest.mark.parametrize("schedule,objectives", [("joint", "kd"), ("sequential", "local")])
def test_a_bf16_checkpoint_adapts_into_a_bf16_out_of_the_cast_masters(bf16_ladder, text_file, tmp_path, schedule,
                                                                      objectives):
    def run(name: str, **extra) -> Path:
        out = tmp_path / name
        adapt(AdaptConfig.from_flat(checkpoint=str(bf16_ladder), out=str(out), data=str(text_file), objectives=objectives,
                          local_schedule=schedule, tokens=32 * 2 * 2, seq_len=32, batch_size=2, epochs=1, lr=1e-3,
                          dtype="float32", **extra))
        return out

    low, full = run("auto"), run("fp32", output_dtype="float32")
    _check_cast(low, full)
    masters = _weights(full)["model.layers.2.mlp.down_proj.weight"]  # a trained layer's: fp32 values bf16 cannot hold
    assert not torch.equal(masters.to(torch.bfloat16).float(), masters)


def test_a_recipe_writes_its_earlier_stages_in_fp32_and_out_in_the_sources_dtype(bf16_ladder, text_file, tmp_path):
    from ladderize.adapt.plan.stages import Recipe, parse_stage
    from tests.adapt.conftest import plan_and_run

    recipe = Recipe("two", [parse_stage("seq-local:tokens=128,epochs=1"), parse_stage("kd:tokens=128")])
    shared = {"data": str(text_file), "seq_len": 32, "batch_size": 2, "dtype": "float32", "compile": False}
    plan_and_run(recipe, str(bf16_ladder), tmp_path / "out", shared=shared, keep_stages=True)
    stage1 = next(path for path in (tmp_path / "out.adapt-run").iterdir() if path.name.startswith("stage1-")
                  and path.is_dir() and not path.name.endswith(".run"))
    assert {t.dtype for t in _weights(stage1).values()} == {torch.float32}
    assert {t.dtype for t in _weights(tmp_path / "out").values()} == {torch.bfloat16}
    assert inspect_checkpoint(tmp_path / "out")["dtype"] == "bfloat16"


def test_two_processes_sharded_write_a_bf16_out_of_the_cast_masters(bf16_ladder, text_file, tmp_path):
    from tests.adapt.test_sharded import _common, _launch

    stage = ["--stage", "kd:tokens=128,batch_size=2,lr=1e-2"]
    two = _launch(2, ["adapt", str(bf16_ladder), str(tmp_path / "auto"), *_common(text_file), *stage], tmp_path)
    assert "sharded over 2 processes with FSDP2" in two.stderr
    _launch(2, ["adapt", str(bf16_ladder), str(tmp_path / "fp32"), *_common(text_file), *stage,
                "--output-dtype", "float32"], tmp_path)
    _check_cast(tmp_path / "auto", tmp_path / "fp32")
