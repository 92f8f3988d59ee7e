"""Model shapes: presets and config.json files."""

from __future__ import annotations

import json

import pytest

from ladderize.errors import LadderizeError
from ladderize.predict.presets import PUBLIC_PRESETS, ModelShape, load_model_shape


def test_presets_have_the_public_shapes():
    shape = load_model_shape("Llama-3.1-70B")
    assert (shape.hidden_size, shape.num_hidden_layers, shape.num_attention_heads, shape.num_key_value_heads) == (8192, 80, 64, 8)
    assert shape.num_parameters / 1e9 == pytest.approx(70.6, abs=0.1)
    assert load_model_shape("meta-llama/Llama-3.1-8B-Instruct").num_parameters / 1e9 == pytest.approx(8.03, abs=0.02)
    assert load_model_shape("llama-3.1-405b").num_parameters / 1e9 == pytest.approx(405.9, abs=0.5)
    assert load_model_shape("Llama-2-70b-hf").vocab_size == 32000
    assert all(s.source.startswith("https://huggingface.co/") for s in PUBLIC_PRESETS.values())


def test_config_json_file_and_folder(tmp_path):
    config = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 8,
              "num_key_value_heads": 4, "vocab_size": 128, "model_type": "llama"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    for spec in (tmp_path, tmp_path / "config.json"):
        shape = load_model_shape(str(spec))
        assert shape.head_dim == 8 and shape.num_key_value_heads == 4 and shape.name == tmp_path.name


def test_bad_shapes_are_user_errors(tmp_path):
    with pytest.raises(LadderizeError, match="unknown model"):
        load_model_shape("gpt-5")
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64}))
    with pytest.raises(LadderizeError, match="lacks the field"):
        load_model_shape(tmp_path)
    with pytest.raises(LadderizeError, match="do not divide"):
        ModelShape("x", 64, 128, 2, 8, 3, 8, 100)


def test_a_config_is_read_through_the_one_config_reader(tmp_path, monkeypatch):
    """Issue #24: predict reads a checkpoint's config through ``checkpoint.io.load_config``/``config_from_dict``."""
    from ladderize.checkpoint import io as checkpoint

    calls = []
    real = checkpoint.config_from_dict
    monkeypatch.setattr(checkpoint, "config_from_dict", lambda values: calls.append(values) or real(values))
    config = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 8,
              "num_key_value_heads": 4, "vocab_size": 128, "model_type": "llama"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    for spec in (tmp_path, tmp_path / "config.json"):
        assert load_model_shape(str(spec)).intermediate_size == 128
    assert len(calls) == 2
