"""One checkpoint layer: one shape type (its parameter count is the model's), one preset table,
one safetensors reader (a truncated file is one line everywhere), one writer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ladderize.checkpoint.io import load_config, load_model, model_shape, save_model_checkpoint
from ladderize.convert.inspect import inspect_checkpoint
from ladderize.errors import LadderizeError
from ladderize.model import LadderLlamaForCausalLM
from ladderize.checkpoint.shapes import PRESETS, ModelShape, head_dim_of
from ladderize.synthetic import write_synthetic_checkpoint
from tests.cli_helpers import error_lines, run_cli
from tests.conftest import tiny_config


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"tie_word_embeddings": True},
        {"attention_bias": True, "attention_out_bias": False},  # Qwen2's biases
        {"attention_bias": True, "mlp_bias": True},
        {"head_dim": None, "layer_modes": ["dense", "ladder", "spd", "dense"], "spd_tp_size": 3},
    ],
)
def test_the_shape_counts_the_models_parameters(overrides, tmp_path):
    config = tiny_config(**overrides)
    model = LadderLlamaForCausalLM(config)
    expected = sum(p.numel() for p in model.parameters())
    shape = ModelShape.from_config(config)
    assert shape.num_parameters == expected
    assert ModelShape.from_config(config).param_count() == expected
    assert shape.head_dim == head_dim_of(config) == model.model.layers[0].self_attn.head_dim
    save_model_checkpoint(model, None, tmp_path / "saved", provenance={})
    assert model_shape(load_config(tmp_path / "saved")).num_parameters == expected
    assert inspect_checkpoint(tmp_path / "saved")["parameters"] == expected  # counted from the headers


def test_one_preset_table():
    from ladderize.predict.presets import PUBLIC_PRESETS as predict_presets
    from ladderize.runtime.bench import SYNTHETIC_CONFIGS as bench_presets

    assert all(predict_presets[key] is PRESETS[key] for key in predict_presets)
    assert set(PRESETS) <= set(bench_presets)
    assert bench_presets["tiny"] == PRESETS["tiny"].config_dict()
    assert bench_presets["llama-8b"] == PRESETS["llama-3.1-8b"].config_dict()


def test_synthetic_checkpoint_loads_with_its_shape(tmp_path):
    shape = PRESETS["tiny"]
    path = write_synthetic_checkpoint(tmp_path / "tiny", shape, layer_modes=["dense", "ladder", "ladder", "dense"])
    model = load_model(path)
    assert model.layout.describe() == "ladder 1:3"
    assert sum(p.numel() for p in model.parameters()) == shape.num_parameters
    assert ModelShape.from_config(model.config).with_(name=shape.name, source=shape.source, rope_theta=None) == shape
    dense = write_synthetic_checkpoint(tmp_path / "dense", shape)
    assert json.loads((dense / "config.json").read_text())["model_type"] == "llama"


def _truncate(file: Path, keep: int | None = None) -> None:
    data = file.read_bytes()
    file.write_bytes(data[: len(data) // 2 if keep is None else keep])


@pytest.mark.parametrize("keep", [None, 5], ids=["data-cut", "header-cut"])
def test_truncated_safetensors_is_one_line_in_inspect(tiny_llama_dir, capsys, monkeypatch, keep):
    _truncate(tiny_llama_dir / "model.safetensors", keep)
    code, _, err = run_cli(["inspect", tiny_llama_dir], capsys, monkeypatch)
    lines = error_lines(err)
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith("error:") and "corrupt safetensors file" in lines[0] and "model.safetensors" in lines[0]
    assert "Traceback" not in err


@pytest.mark.parametrize("command", [["generate", "--prompt", "hi", "--max-new-tokens", "2"],
                                     ["bench", "--schedules", "native", "--batch", "1", "--repeats", "1"]])
def test_truncated_safetensors_is_one_line_in_the_runtime_commands(tmp_path, capsys, monkeypatch, command):
    path = write_synthetic_checkpoint(tmp_path / "tiny", PRESETS["tiny"])
    _truncate(path / "model.safetensors")
    code, _, err = run_cli([command[0], path, "--tp", "1", *command[1:]], capsys, monkeypatch)
    lines = error_lines(err)
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith("error: corrupt safetensors file") and "incomplete metadata" in lines[0]


def test_truncated_safetensors_is_one_line_in_the_runtime_reader(tiny_llama_dir):
    from ladderize.runtime.tp_slicing import SafetensorsSource
    from ladderize.runtime.weights import load_rank_weights

    config = load_config(tiny_llama_dir)
    dims = ModelShape.from_config(config)
    assert load_rank_weights(SafetensorsSource(tiny_llama_dir), dims, config.layout, 1, 0).layers
    _truncate(tiny_llama_dir / "model.safetensors")
    with pytest.raises(LadderizeError, match=r"^corrupt safetensors file .*model\.safetensors: .*incomplete metadata") as info:
        load_rank_weights(SafetensorsSource(tiny_llama_dir), dims, config.layout, 1, 0)
    assert "\n" not in str(info.value)


def test_truncated_safetensors_is_one_line_in_the_streamed_layers(tiny_llama_dir):
    from ladderize.adapt.layers.layer_source import read_tensors

    _truncate(tiny_llama_dir / "model.safetensors")
    with pytest.raises(LadderizeError, match="corrupt safetensors file"):
        read_tensors({"model.norm.weight": tiny_llama_dir / "model.safetensors"})


def test_saved_checkpoint_matches_the_model_bit_for_bit(tmp_path):
    model = LadderLlamaForCausalLM(tiny_config(tie_word_embeddings=True, layer_modes=["dense", "ladder", "dense", "dense"]))
    saved = save_model_checkpoint(model, None, tmp_path / "saved", provenance={"step": "test"})
    config = json.loads((saved / "config.json").read_text())
    assert config["auto_map"]["AutoModelForCausalLM"] == "modeling_ladder_llama.LadderLlamaForCausalLM"
    assert config["dtype"] == "float32"
    loaded = load_model(saved)
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name
