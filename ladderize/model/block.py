"""The Llama block's math as plain functions, shared by the HF model and the TP runtime's rank model.

``modeling_ladder_llama.py`` (one device, ``nn.Linear`` modules that peft may wrap) and
``runtime/engine.py`` (one TP rank, fused q|k|v and gate|up weights, gemv/oneDNN kernels) both
call these. Weights and the linear are arguments (``linear(x, weight, bias)``, ``F.linear``'s
contract), so each side keeps its own storage and kernels. Shapes: B batch, S sequence,
D hidden, H / K query / key-value heads (of a rank or head group), hd head dim, I the
intermediate slice of a rank.

An SPD block on input X, with head group (TP rank) r owning query heads ``cols_r`` and MLP
slice r:

    Y_r = Attn_r(LN1(X)) @ W_O[:, cols_r]^T        attention_partial
    Z_r = MLP_r(LN2(X + Y_r + b_O))                 spd_share, with mlp_partial inside MLP_r
    out = X + sum_r (Y_r + Z_r) + b_O + b_down      spd_block (in the runtime: the all-reduce)

Depends on torch only: it travels beside the modeling file in a converted checkpoint
(``auto_map``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import torch
import torch.nn.functional as F

LinearFn = Callable[[torch.Tensor, torch.Tensor, "torch.Tensor | None"], torch.Tensor]
Activation = Callable[[torch.Tensor], torch.Tensor]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Llama's RMSNorm: normalise in float32, cast back to ``x``'s dtype, then scale by ``weight`` [D].

    On CPU torch runs the very ops of transformers' ``LlamaRMSNorm`` (pow, mean, add, rsqrt,
    mul), so the two agree bit for bit. On CUDA torch (2.8 and later) runs one fused kernel
    that rounds differently; the HF model therefore keeps ``LlamaRMSNorm``, so that it stays
    bit-identical to transformers' Llama on every device, and the runtime keeps the fused kernel.
    """
    return weight * F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype)


def fold_rotary_sign(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' rotary tables ``(cos, sin)`` [..., S, hd] as ``rotate`` takes them: ``(cos, sin_signed)``.

    ``sin_signed = cat(-sin1, sin2)`` carries the sign of ``rotate_half`` (halves of hd).
    """
    half = sin.shape[-1] // 2
    return cos, torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of ``x`` [..., S, n, hd] with tables [..., S, hd] from ``fold_rotary_sign``.

    Llama's ``x * cos + rotate_half(x) * sin`` with ``rotate_half(x) = cat(-x2, x1)``: rolling
    by half gives ``cat(x2, x1)`` and the sign sits in ``sin_signed``. A sign flip is exact,
    so every product, and the sum, equal Llama's bit for bit.
    """
    cos, sin_signed = cos.unsqueeze(-2), sin_signed.unsqueeze(-2)  # broadcast over the heads
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin_signed


def split_heads(x: torch.Tensor, head_dim: int) -> torch.Tensor:
    """A projection's output [B, S, n * hd] as heads [B, S, n, hd] (a view)."""
    return x.view(*x.shape[:-1], -1, head_dim)


def qkv_heads(
    qkv: torch.Tensor, heads: int, kv_heads: int, head_dim: int, cos: torch.Tensor, sin_signed: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A fused q|k|v projection [B, S, (H + 2K) * hd] as q [B, S, H, hd] and k [B, S, K, hd] with
    rotary applied (in one op: they are adjacent), and v [B, S, K, hd].

    The HF model's projections are separate modules (peft wraps each), so it applies
    ``split_heads`` and ``rotate`` to each instead: a fused copy would cost a concatenation and
    keep all three projections alive under autograd wherever v is saved.
    """
    qkv = split_heads(qkv, head_dim)
    q, k = rotate(qkv[..., : heads + kv_heads, :], cos, sin_signed).split((heads, kv_heads), dim=-2)
    return q, k, qkv[..., heads + kv_heads :, :]


def attention_partial(heads: torch.Tensor, w_o: torch.Tensor, linear: LinearFn = F.linear) -> torch.Tensor:
    """A head group's share of ``o_proj``: its heads' outputs [B, S, Hg * hd] through the matching
    input columns ``w_o`` [D, Hg * hd]. No bias: ``o_proj``'s bias is added once, after the sum over groups."""
    return linear(heads, w_o, None)


def mlp_partial(
    gate: torch.Tensor, up: torch.Tensor, w_down: torch.Tensor, act: Activation, linear: LinearFn = F.linear
) -> torch.Tensor:
    """An intermediate slice's share of the SwiGLU MLP: ``act(gate) * up`` [B, S, I] through
    ``down_proj``'s columns of that slice ``w_down`` [D, I]. No bias (added once, after the sum)."""
    return linear(act(gate) * up, w_down, None)


def spd_share(
    x: torch.Tensor, y: torch.Tensor, o_bias: torch.Tensor | None, mlp: Callable[[torch.Tensor], torch.Tensor]
) -> torch.Tensor:
    """Head group r's share ``Y_r + Z_r`` of an SPD block on input ``x`` [B, S, D].

    ``y`` is ``Y_r`` (``attention_partial`` of LN1(X)); ``mlp(h)`` is ``MLP_r(LN2(h))``. The group's
    MLP reads ``X + Y_r``, with ``o_proj``'s bias when it has one: its own view of the attention output.
    """
    y_local = y if o_bias is None else y + o_bias
    return y + mlp(x + y_local)


def spd_block(x: torch.Tensor, shares: Iterable[torch.Tensor], biases: Iterable[torch.Tensor | None]) -> torch.Tensor:
    """An SPD block's output on one device: ``X + sum_r share_r``, then each bias (``b_O``, ``b_down``).

    The runtime sums the shares with its single all-reduce instead.
    """
    out = x
    for share in shares:
        out = out + share
    for bias in biases:
        if bias is not None:
            out = out + bias
    return out


def permute_attention(
    name: str, tensor: torch.Tensor, kv_order: Sequence[int], q_order: Sequence[int], head_dim: int
) -> torch.Tensor:
    """One attention tensor with its heads reordered: the one head-order permutation (SPD head grouping, vLLM's load).

    ``name`` ends in ``q_proj.weight``/``.bias``, ``k_proj.*`` or ``v_proj.*`` (output rows in blocks of
    ``head_dim``) or ``o_proj.weight`` (input columns); any other tensor (``o_proj.bias``) comes back as it
    is. New KV head j is old KV head ``kv_order[j]``; ``q_order`` lists the query heads that follow them
    (``layout.rank_query_heads(kv_order, H, K)``: GQA groups stay together). A relabelling of heads: the
    layer's function is unchanged.
    """
    proj, kind = name.split(".")[-2:]
    if proj in ("q_proj", "k_proj", "v_proj"):
        index = torch.tensor(list(q_order if proj == "q_proj" else kv_order), device=tensor.device)
        return tensor.reshape(-1, head_dim, *tensor.shape[1:]).index_select(0, index).reshape(tensor.shape)
    if proj == "o_proj" and kind == "weight":
        index = torch.tensor(list(q_order), device=tensor.device)
        return tensor.reshape(tensor.shape[0], -1, head_dim).index_select(1, index).reshape(tensor.shape)
    return tensor


__all__ = [
    "LinearFn",
    "attention_partial",
    "fold_rotary_sign",
    "mlp_partial",
    "permute_attention",
    "qkv_heads",
    "rms_norm",
    "rotate",
    "spd_block",
    "spd_share",
    "split_heads",
]
