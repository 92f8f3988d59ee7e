"""The per-rank tensor-parallel model: sharded modules, a preallocated KV cache, and the layer loop.

Each rank holds the replicated embedding, norms and LM head plus its shard of every layer
(see ``sharding.py``). A module computes a *partial* output from its shard; the sum over
ranks (the all-reduce) is the module's output. The ``CommPlan`` says, step by step, which
residual a module reads and whether its all-reduce is blocking or in flight while the next
step computes. ``ResidualStream`` holds the two states of the model's layer loop:

    prev = r_{k-1}  (complete)          cur = r_k = prev + sum_r(partial_k)  (maybe in flight)

A ladder step reads ``prev`` (the stale residual, already complete), computes, issues its
own all-reduce, and only then waits for the previous step's: that wait is what overlaps.
A dense step reads ``cur`` and so waits first. An SPD block computes Y_r, Z_r = MLP_r(LN2(X +
Y_r)) locally and all-reduces Y_r + Z_r once; afterwards ``prev`` is the block input X,
which is the stale state the model defines after an SPD block.

The KV cache is preallocated per layer as ``[B, kv_heads_local, max_len, head_dim]``.
``static=True`` selects shape-static decode (cache writes and the attention mask driven by a
position *tensor*), which CUDA graphs and ``torch.compile`` need.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F

from .allreduce import Communicator, InFlight
from .kernels import LinearKernel, linear_fn, prepare_weights, resolve_kernel
from .plan import CommPlan, StepKind
from .sharding import LayerWeights, RankWeights

# --- small math helpers ------------------------------------------------------------------------


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Llama's RMSNorm: normalise in fp32, cast back, then scale (as ``LlamaRMSNorm`` does)."""
    return weight * F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """Rotary embedding on ``[B, S, H, hd]``; ``cos``/``sin_signed`` are ``[S, hd]``.

    Llama's ``x * cos + rotate_half(x) * sin`` with ``rotate_half(x) = cat(-x2, x1)``: rolling
    by half gives ``cat(x2, x1)``, and the sign sits in ``sin_signed = cat(-sin1, sin2)``.
    """
    return x * cos[:, None] + x.roll(x.shape[-1] // 2, dims=-1) * sin_signed[:, None]


def activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    if name == "silu":
        return F.silu
    from transformers.activations import ACT2FN

    return ACT2FN[name]


def _add(a: torch.Tensor | None, b: torch.Tensor | None) -> torch.Tensor | None:
    if a is None:
        return b
    return a if b is None else a + b


class RotaryTable:
    """cos/sin per position from transformers' ``LlamaRotaryEmbedding`` (so rope scaling variants match).

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
        cos, sin = cos[0], sin[0]  # [S, hd]
        half = sin.shape[-1] // 2
        return cos, torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)  # sin with rotate_half's sign folded in

    def _tabulate(self, max_positions: int) -> None:
        self.cos, self.sin = self._compute(torch.arange(max_positions, device=self.device))  # [T, hd]

    def ensure(self, max_positions: int) -> None:
        if not self.dynamic and self.cos.shape[0] < max_positions:
            self._tabulate(max_positions)

    def at(self, start: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.dynamic:
            return self._compute(torch.arange(start, start + length, device=self.device))
        return self.cos[start : start + length], self.sin[start : start + length]

    def at_tensor(self, position: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin at a 1-element position tensor (static decode)."""
        return self.cos.index_select(0, position), self.sin.index_select(0, position)


# --- KV cache and residual stream ---------------------------------------------------------------


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


class ResidualStream:
    """r_{k-1} (``prev``, complete) and r_k (``cur``: complete, or ``prev`` + an all-reduce in flight)."""

    __slots__ = ("prev", "cur", "inflight", "bias")

    def __init__(self, embeddings: torch.Tensor):
        self.prev = self.cur = embeddings  # r_{-1} = r_0
        self.inflight: InFlight | None = None
        self.bias: torch.Tensor | None = None

    def resolve(self) -> torch.Tensor:
        """Wait for the pending all-reduce (if any) and return the complete r_k."""
        if self.inflight is not None:
            delta = self.inflight.wait()
            self.cur = self.prev + (delta if self.bias is None else delta + self.bias)
            self.inflight = self.bias = None
        return self.cur

    def read(self, stale: bool) -> torch.Tensor:
        """The input of the next module: r_{k-1} when it reads stale, else r_k."""
        return self.prev if stale else self.resolve()

    def push(self, inflight: InFlight, bias: torch.Tensor | None) -> None:
        """Record the next module's all-reduce; first completes the previous one (the overlapped wait)."""
        self.prev = self.resolve()
        self.inflight, self.bias, self.cur = inflight, bias, None


# --- the rank model -----------------------------------------------------------------------------


class RankModel:
    """One rank's shard of the model and its forward pass under a ``CommPlan``."""

    def __init__(
        self,
        weights: RankWeights,
        config: Any,
        comm: Communicator,
        max_positions: int = 2048,
        compile_modules: bool = False,
        linear: str | LinearKernel = LinearKernel.AUTO,
    ):
        """``linear``: the kernel of the projections and the LM head (``kernels.py``)."""
        self.device, self.dtype = weights.embed.device, weights.embed.dtype
        self.kernel = resolve_kernel(linear, self.device, self.dtype, compiled=compile_modules)
        self.w = prepare_weights(weights, self.kernel)
        self.linear = linear_fn(self.kernel)
        self.dims, self.comm = weights.dims, comm
        self.heads, self.kv_heads = weights.heads_local, weights.kv_heads_local
        self.head_dim, self.eps = self.dims.head_dim, self.dims.rms_norm_eps
        self.group = self.heads // self.kv_heads  # query heads per local KV head (fewer under KV replication)
        self.act = activation(self.dims.hidden_act)
        self.rope = RotaryTable(config, max_positions, self.device, self.dtype)
        self.attention_partial = self._attention_partial
        self.mlp_partial = self._mlp_partial
        self.attention_partial_static = self._attention_partial_static
        if compile_modules:
            self.attention_partial_static = torch.compile(self._attention_partial_static, dynamic=False)
            self.mlp_partial = torch.compile(self._mlp_partial, dynamic=False)

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        self.rope.ensure(max_len)
        return KVCache.allocate(
            self.dims.num_layers, batch, self.kv_heads, max_len, self.head_dim, self.device, self.dtype
        )

    # modules: each returns this rank's partial output (before the sum) --------------------------
    # They take tensors, not the LayerWeights object, so that torch.compile traces them once for all layers.

    def _qkv_rotated(self, h, w_qkv, b_qkv, cos, sin):
        """q [B, S, Hl, hd], k and v [B, S, Kl, hd], with rotary applied to q and k together."""
        batch, seq, _ = h.shape
        hl, kl = self.heads, self.kv_heads
        qkv = self.linear(h, w_qkv, b_qkv).view(batch, seq, hl + 2 * kl, self.head_dim)
        q, k = rotate(qkv[:, :, : hl + kl], cos, sin).split((hl, kl), dim=2)
        return q, k, qkv[:, :, hl + kl :]

    def _attention_partial(self, h, w_qkv, b_qkv, w_o, keys, values, cos, sin, start: int) -> torch.Tensor:
        """``h`` [B, S, D] -> this rank's heads through its ``o_proj`` columns, [B, S, D]."""
        batch, seq, _ = h.shape
        q, k, v = self._qkv_rotated(h, w_qkv, b_qkv, cos, sin)
        end = start + seq
        keys[:, :, start:end] = k.transpose(1, 2)  # cache [B, Kl, T, hd]
        values[:, :, start:end] = v.transpose(1, 2)
        keys, values = keys[:, :, :end], values[:, :, :end]
        if seq == 1:  # decode: fold each KV head's query group into the query axis, no mask needed
            q = q.reshape(batch, self.kv_heads, self.group, self.head_dim)
            out = F.scaled_dot_product_attention(q, keys, values)  # [B, Kl, G, hd]
        else:
            mask = None
            if start > 0:  # a chunk after cached tokens: query i sees keys <= start + i
                key_pos = torch.arange(end, device=h.device)
                mask = key_pos[None, :] <= key_pos[start:, None]
            out = F.scaled_dot_product_attention(
                q.transpose(1, 2), keys, values, attn_mask=mask, is_causal=start == 0, enable_gqa=self.group > 1
            ).transpose(1, 2)  # [B, S, Hl, hd]
        return self.linear(out.reshape(batch, seq, self.heads * self.head_dim), w_o, None)

    def _attention_partial_static(self, h, w_qkv, b_qkv, w_o, keys, values, cos, sin, position) -> torch.Tensor:
        """Decode (S = 1) with the position as a 1-element tensor: fixed shapes, capturable in a CUDA graph."""
        batch = h.shape[0]
        q, k, v = self._qkv_rotated(h, w_qkv, b_qkv, cos, sin)
        keys.index_copy_(2, position, k.transpose(1, 2))
        values.index_copy_(2, position, v.transpose(1, 2))
        visible = torch.arange(keys.shape[2], device=h.device) <= position  # [T]
        q = q.reshape(batch, self.kv_heads, self.group, self.head_dim)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=visible[None, None, None, :])
        return self.linear(out.reshape(batch, 1, self.heads * self.head_dim), w_o, None)

    def _mlp_partial(self, h, w_gate_up, b_gate_up, w_down) -> torch.Tensor:
        gate, up = self.linear(h, w_gate_up, b_gate_up).chunk(2, dim=-1)
        return self.linear(self.act(gate) * up, w_down, None)

    def _attention(self, lw: LayerWeights, h, keys, values, position):
        if isinstance(position, torch.Tensor):
            cos, sin = self.rope.at_tensor(position)
            return self.attention_partial_static(h, lw.qkv, lw.qkv_bias, lw.o, keys, values, cos, sin, position)
        cos, sin = self.rope.at(position, h.shape[1])
        return self.attention_partial(h, lw.qkv, lw.qkv_bias, lw.o, keys, values, cos, sin, position)

    def _mlp(self, lw: LayerWeights, h):
        return self.mlp_partial(h, lw.gate_up, lw.gate_up_bias, lw.down)

    def _step(self, kind: StepKind, lw: LayerWeights, x: torch.Tensor, keys, values, position):
        """One module on input ``x``: ``(partial, bias)``; the output is ``sum_r(partial) + bias``."""
        if kind is StepKind.ATTENTION:
            return self._attention(lw, rms_norm(x, lw.ln1, self.eps), keys, values, position), lw.o_bias
        if kind is StepKind.MLP:
            return self._mlp(lw, rms_norm(x, lw.ln2, self.eps)), lw.down_bias
        # SPD block: Y_r = Attn_r(LN1(X)) W_O[r];  Z_r = MLP_r(LN2(X + Y_r));  out = X + sum_r(Y_r + Z_r)
        y = self._attention(lw, rms_norm(x, lw.ln1, self.eps), keys, values, position)
        y_local = y if lw.o_bias is None else y + lw.o_bias
        z = self._mlp(lw, rms_norm(x + y_local, lw.ln2, self.eps))
        return y + z, _add(lw.o_bias, lw.down_bias)

    # forward ---------------------------------------------------------------------------------

    def hidden(self, tokens: torch.Tensor, position: int | torch.Tensor, cache: KVCache, plan: CommPlan) -> torch.Tensor:
        """Final hidden states [B, S, D] (before the final norm) of ``tokens`` [B, S] at ``position``.

        ``position`` is the index of the first token: an int, or (static decode) a 1-element tensor.
        """
        x = F.embedding(tokens, self.w.embed)  # [B, S, D], replicated
        bounds = _chunk_bounds(tokens.shape[0], plan.chunks)
        streams = [ResidualStream(x[lo:hi]) for lo, hi in bounds]
        for step in plan.steps:
            lw = self.w.layers[step.layer]
            keys, values = cache.keys[step.layer], cache.values[step.layer]
            for (lo, hi), stream in zip(bounds, streams):  # domino: chunk i's all-reduce overlaps chunk i+1
                if len(streams) > 1:
                    keys, values = cache.keys[step.layer][lo:hi], cache.values[step.layer][lo:hi]
                partial, bias = self._step(step.kind, lw, stream.read(step.reads_stale), keys, values, position)
                stream.push(self.comm.all_reduce(partial, step.overlapped, plan.communicate), bias)
        outs = [stream.resolve() for stream in streams]
        return outs[0] if len(outs) == 1 else torch.cat(outs)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.linear(rms_norm(hidden, self.w.final_norm, self.eps), self.w.lm_head, None)

    def forward(
        self, tokens: torch.Tensor, position: int | torch.Tensor, cache: KVCache, plan: CommPlan, last_only: bool = False
    ) -> torch.Tensor:
        """Logits [B, S, V] (or [B, 1, V] with ``last_only``) and the cache filled for these tokens."""
        hidden = self.hidden(tokens, position, cache, plan)
        return self.logits(hidden[:, -1:] if last_only else hidden)


def _chunk_bounds(batch: int, chunks: int) -> list[tuple[int, int]]:
    chunks = max(1, min(chunks, batch))
    edges = [round(i * batch / chunks) for i in range(chunks + 1)]
    return list(zip(edges[:-1], edges[1:]))


# --- decoding -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sampling:
    """Greedy when ``temperature == 0``; otherwise temperature / top-k / top-p sampling with a seed."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0


def pick_tokens(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator | None) -> torch.Tensor:
    """Next token per row of ``logits`` [B, V]. Every rank holds identical logits and the same seed."""
    if sampling.greedy:  # in float32, as transformers does: exact, and a bfloat16 argmax is slow on CPU
        return logits.float().argmax(dim=-1)
    scores = logits.float() / sampling.temperature
    if sampling.top_k > 0:
        kth = torch.topk(scores, min(sampling.top_k, scores.shape[-1]), dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if sampling.top_p < 1.0:
        ordered, index = scores.sort(dim=-1, descending=True)
        cumulative = ordered.softmax(-1).cumsum(-1)
        drop = cumulative - ordered.softmax(-1) > sampling.top_p  # keep the smallest set reaching top_p
        scores = scores.scatter(-1, index, ordered.masked_fill(drop, float("-inf")))
    probs = scores.softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


class Decoder:
    """Prefill then token-by-token decode on one rank, optionally through a captured CUDA graph."""

    def __init__(
        self,
        model: RankModel,
        plan: CommPlan,
        batch: int,
        max_len: int,
        cuda_graphs: bool = False,
        static: bool = False,
        cache: KVCache | None = None,
    ):
        self.model, self.plan = model, plan
        self.cache = cache if cache is not None else model.new_cache(batch, max_len)
        self.static = static or cuda_graphs
        self.cuda_graphs = cuda_graphs and model.device.type == "cuda"
        self._graph = None
        if self.static:
            self._tokens = torch.zeros(batch, 1, dtype=torch.long, device=model.device)
            self._position = torch.zeros(1, dtype=torch.long, device=model.device)

    def prefill(self, tokens: torch.Tensor, last_only: bool = True) -> torch.Tensor:
        return self.model.forward(tokens, 0, self.cache, self.plan, last_only=last_only)

    def extend(self, tokens: torch.Tensor, position: int, last_only: bool = True) -> torch.Tensor:
        """Logits for ``tokens`` [B, S] that follow ``position`` cached tokens."""
        if tokens.shape[1] == 1 and self.static:
            return self._decode_static(tokens, position)
        return self.model.forward(tokens, position, self.cache, self.plan, last_only=last_only)

    def _decode_static(self, tokens: torch.Tensor, position: int) -> torch.Tensor:
        self._tokens.copy_(tokens)
        self._position.fill_(position)
        if not self.cuda_graphs:
            return self.model.forward(self._tokens, self._position, self.cache, self.plan)
        if self._graph is None:
            self._capture()
        self._graph.replay()
        return self._graph_logits

    def _capture(self) -> None:
        """Record one decode step (communication included) into a CUDA graph. Unvalidated without a GPU."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm-up outside the graph (allocator, NCCL communicators)
            for _ in range(2):
                self.model.forward(self._tokens, self._position, self.cache, self.plan)
        torch.cuda.current_stream().wait_stream(stream)
        self._graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self._graph):
            self._graph_logits = self.model.forward(self._tokens, self._position, self.cache, self.plan)


def generate_on_rank(
    decoder: Decoder,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    sampling: Sampling = Sampling(),
    eos_token_ids: tuple[int, ...] = (),
    pad_token_id: int = 0,
) -> torch.Tensor:
    """New tokens [B, <=K]: stops when every row has produced an EOS (rows that finished get padding)."""
    generator = None
    if not sampling.greedy:
        generator = torch.Generator(device=input_ids.device).manual_seed(sampling.seed)
    logits = decoder.prefill(input_ids)[:, -1]
    position = input_ids.shape[1]
    finished = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
    eos = torch.tensor(eos_token_ids, device=input_ids.device, dtype=torch.long)
    out = []
    for index in range(max_new_tokens):
        token = pick_tokens(logits, sampling, generator)
        token = torch.where(finished, torch.full_like(token, pad_token_id), token)
        out.append(token)
        if eos.numel():
            finished |= torch.isin(token, eos)
            if bool(finished.all()):
                break
        if index + 1 < max_new_tokens:
            logits = decoder.extend(token[:, None], position)[:, -1]
            position += 1
    return torch.stack(out, dim=1) if out else input_ids.new_zeros(input_ids.shape[0], 0)


__all__ = [
    "Decoder",
    "KVCache",
    "RankModel",
    "ResidualStream",
    "RotaryTable",
    "Sampling",
    "generate_on_rank",
    "pick_tokens",
    "rms_norm",
]
