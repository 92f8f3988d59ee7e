"""A model with another layout that shares every weight tensor with the original (no copy)."""

from __future__ import annotations

import copy

import torch

from ..model import LadderLlamaForCausalLM, Layout


def with_layout(model: LadderLlamaForCausalLM, layout: Layout) -> LadderLlamaForCausalLM:
    """The same weights under ``layout``: parameters are shared, so training one trains the other."""
    config = copy.deepcopy(model.config)
    for key, value in layout.config_fields().items():
        setattr(config, key, value)
    layout.validate(config.num_attention_heads, config.num_key_value_heads, config.intermediate_size)
    with torch.device("meta"):
        twin = LadderLlamaForCausalLM(config)
    twin.load_state_dict(model.state_dict(), assign=True, strict=True)
    twin.model.rotary_emb = model.model.rotary_emb  # non-persistent buffers are not in the state dict
    if config.tie_word_embeddings:
        twin.lm_head.weight = twin.model.embed_tokens.weight
    return twin.train(model.training)
