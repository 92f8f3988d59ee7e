"""An independent reference for the Ladder / SPD Llama, written from MISSION.md's equations.

It uses plain torch ops on a Llama ``state_dict`` and deliberately imports neither
``ladderize.model.modeling_ladder_llama`` nor transformers' Llama modules, so a parity test
against it checks the model's *function*, not its reuse of shared code.

Modules are numbered k = 1..2L (attention, MLP, attention, ...). ``r[k]`` is the residual
after module k, with r_0 = embeddings and r_{-1} = r_0:

    dense:  r_k = r_{k-1} + f_k(norm_k(r_{k-1}))
    ladder: r_k = r_{k-1} + f_k(norm_k(r_{k-2}))

An SPD block (N ranks) maps its input X = r_{2i} to
``out = X + sum_r (Y_r + Z_r)`` with ``Y_r = Attn_r(LN1(X)) @ W_O[:, cols_r]^T`` and
``Z_r = MLP_r(LN2(X + Y_r))``. Its two modules are recorded as r_{2i+1} = X (the state a
following ladder module sees as r_{k-2}: nothing newer exists before the block's single
all-reduce) and r_{2i+2} = out. The final norm and the LM head read r_{2L}.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) * weight, over the last dimension."""
    return x / torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * weight


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Default RoPE tables for ``positions`` [B, S]: cos, sin of shape [B, S, head_dim]."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))  # [hd/2]
    angles = positions.to(torch.float64)[..., None] * inv_freq  # [B, S, hd/2]
    angles = torch.cat([angles, angles], dim=-1)  # [B, S, hd]
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half convention: x * cos + rotate_half(x) * sin. x: [B, heads, S, hd]."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None] + rotated * sin[:, None]


class Reference:
    """The reference model: ``Reference(state_dict, config)(input_ids) -> logits``."""

    def __init__(self, state_dict: Mapping[str, torch.Tensor], config):
        self.w = {name: t.detach().float() for name, t in state_dict.items()}
        if any(name.endswith(".bias") for name in self.w):
            raise NotImplementedError("the reference implements the bias-free Llama only")
        self.num_layers = config.num_hidden_layers
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.intermediate = config.intermediate_size
        self.eps = config.rms_norm_eps
        self.theta = config.rope_parameters["rope_theta"]
        self.modes = list(getattr(config, "layer_modes", None) or ["dense"] * self.num_layers)
        self.spd_tp = int(getattr(config, "spd_tp_size", 1) or 1)
        self.spd_order = getattr(config, "spd_head_order", None)
        if "lm_head.weight" not in self.w:  # tied embeddings
            self.w["lm_head.weight"] = self.w["model.embed_tokens.weight"]

    # ----------------------------------------------------------------- building blocks
    def _p(self, layer: int, name: str) -> torch.Tensor:
        return self.w[f"model.layers.{layer}.{name}"]

    def attention_heads(self, layer: int, x: torch.Tensor, cos, sin, key_ok: torch.Tensor) -> torch.Tensor:
        """Per-head attention outputs before o_proj: [B, S, H, hd]. ``key_ok`` [B, S] marks real tokens."""
        batch, seq, _ = x.shape
        hd, heads, kv_heads = self.head_dim, self.num_heads, self.num_kv_heads
        q = (x @ self._p(layer, "self_attn.q_proj.weight").T).view(batch, seq, heads, hd).transpose(1, 2)
        k = (x @ self._p(layer, "self_attn.k_proj.weight").T).view(batch, seq, kv_heads, hd).transpose(1, 2)
        v = (x @ self._p(layer, "self_attn.v_proj.weight").T).view(batch, seq, kv_heads, hd).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = torch.empty(batch, seq, heads, hd)
        group = heads // kv_heads
        causal = torch.ones(seq, seq, dtype=torch.bool).tril()  # [S_q, S_k]
        allowed = causal[None] & key_ok[:, None, :]  # [B, S_q, S_k]
        for h in range(heads):
            kv = h // group  # query head h attends with KV head h // (H/K)
            scores = q[:, h] @ k[:, kv].transpose(-1, -2) / math.sqrt(hd)  # [B, S, S]
            scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
            probs = torch.softmax(scores, dim=-1)
            out[:, :, h] = probs @ v[:, kv]
        return out

    def attention(self, layer: int, x, cos, sin, key_ok) -> torch.Tensor:
        heads = self.attention_heads(layer, x, cos, sin, key_ok).flatten(2)  # [B, S, H*hd]
        return heads @ self._p(layer, "self_attn.o_proj.weight").T

    def mlp(self, layer: int, x: torch.Tensor, rows: slice = slice(None)) -> torch.Tensor:
        """SwiGLU MLP restricted to the intermediate units ``rows`` (all by default)."""
        gate = x @ self._p(layer, "mlp.gate_proj.weight")[rows].T
        up = x @ self._p(layer, "mlp.up_proj.weight")[rows].T
        return (torch.nn.functional.silu(gate) * up) @ self._p(layer, "mlp.down_proj.weight")[:, rows].T

    def ln1(self, layer: int, x):
        return rms_norm(x, self._p(layer, "input_layernorm.weight"), self.eps)

    def ln2(self, layer: int, x):
        return rms_norm(x, self._p(layer, "post_attention_layernorm.weight"), self.eps)

    def spd_block(self, layer: int, x: torch.Tensor, cos, sin, key_ok) -> torch.Tensor:
        """out = X + sum_r (Y_r + Z_r); rank r owns a contiguous group of KV heads and MLP shard r."""
        n = self.spd_tp
        order = self.spd_order[layer] if self.spd_order and self.spd_order[layer] is not None else None
        order = list(order) if order is not None else list(range(self.num_kv_heads))
        kv_per_rank = self.num_kv_heads // n
        group = self.num_heads // self.num_kv_heads
        inner = self.intermediate // n
        heads = self.attention_heads(layer, self.ln1(layer, x), cos, sin, key_ok)  # [B, S, H, hd]
        w_o = self._p(layer, "self_attn.o_proj.weight")  # [D, H*hd]
        out = x
        for rank in range(n):
            kv_heads = order[rank * kv_per_rank : (rank + 1) * kv_per_rank]
            q_heads = [h for h in range(self.num_heads) if h // group in kv_heads]  # order is irrelevant
            cols = torch.tensor([h * self.head_dim + d for h in q_heads for d in range(self.head_dim)])
            y = heads[:, :, q_heads].flatten(2) @ w_o[:, cols].T
            z = self.mlp(layer, self.ln2(layer, x + y), slice(rank * inner, (rank + 1) * inner))
            out = out + (y + z)
        return out

    # ----------------------------------------------------------------- the model
    @torch.no_grad()
    def __call__(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits [B, S, V]. ``attention_mask`` [B, S] (1 = token, 0 = padding) masks keys only."""
        batch, seq = input_ids.shape
        key_ok = torch.ones(batch, seq, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
        if position_ids is None:
            position_ids = torch.arange(seq).expand(batch, seq)
        cos, sin = rope_cos_sin(position_ids, self.head_dim, self.theta)

        r0 = self.w["model.embed_tokens.weight"][input_ids]
        r: list[torch.Tensor] = [r0, r0]  # r[k + 1] is r_k: r[0] = r_{-1} = r_0, r[1] = r_0

        def prev(k: int) -> torch.Tensor:  # r_{k-1}
            return r[k]

        def prev2(k: int) -> torch.Tensor:  # r_{k-2}
            return r[k - 1]

        for layer, mode in enumerate(self.modes):
            k_attn, k_mlp = 2 * layer + 1, 2 * layer + 2
            if mode == "spd":
                x = prev(k_attn)
                r.append(x)  # r_{2i+1}: no complete state exists mid-block, stale readers see X
                r.append(self.spd_block(layer, x, cos, sin, key_ok))
                continue
            if mode == "dense":
                read_attn, read_mlp = prev, prev
            elif mode == "ladder":
                read_attn, read_mlp = prev2, prev2
            else:
                raise ValueError(f"unknown mode {mode!r}")
            r.append(prev(k_attn) + self.attention(layer, self.ln1(layer, read_attn(k_attn)), cos, sin, key_ok))
            r.append(prev(k_mlp) + self.mlp(layer, self.ln2(layer, read_mlp(k_mlp))))

        assert len(r) == 2 * self.num_layers + 2
        hidden = rms_norm(r[-1], self.w["model.norm.weight"], self.eps)  # r_{2L}
        return hidden @ self.w["lm_head.weight"].T


def reference_logits(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
    config=None,
) -> torch.Tensor:
    """Run the reference on ``model``'s weights and config (or an explicit ``config``)."""
    return Reference(model.state_dict(), config or model.config)(input_ids, attention_mask, position_ids)
