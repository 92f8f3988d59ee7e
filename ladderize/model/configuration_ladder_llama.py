"""Configuration of the Ladder/SPD Llama: a LlamaConfig plus the per-layer layout."""

from __future__ import annotations

from huggingface_hub.dataclasses import strict
from transformers import LlamaConfig

from .layout import Layout


@strict
class LadderLlamaConfig(LlamaConfig):
    r"""Llama configuration with a per-layer mode (``dense``, ``ladder`` or ``spd``).

    Args:
        layer_modes: one mode per decoder layer; ``None`` means all dense.
        spd_tp_size: the tensor-parallel degree SPD layers were converted for. SPD's
            function depends on it: rank r owns head group r and MLP shard r.
        spd_head_order: optional per-layer permutation of KV heads used to form SPD's
            head groups (head grouping); ``None`` keeps the natural order.
        attention_out_bias: bias on ``o_proj``; ``None`` follows ``attention_bias``
            (Qwen2 has q/k/v biases but none on ``o_proj``).
    """

    model_type = "ladder_llama"

    layer_modes: list[str] | None = None
    spd_tp_size: int = 1
    spd_head_order: list[list[int] | None] | None = None
    attention_out_bias: bool | None = None

    def __post_init__(self, **kwargs):
        super().__post_init__(**kwargs)
        if self.layer_modes is None:
            self.layer_modes = ["dense"] * self.num_hidden_layers
        if self.attention_out_bias is None:
            self.attention_out_bias = self.attention_bias
        self.layout.validate(self.num_attention_heads, self.num_key_value_heads, self.intermediate_size)

    @property
    def layout(self) -> Layout:
        """The per-layer modes as a ``Layout``."""
        return Layout.from_config(self)
