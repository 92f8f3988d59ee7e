"""Per-rank slicing: which rows and columns of each weight a rank owns, and reading exactly those.

Rank r of an N-way group owns, in every layer:

- the KV heads ``rank_kv_heads(layout.head_order(layer, K), N, r)`` and the query heads
  that attend with them (``rank_query_heads``): q/k/v are *column-parallel* (rows of
  the ``[out, in]`` weight), ``o_proj`` is *row-parallel* (its input columns);
- MLP shard r, the contiguous slice ``[r*I/N, (r+1)*I/N)`` of the intermediate
  dimension: gate/up column-parallel, down row-parallel.

When ``N`` exceeds the KV-head count K (and is a multiple of it), each KV head is replicated
on ``N / K`` consecutive ranks, which split its query heads, as vLLM and gpt-fast do (this
is how Llama-3.1-70B runs at TP16). These are the same head groups and MLP shards that define
an SPD layer's single-device function (``modeling_ladder_llama._spd_groups``), so a run at
``tp == spd_tp_size`` reproduces the converted model exactly. Dense and ladder layers use
the same order; their sum over ranks does not depend on it.

Weights are read from safetensors slice by slice through the one reader (``SafetensorsSource``, ``checkpoint.tensor_files``):
each rank reads only its shard (never a pickle). ``weights.load_rank_weights`` assembles them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Protocol, Sequence

import torch

from ..checkpoint.tensor_files import INDEX_FILE, SINGLE_FILE, CheckpointTensors
from ..errors import LadderizeError
from ..model.layout import Layout, rank_kv_heads, rank_query_heads
from ..checkpoint.shapes import ModelShape


@dataclass(frozen=True)
class LayerShard:
    """What one rank owns of one layer."""

    kv_heads: tuple[int, ...]
    q_heads: tuple[int, ...]
    inner: slice  # its slice of the MLP intermediate dimension


def layer_shard(dims: ModelShape, layout: Layout, layer: int, tp: int, rank: int) -> LayerShard:
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


def shard_linear(
    source: TensorSource, name: str, parallel: str, parts: Sequence[slice]
) -> torch.Tensor:
    """One rank's slice of a linear weight: ``column`` keeps output rows, ``row`` keeps input columns."""
    if parallel in ("column", "colwise"):
        return source.read(name, rows=parts)
    if parallel in ("row", "rowwise"):
        return source.read(name, cols=parts)
    raise ValueError(f"parallel must be 'colwise' or 'rowwise', not {parallel!r}")


# --- tensor sources --------------------------------------------------------------------------


class TensorSource(Protocol):
    def has(self, name: str) -> bool: ...

    def read(self, name: str, rows: Sequence[slice] | None = None, cols: Sequence[slice] | None = None) -> torch.Tensor:
        """The tensor, or the concatenation of its row slices (dim 0) or column slices (dim 1)."""
        ...


class SafetensorsSource(CheckpointTensors):
    """Lazy reader over ``model.safetensors`` or a sharded ``model.safetensors.index.json``: the one reader
    (``checkpoint.tensor_files.CheckpointTensors``), whose corrupt-file errors are one line."""

    def __init__(self, path: str | Path):
        path = Path(path)
        if not (path / INDEX_FILE).is_file() and not (path / SINGLE_FILE).is_file():
            raise LadderizeError(f"{path} has no model.safetensors (or index); the runtime reads safetensors only")
        super().__init__(path)


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


__all__ = [
    "LayerShard",
    "SafetensorsSource",
    "StateDictSource",
    "TensorSource",
    "head_slices",
    "layer_shard",
    "shard_linear",
]
