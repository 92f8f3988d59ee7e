"""The work of one rank's module for one step (``ModuleWork``): its shape, FLOPs and memory traffic.

A module is one rank's shard of an attention block (norm, fused QKV projection of its heads, rotary,
attention over ``kv_len`` keys, output projection) or of an MLP block (norm, gate/up projection of its
slice, SiLU gate, down projection), or the LM head (norm and the full vocabulary projection of the last
position, replicated on every rank as in gpt-fast, the Ladder authors' runtime). The all-reduce that
ends a module is not part of it: ``ladderize.predict.interconnect`` models it. ``roofline_s`` prices
a module from a FLOP/s and a bytes/s rate.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

from ..model.layout import kv_heads_per_rank
from .presets import ModelShape

ModuleKind = Literal["attention", "mlp", "head"]


@dataclass(frozen=True)
class ModuleWork:
    """One module of one rank's shard for one step, in per-rank dimensions.

    ``q_len`` is the number of new tokens per sequence (the prompt in prefill, 1 in decode), ``kv_len``
    the keys each sequence attends over (including the new ones).
    """

    kind: ModuleKind
    hidden_size: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    batch: int
    q_len: int
    kv_len: int
    dtype_bytes: int = 2

    @property
    def tokens(self) -> int:
        return self.batch * self.q_len

    @property
    def weight_params(self) -> int:
        d, hd = self.hidden_size, self.head_dim
        if self.kind == "attention":
            return d * (self.heads + 2 * self.kv_heads) * hd + self.heads * hd * d + d
        if self.kind == "mlp":
            return 3 * d * self.intermediate_size + d
        return d * self.vocab_size + d

    @property
    def flops(self) -> float:
        """Multiply-adds counted as 2 FLOPs; causal attention counts the keys each query really sees."""
        dense = 2.0 * self.tokens * self.weight_params
        if self.kind != "attention":
            return dense
        mean_keys = self.kv_len - (self.q_len - 1) / 2.0
        return dense + 4.0 * self.batch * self.heads * self.q_len * mean_keys * self.head_dim

    @property
    def kv_bytes(self) -> float:
        """KV-cache bytes an attention module reads in one step (0 for the other kinds)."""
        if self.kind != "attention":
            return 0
        return self.dtype_bytes * self.batch * self.kv_len * 2 * self.kv_heads * self.head_dim

    @property
    def bytes(self) -> float:
        """HBM traffic: weights once, activations in and out, and the KV cache read once per step."""
        e, d, t = self.dtype_bytes, self.hidden_size, self.tokens
        if self.kind == "attention":
            qkv = (self.heads + 2 * self.kv_heads) * self.head_dim
            activations = t * (2 * d + 2 * qkv + 2 * self.heads * self.head_dim)
            return e * (self.weight_params + activations) + self.kv_bytes
        if self.kind == "mlp":
            return e * (self.weight_params + t * (2 * d + 6 * self.intermediate_size))
        return e * (self.weight_params + t * (d + self.vocab_size))

    def key(self) -> str:
        fields = asdict(self)
        return "|".join(f"{name}={value}" for name, value in fields.items())


def module_work(model: ModelShape, kind: ModuleKind, tp: int, batch: int, q_len: int, kv_len: int) -> ModuleWork:
    """The per-rank work of ``kind`` at tensor-parallel degree ``tp`` (the LM head is replicated)."""
    return ModuleWork(
        kind=kind,
        hidden_size=model.hidden_size,
        heads=model.num_attention_heads // tp,
        kv_heads=kv_heads_per_rank(tp, model.num_key_value_heads),  # replicated when tp exceeds them
        head_dim=model.head_dim,
        intermediate_size=model.intermediate_size // tp,
        vocab_size=model.vocab_size,
        batch=batch,
        q_len=q_len if kind != "head" else 1,
        kv_len=kv_len if kind == "attention" else 0,
        dtype_bytes=model.dtype_bytes,
    )


def roofline_s(work: ModuleWork, flops_per_s: float, bytes_per_s: float) -> float:
    """Roofline time: the slower of compute and memory traffic."""
    return max(work.flops / flops_per_s, work.bytes / bytes_per_s)
