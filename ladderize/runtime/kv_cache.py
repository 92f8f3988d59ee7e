"""What a rank keeps while it runs: the rotary table and the preallocated KV cache.

The residual stream (r_{k-1}, r_k and an all-reduce in flight) is ``model/residual.py``'s
``ResidualStream``, the one interpreter of the mode program that the HF and vLLM models share.

The KV cache is preallocated per layer as ``[B, kv_heads_local, max_len, head_dim]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..model.block import fold_rotary_sign


class RotaryTable:
    """cos/sin per position from transformers' ``LlamaRotaryEmbedding`` (so rope scaling variants match).

    The tables are in the form ``block.rotate`` takes (``block.fold_rotary_sign``), ``[S, hd]``.
    Static rope types are tabulated once up to ``max_positions``; position-dependent ones
    (``dynamic``, ``longrope``) are recomputed per call, as transformers does.
    """

    def __init__(self, config: Any, max_positions: int, device: torch.device, dtype: torch.dtype):
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        self.module = LlamaRotaryEmbedding(config=config).to(device)
        self.dtype, self.device = dtype, device
        self.dynamic = getattr(self.module, "rope_type", "default") in ("dynamic", "longrope")
        self.cos = self.sin = None
        if not self.dynamic:
            self._tabulate(max_positions)

    def _compute(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        probe = torch.zeros(1, device=self.device, dtype=self.dtype)
        cos, sin = self.module(probe, positions[None])
        return fold_rotary_sign(cos[0], sin[0])  # [S, hd]

    def _tabulate(self, max_positions: int) -> None:
        self.cos, self.sin = self._compute(torch.arange(max_positions, device=self.device))  # [T, hd]

    def ensure(self, max_positions: int) -> None:
        """Extend a static table to cover ``max_positions``."""
        if not self.dynamic and self.cos.shape[0] < max_positions:
            self._tabulate(max_positions)

    def at(self, start: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin of positions ``start .. start + length - 1``: ``[length, hd]`` each."""
        if self.dynamic:
            return self._compute(torch.arange(start, start + length, device=self.device))
        return self.cos[start : start + length], self.sin[start : start + length]

    def at_tensor(self, position: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin at a 1-element position tensor (static decode)."""
        if self.dynamic:
            return self._compute(position)
        return self.cos.index_select(0, position), self.sin.index_select(0, position)


@dataclass
class KVCache:
    """Preallocated keys and values of every layer: ``[B, kv_heads_local, max_len, head_dim]``."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]

    @classmethod
    def allocate(cls, layers: int, batch: int, kv_heads: int, max_len: int, head_dim: int, device, dtype) -> "KVCache":
        shape = (batch, kv_heads, max_len, head_dim)
        return cls(
            [torch.zeros(shape, device=device, dtype=dtype) for _ in range(layers)],
            [torch.zeros(shape, device=device, dtype=dtype) for _ in range(layers)],
        )

    @property
    def batch(self) -> int:
        return self.keys[0].shape[0]

    @property
    def max_len(self) -> int:
        return self.keys[0].shape[2]


__all__ = ["KVCache", "RotaryTable"]
