"""Mistral (full attention) and Qwen2 convert to the same function; other architectures are refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

from ladderize.convert.checkpoint import convert_checkpoint, load_model
from ladderize.errors import LadderizeError

SHAPE = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=128)  # fmt: skip


@pytest.mark.parametrize(
    "model_cls,config",
    [
        (MistralForCausalLM, MistralConfig(**SHAPE, sliding_window=None)),
        (Qwen2ForCausalLM, Qwen2Config(**SHAPE)),
    ],
    ids=["mistral", "qwen2"],
)
def test_family_member_reproduced(model_cls, config, tmp_path: Path) -> None:
    torch.manual_seed(0)
    reference = model_cls(config).eval()
    with torch.no_grad():  # qwen2's q/k/v biases start at zero; make them matter
        for name, param in reference.named_parameters():
            if name.endswith("bias"):
                param.normal_()
    reference.save_pretrained(tmp_path / "src")
    model = load_model(convert_checkpoint(str(tmp_path / "src"), tmp_path / "out"))
    ids = torch.randint(0, 96, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (reference(ids).logits - model(ids).logits).abs().max() <= 1e-4


def test_mistral_sliding_window_refused(tmp_path: Path) -> None:
    MistralForCausalLM(MistralConfig(**SHAPE, sliding_window=16)).save_pretrained(tmp_path / "src")
    with pytest.raises(LadderizeError, match="sliding_window"):
        convert_checkpoint(str(tmp_path / "src"), tmp_path / "out")
    assert not (tmp_path / "out").exists()
