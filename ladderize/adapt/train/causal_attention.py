"""Causal self-attention for compiled training on a CPU: the flash kernel's forward, a backward Inductor fuses.

PyTorch's CPU flash-attention kernel computes the forward of a converted layer's attention (SmolLM2, 2 x 512
tokens, 9 query and 3 key/value heads of 64, bf16) in about 6 ms, and its backward in about 36 ms: a quarter of
the layer's whole training step, more than all its matmuls' backward. The backward here is the same math written
as plain tensor ops, one block of query rows at a time (the flash algorithm's recomputation of the probabilities
from the forward's log-sum-exp, so memory stays ``block x S`` per head): under ``torch.compile`` (``compilation.py``
compiles every decoder layer's forward, and with it this backward) Inductor fuses its elementwise work around the
matmuls (``benchmarks/bench_layer_step.py`` times it). Eager, the same ops run one pass at a time and are slower
than the kernel, so only compiled layers use it.

``training_attention`` has the signature of transformers' attention functions (``ALL_ATTENTION_FUNCTIONS``); it
runs ``CausalAttention`` where it applies (causal self-attention with no mask, no dropout, no cache, the query as long
as the keys) and an input needs a gradient, and the stock SDPA function everywhere else.

For each query block ``b`` (rows ``r``, keys ``0..end``), with ``P = exp(scale * Q K^T - lse)`` masked causally,
``delta = rowsum(dO * O)``: ``dV += P^T dO``, ``dP = dO V^T``, ``dS = P * (dP - delta)``, ``dQ = scale * dS K``,
``dK += scale * dS^T Q``; query heads of one key/value head (grouped-query attention) add into its ``dK`` and ``dV``.
The matmuls take the inputs' dtype (bf16 under autocast) with float32 accumulation, the softmax and its
gradient float32 (float64 for float64 inputs), as the kernel does.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward

BLOCK = 128  # query rows per block of the backward: 1.13-1.21x the SDPA kernel's compiled layer step, against 1.08x at 64 and 1.10x at 256


class CausalAttention(torch.autograd.Function):
    """``softmax(scale * Q K^T + causal mask) V`` for ``q [B, H, S, D]``, ``k, v [B, K, S, D]`` (``H`` a multiple of
    ``K``): the flash kernel's forward, the blocked backward of the module docstring."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        groups = q.shape[1] // k.shape[1]
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, repeat_kv(k, groups), repeat_kv(v, groups), 0.0, True, attn_mask=None, scale=scale)[:2]
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        q, k, v, out, lse = ctx.saved_tensors
        return (*attention_backward(q, k, v, out, lse, grad_out, ctx.scale), None)


def attention_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                       grad_out: torch.Tensor, scale: float, block: int = BLOCK) -> tuple[torch.Tensor, ...]:
    """Gradients of causal attention with respect to ``q``, ``k`` and ``v`` from the forward's output and
    log-sum-exp ``lse [B, H, S]`` (module docstring)."""
    batch, kv_heads, length, dim = k.shape
    groups = q.shape[1] // kv_heads
    grouped = (batch, kv_heads, groups, length)
    acc = torch.promote_types(q.dtype, torch.float32)  # the softmax's and the sums' dtype: float32, float64 for float64
    q5, do5 = q.view(*grouped, dim), grad_out.view(*grouped, dim)
    delta = (grad_out.to(acc) * out.to(acc)).sum(-1).view(grouped)
    lse = lse.view(grouped)
    dq_blocks = []
    dk = torch.zeros(batch, kv_heads, length, dim, dtype=acc, device=q.device)
    dv = torch.zeros_like(dk)
    for start in range(0, length, block):
        end = min(length, start + block)
        rows = end - start
        qb = q5[:, :, :, start:end].reshape(batch, kv_heads, groups * rows, dim)
        dob = do5[:, :, :, start:end].reshape(batch, kv_heads, groups * rows, dim)
        kb, vb = k[:, :, :end], v[:, :, :end]
        future = torch.ones(rows, end, dtype=torch.bool, device=q.device).triu_(start + 1)
        scores = torch.matmul(qb, kb.transpose(-1, -2)).to(acc).view(batch, kv_heads, groups, rows, end)
        probs = (scores * scale - lse[..., start:end, None]).masked_fill(future, float("-inf")).exp()
        dv[:, :, :end] += torch.matmul(probs.to(q.dtype).view(batch, kv_heads, groups * rows, end).transpose(-1, -2),
                                       dob).to(acc)
        dprobs = torch.matmul(dob, vb.transpose(-1, -2)).to(acc).view(batch, kv_heads, groups, rows, end)
        dscores = (probs * (dprobs - delta[..., start:end, None])).to(q.dtype).view(batch, kv_heads, groups * rows, end)
        dq_blocks.append((torch.matmul(dscores, kb).to(acc) * scale).view(batch, kv_heads, groups, rows, dim))
        dk[:, :, :end] += torch.matmul(dscores.transpose(-1, -2), qb).to(acc) * scale
    dq = torch.cat(dq_blocks, dim=3).view(q.shape)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def applies(query: torch.Tensor, key: torch.Tensor, attention_mask: torch.Tensor | None, dropout: float,
            kwargs: dict[str, Any]) -> bool:
    """Whether ``CausalAttention`` computes this call: causal self-attention on a CPU, with a gradient to take."""
    return (attention_mask is None and dropout == 0.0 and query.device.type == "cpu" and query.shape[2] == key.shape[2] > 1
            and kwargs.get("is_causal", True) and torch.is_grad_enabled()
            and (query.requires_grad or key.requires_grad))


def training_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                       attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                       **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: ``[B, S, H, D]`` and no weights (module docstring)."""
    if not applies(query, key, attention_mask, dropout, kwargs):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    if torch.is_autocast_enabled("cpu"):  # as autocast casts SDPA's inputs (the kernel is called below autocast here)
        dtype = torch.get_autocast_dtype("cpu")
        query, key, value = (tensor.to(dtype) for tensor in (query, key, value))
    return CausalAttention.apply(query, key, value, scale).transpose(1, 2).contiguous(), None
