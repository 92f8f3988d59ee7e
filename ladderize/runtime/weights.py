"""One rank's weights: its shard of every layer in the runtime's fused form, plus the replicated rest.

q/k/v are fused into one column-parallel ``qkv`` and gate/up into one ``gate_up``, so a
rank runs one product for each (``block.qkv_heads`` and ``block.mlp_partial`` split them).
``load_rank_weights`` reads a checkpoint's slices as ``tp_slicing.py`` assigns them;
``random_rank_weights`` makes weights of the same shapes for speed benchmarks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from ..checkpoint.architectures import EMBED_TENSOR as EMBED, FINAL_NORM_TENSOR as FINAL_NORM, LM_HEAD, TP_SPLITS, layer_tensor
from ..errors import LadderizeError
from ..model.layout import Layout, kv_heads_per_rank
from ..checkpoint.shapes import ModelShape
from .tp_slicing import TensorSource, head_slices, layer_shard, shard_linear


@dataclass
class LayerWeights:
    """One rank's shard of a decoder layer (``[out, in]`` weights, as ``F.linear`` wants)."""

    qkv: torch.Tensor  # [(Hl + 2*Kl) * hd, D], column-parallel q, k, v fused
    qkv_bias: torch.Tensor | None
    o: torch.Tensor  # [D, Hl * hd], row-parallel
    o_bias: torch.Tensor | None  # full [D]: added once, after the sum
    gate_up: torch.Tensor  # [2 * Il, D], column-parallel gate and up fused
    gate_up_bias: torch.Tensor | None
    down: torch.Tensor  # [D, Il], row-parallel
    down_bias: torch.Tensor | None  # full [D]
    ln1: torch.Tensor  # [D] input_layernorm
    ln2: torch.Tensor  # [D] post_attention_layernorm


@dataclass
class RankWeights:
    """Everything one rank holds: replicated embedding/norm/head plus its layer shards."""

    dims: ModelShape
    tp: int
    rank: int
    embed: torch.Tensor  # [V, D]
    final_norm: torch.Tensor  # [D]
    lm_head: torch.Tensor  # [V, D]
    layers: list[LayerWeights]

    @property
    def heads_local(self) -> int:
        return self.dims.num_heads // self.tp

    @property
    def kv_heads_local(self) -> int:
        return kv_heads_per_rank(self.tp, self.dims.num_kv_heads)

    def nbytes(self) -> int:
        tensors = [self.embed, self.final_norm] + ([] if self.lm_head is self.embed else [self.lm_head])
        for lw in self.layers:
            tensors += [t for t in vars(lw).values() if t is not None]
        return sum(t.numel() * t.element_size() for t in tensors)


def _optional(source: TensorSource, name: str, present: bool, rows: Sequence[slice] | None = None):
    if not present:
        return None
    if not source.has(name):
        raise LadderizeError(f"config says the model has biases but the checkpoint lacks {name}")
    return source.read(name, rows=rows)


def load_rank_weights(
    source: TensorSource,
    dims: ModelShape,
    layout: Layout,
    tp: int,
    rank: int,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> RankWeights:
    """Read rank ``rank``'s shard of every layer from ``source`` (see the module docstring)."""

    def put(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.to(device=device, dtype=dtype).contiguous()

    hd = dims.head_dim
    layers = []
    for layer in range(dims.num_layers):
        shard = layer_shard(dims, layout, layer, tp, rank)
        parts = {"query_heads": head_slices(shard.q_heads, hd), "kv_heads": head_slices(shard.kv_heads, hd), "inner": [shard.inner]}

        def weight(module: str) -> torch.Tensor:  # the rank's part of a weight, as the TP plan splits it
            style, split = TP_SPLITS[module]
            name = layer_tensor(layer, module)
            return source.read(name) if style == "replicate" else shard_linear(source, name, style, parts[split])

        def bias(module: str, present: bool) -> torch.Tensor | None:  # column-parallel biases split like their rows
            style, split = TP_SPLITS[module]
            return _optional(source, layer_tensor(layer, module, "bias"), present, parts[split] if style == "colwise" else None)

        def fused(modules: tuple[str, ...], present: bool = True) -> torch.Tensor | None:
            return torch.cat([weight(m) for m in modules]) if present else None

        def fused_bias(modules: tuple[str, ...], present: bool) -> torch.Tensor | None:
            return torch.cat([bias(m, True) for m in modules]) if present else None

        qkv, gate_up = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), ("mlp.gate_proj", "mlp.up_proj")
        layers.append(
            LayerWeights(
                qkv=put(fused(qkv)),
                qkv_bias=put(fused_bias(qkv, dims.attention_bias)),
                o=put(weight("self_attn.o_proj")),
                o_bias=put(bias("self_attn.o_proj", dims.attention_out_bias)),
                gate_up=put(fused(gate_up)),
                gate_up_bias=put(fused_bias(gate_up, dims.mlp_bias)),
                down=put(weight("mlp.down_proj")),
                down_bias=put(bias("mlp.down_proj", dims.mlp_bias)),
                ln1=put(weight("input_layernorm")),
                ln2=put(weight("post_attention_layernorm")),
            )
        )
    embed = put(source.read(EMBED))
    lm_head = embed if (dims.tie_word_embeddings or not source.has(LM_HEAD)) else put(source.read(LM_HEAD))
    return RankWeights(dims, tp, rank, embed, put(source.read(FINAL_NORM)), lm_head, layers)


def random_rank_weights(
    dims: ModelShape,
    tp: int,
    rank: int,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    std: float = 0.02,
) -> RankWeights:
    """Random weights of ``dims``'s shape, generated shard by shard (for speed benchmarks only)."""
    generator = torch.Generator(device=device).manual_seed(seed * 1000 + rank)
    d, hd = dims.hidden_size, dims.head_dim
    hl, kl, il = dims.num_heads // tp, kv_heads_per_rank(tp, dims.num_kv_heads), dims.intermediate_size // tp

    def randn(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=generator, device=device) * std).to(dtype)

    def ones(n: int) -> torch.Tensor:
        return torch.ones(n, device=device, dtype=dtype)

    def bias(n: int, present: bool) -> torch.Tensor | None:
        return randn(n) if present else None

    layers = [
        LayerWeights(
            qkv=randn((hl + 2 * kl) * hd, d),
            qkv_bias=bias((hl + 2 * kl) * hd, dims.attention_bias),
            o=randn(d, hl * hd),
            o_bias=bias(d, dims.attention_out_bias),
            gate_up=randn(2 * il, d),
            gate_up_bias=bias(2 * il, dims.mlp_bias),
            down=randn(d, il),
            down_bias=bias(d, dims.mlp_bias),
            ln1=ones(d),
            ln2=ones(d),
        )
        for _ in range(dims.num_layers)
    ]
    embed = randn(dims.vocab_size, d)
    lm_head = embed if dims.tie_word_embeddings else randn(dims.vocab_size, d)
    return RankWeights(dims, tp, rank, embed, ones(d), lm_head, layers)


__all__ = ["LayerWeights", "RankWeights", "load_rank_weights", "random_rank_weights"]
