"""Per-rank weight slicing: column- and row-parallel projections, GQA head groups, SPD head order.

Rank r of an N-way group owns, in every layer:

- the KV heads ``rank_kv_heads(layout.head_order(layer, K), N, r)`` and the query heads
  that attend with them (``rank_query_heads``): q/k/v are *column-parallel* (rows of
  the ``[out, in]`` weight), ``o_proj`` is *row-parallel* (its input columns);
- MLP shard r, the contiguous slice ``[r*I/N, (r+1)*I/N)`` of the intermediate
  dimension: gate/up column-parallel, down row-parallel.

When ``N`` exceeds the KV-head count K (and is a multiple of it), each KV head is replicated
on ``N / K`` consecutive ranks, which split its query heads, as vLLM and gpt-fast do (this
is how Llama-3.1-70B runs at TP16). These are the same head groups and MLP shards that define an SPD layer's single-device
function (``modeling_ladder_llama._spd_groups``), so a run at ``tp == spd_tp_size``
reproduces the converted model exactly. Dense and ladder layers use the same order;
their sum over ranks does not depend on it.

Embedding, norms and the LM head are replicated. Weights are read from safetensors with
``safe_open`` slice by slice: each rank reads only its shard (never a pickle).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Protocol, Sequence

import torch

from ..convert.architectures import TP_PLAN, layer_tensor
from ..errors import LadderizeError
from ..model.layout import (
    LayerMode,
    Layout,
    check_tp_divides,
    format_layer_ranges,
    kv_heads_per_rank,
    rank_kv_heads,
    rank_query_heads,
)

# Tensor names (Llama's, kept by ladder_llama checkpoints).
EMBED = "model.embed_tokens.weight"
FINAL_NORM = "model.norm.weight"
LM_HEAD = "lm_head.weight"


# --- config ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelDims:
    """The shape numbers the runtime needs, read once from a config."""

    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float
    hidden_act: str
    attention_bias: bool
    attention_out_bias: bool
    mlp_bias: bool
    tie_word_embeddings: bool

    @classmethod
    def from_config(cls, config: Any) -> "ModelDims":
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        attention_bias = bool(getattr(config, "attention_bias", False))
        out_bias = getattr(config, "attention_out_bias", None)
        return cls(
            hidden_size=config.hidden_size,
            num_layers=config.num_hidden_layers,
            num_heads=config.num_attention_heads,
            num_kv_heads=config.num_key_value_heads or config.num_attention_heads,
            head_dim=head_dim,
            intermediate_size=config.intermediate_size,
            vocab_size=config.vocab_size,
            rms_norm_eps=float(config.rms_norm_eps),
            hidden_act=config.hidden_act,
            attention_bias=attention_bias,
            attention_out_bias=attention_bias if out_bias is None else bool(out_bias),
            mlp_bias=bool(getattr(config, "mlp_bias", False)),
            tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
        )

    def param_count(self) -> int:
        d, hd = self.hidden_size, self.head_dim
        attn = d * (self.num_heads + 2 * self.num_kv_heads) * hd + self.num_heads * hd * d
        mlp = 3 * d * self.intermediate_size
        head = 0 if self.tie_word_embeddings else self.vocab_size * d
        return self.num_layers * (attn + mlp + 2 * d) + self.vocab_size * d + head + d


def load_config(path: str | Path) -> tuple[Any, Layout]:
    """The config and layout of a checkpoint, through the one config reader (``convert.checkpoint.load_config``).

    Every architecture ``convert`` accepts runs: Llama, Mistral (full attention), Qwen2, the
    Ladder authors' format and converted ``ladder_llama`` checkpoints.
    """
    from ..convert.checkpoint import load_config as read_config

    config = read_config(path)
    return config, config.layout


def validate_tp(dims: ModelDims, layout: Layout, tp: int, allow_spd_mismatch: bool = False) -> None:
    """Check that ``tp`` ranks can run this model; raise ``LayoutError``/``LadderizeError`` with one line."""
    if tp < 1:
        raise LadderizeError(f"--tp must be at least 1, got {tp}")
    spd_layers = layout.layers(LayerMode.SPD)
    # Dense and ladder layers replicate KV heads when tp exceeds their count; SPD's head groups cannot.
    check_tp_divides(tp, dims.num_heads, dims.num_kv_heads, dims.intermediate_size, replicate_kv=not spd_layers)
    if spd_layers and tp != layout.spd_tp_size and not allow_spd_mismatch:
        raise LadderizeError(
            f"SPD layers {format_layer_ranges(spd_layers)} were converted for TP={layout.spd_tp_size}; at --tp {tp} "
            f"each rank would see a different head group, which is a different model. Run with --tp {layout.spd_tp_size}, "
            "or pass --allow-spd-mismatch to run SPD semantics at this degree anyway"
        )


# --- which rows/columns a rank owns ----------------------------------------------------------


@dataclass(frozen=True)
class LayerShard:
    """What one rank owns of one layer."""

    kv_heads: tuple[int, ...]
    q_heads: tuple[int, ...]
    inner: slice  # its slice of the MLP intermediate dimension


def layer_shard(dims: ModelDims, layout: Layout, layer: int, tp: int, rank: int) -> LayerShard:
    order = layout.head_order(layer, dims.num_kv_heads)
    kv_heads = rank_kv_heads(order, tp, rank)
    q_heads = rank_query_heads(kv_heads, dims.num_heads, dims.num_kv_heads, tp, rank)
    inner = dims.intermediate_size // tp
    return LayerShard(tuple(kv_heads), tuple(q_heads), slice(rank * inner, (rank + 1) * inner))


def head_slices(heads: Sequence[int], head_dim: int) -> list[slice]:
    """Row (or column) slices of the given heads, contiguous runs merged: ``[0, 1, 3] -> [0:2hd, 3hd:4hd]``."""
    slices: list[slice] = []
    for head in heads:
        start, stop = head * head_dim, (head + 1) * head_dim
        if slices and slices[-1].stop == start:
            slices[-1] = slice(slices[-1].start, stop)
        else:
            slices.append(slice(start, stop))
    return slices


# --- tensor sources --------------------------------------------------------------------------


class TensorSource(Protocol):
    def has(self, name: str) -> bool: ...

    def read(self, name: str, rows: Sequence[slice] | None = None, cols: Sequence[slice] | None = None) -> torch.Tensor:
        """The tensor, or the concatenation of its row slices (dim 0) or column slices (dim 1)."""
        ...


class SafetensorsSource:
    """Lazy reader over ``model.safetensors`` or a sharded ``model.safetensors.index.json``."""

    def __init__(self, path: str | Path):
        from safetensors import safe_open

        self._safe_open = safe_open
        path = Path(path)
        index = path / "model.safetensors.index.json"
        if index.is_file():
            weight_map = json.loads(index.read_text())["weight_map"]
            self._files = {name: path / file for name, file in weight_map.items()}
        elif (path / "model.safetensors").is_file():
            single = path / "model.safetensors"
            with safe_open(single, framework="pt") as handle:
                self._files = {name: single for name in handle.keys()}
        else:
            raise LadderizeError(f"{path} has no model.safetensors (or index); the runtime reads safetensors only")
        self._handles: dict[Path, Any] = {}

    def _handle(self, file: Path):
        if file not in self._handles:
            self._handles[file] = self._safe_open(file, framework="pt")
        return self._handles[file]

    def has(self, name: str) -> bool:
        return name in self._files

    def read(self, name: str, rows: Sequence[slice] | None = None, cols: Sequence[slice] | None = None) -> torch.Tensor:
        if name not in self._files:
            raise LadderizeError(f"checkpoint is missing tensor {name}")
        handle = self._handle(self._files[name])
        if rows is None and cols is None:
            return handle.get_tensor(name)
        view = handle.get_slice(name)
        if rows is not None:
            return torch.cat([view[s] for s in rows], dim=0)
        return torch.cat([view[:, s] for s in cols], dim=1)


class StateDictSource:
    """The same interface over an in-memory state dict (tests, models already loaded)."""

    def __init__(self, state_dict: Mapping[str, torch.Tensor]):
        self._tensors = state_dict

    def has(self, name: str) -> bool:
        return name in self._tensors

    def read(self, name: str, rows: Sequence[slice] | None = None, cols: Sequence[slice] | None = None) -> torch.Tensor:
        tensor = self._tensors[name]
        if rows is not None:
            return torch.cat([tensor[s] for s in rows], dim=0)
        if cols is not None:
            return torch.cat([tensor[:, s] for s in cols], dim=1)
        return tensor


# --- the per-rank weights --------------------------------------------------------------------


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

    dims: ModelDims
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

    @property
    def inner_local(self) -> int:
        return self.dims.intermediate_size // self.tp

    def nbytes(self) -> int:
        tensors = [self.embed, self.final_norm] + ([] if self.lm_head is self.embed else [self.lm_head])
        for lw in self.layers:
            tensors += [t for t in vars(lw).values() if t is not None]
        return sum(t.numel() * t.element_size() for t in tensors)


def shard_linear(
    source: TensorSource, name: str, parallel: str, parts: Sequence[slice]
) -> torch.Tensor:
    """One rank's slice of a linear weight: ``column`` keeps output rows, ``row`` keeps input columns."""
    if parallel in ("column", "colwise"):
        return source.read(name, rows=parts)
    if parallel in ("row", "rowwise"):
        return source.read(name, cols=parts)
    raise ValueError(f"parallel must be 'colwise' or 'rowwise', not {parallel!r}")


def _optional(source: TensorSource, name: str, present: bool, rows: Sequence[slice] | None = None):
    if not present:
        return None
    if not source.has(name):
        raise LadderizeError(f"config says the model has biases but the checkpoint lacks {name}")
    return source.read(name, rows=rows)


def load_rank_weights(
    source: TensorSource,
    dims: ModelDims,
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
            style, split = TP_PLAN[module]
            name = layer_tensor(layer, module)
            return source.read(name) if style == "replicate" else shard_linear(source, name, style, parts[split])

        def bias(module: str, present: bool) -> torch.Tensor | None:  # column-parallel biases split like their rows
            style, split = TP_PLAN[module]
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
    dims: ModelDims,
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


__all__ = [
    "LayerShard",
    "LayerWeights",
    "ModelDims",
    "RankWeights",
    "SafetensorsSource",
    "StateDictSource",
    "head_slices",
    "layer_shard",
    "load_config",
    "load_rank_weights",
    "random_rank_weights",
    "shard_linear",
    "validate_tp",
]
