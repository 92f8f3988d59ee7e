"""``causal_attention``: the flash kernel's forward and the blocked backward compute causal attention and its exact
gradients (float64 the reference), as well as the stock SDPA function does, and it steps aside where it does not apply."""

from __future__ import annotations

import types

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from ladderize.adapt.train.causal_attention import BLOCK, CausalAttention, applies, attention_backward, training_attention
from ladderize.adapt.plan.compile_policy import unavailable


def _inputs(batch: int, heads: int, kv_heads: int, length: int, dim: int, dtype: torch.dtype, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    shapes = ((batch, heads, length, dim), (batch, kv_heads, length, dim), (batch, kv_heads, length, dim))
    tensors = [torch.randn(*shape, generator=generator).to(dtype).requires_grad_() for shape in shapes]
    return tensors, torch.randn(batch, length, heads, dim, generator=generator)


def _run(fn, heads: int, kv_heads: int, length: int, dtype: torch.dtype, autocast: bool = False):
    """Output ``[B, S, H, D]`` and the gradients of q, k, v for a fixed upstream gradient."""
    (q, k, v), upstream = _inputs(2, heads, kv_heads, length, 16, dtype)
    module = types.SimpleNamespace(num_key_value_groups=heads // kv_heads, is_causal=True, training=True)
    with torch.autocast("cpu", torch.bfloat16, enabled=autocast):
        out, weights = fn(module, q, k, v, None, dropout=0.0, scaling=16**-0.5)
    assert weights is None
    (out.float() * upstream).sum().backward()
    return out, q.grad, k.grad, v.grad


def _relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want.double()).norm() / want.double().norm()).item()


@pytest.mark.parametrize("heads,kv_heads,length", [(6, 2, 2 * BLOCK + 37), (4, 4, BLOCK), (3, 1, 5)])
def test_float32_output_and_gradients_are_sdpas(heads, kv_heads, length):
    """Grouped and plain heads; a length with a partial last block, one block, less than a block."""
    exact = _run(sdpa_attention_forward, heads, kv_heads, length, torch.float64)
    stock = _run(sdpa_attention_forward, heads, kv_heads, length, torch.float32)
    mine = _run(training_attention, heads, kv_heads, length, torch.float32)
    assert torch.equal(mine[0], stock[0])  # the same kernel's forward
    for got, want, truth in zip(mine[1:], stock[1:], exact[1:]):
        assert _relative(got, truth) < 1e-5 and _relative(got, want) < 1e-5


@pytest.mark.parametrize("autocast", [True, False], ids=["autocast", "bf16"])
def test_bf16_gradients_are_as_close_to_the_exact_ones_as_the_kernels(autocast):
    """Under autocast (float32 inputs cast to bf16, as autocast casts SDPA's) and on bf16 inputs: the forward is the
    kernel's to the bit, and each gradient is within bf16's rounding of the float64 one (about 5e-3 for the kernel)."""
    dtype = torch.float32 if autocast else torch.bfloat16
    exact = _run(sdpa_attention_forward, 6, 2, 2 * BLOCK + 37, torch.float64)
    stock = _run(sdpa_attention_forward, 6, 2, 2 * BLOCK + 37, dtype, autocast)
    mine = _run(training_attention, 6, 2, 2 * BLOCK + 37, dtype, autocast)
    assert mine[0].dtype == stock[0].dtype == torch.bfloat16 and torch.equal(mine[0], stock[0])
    for name, got, want, truth in zip("qkv", mine[1:], stock[1:], exact[1:]):
        assert got.dtype == want.dtype == dtype, name
        assert _relative(got, truth) < 1e-2, (name, _relative(got, truth), _relative(want, truth))


def test_the_backward_does_not_depend_on_the_block():
    (q, k, v), _ = _inputs(1, 4, 2, 100, 8, torch.float64)
    out = CausalAttention.apply(q, k, v, 8**-0.5)
    grad = torch.randn_like(out)
    lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), 0.0, True, attn_mask=None, scale=8**-0.5)[1]
    whole = attention_backward(q, k, v, out, lse, grad, 8**-0.5, block=100)
    for block in (1, 7, 64):
        for got, want in zip(attention_backward(q, k, v, out, lse, grad, 8**-0.5, block=block), whole):
            assert torch.allclose(got, want, rtol=1e-10, atol=1e-12), block


def test_where_it_does_not_apply_the_stock_sdpa_runs():
    (q, k, v), _ = _inputs(1, 2, 2, 8, 4, torch.float32)
    mask = torch.zeros(1, 1, 8, 8)
    assert applies(q, k, None, 0.0, {})
    assert not applies(q, k, mask, 0.0, {})  # a mask (padding): SDPA
    assert not applies(q, k, None, 0.1, {})  # dropout
    assert not applies(q[:, :, :1], k, None, 0.0, {})  # a decode step against a cache
    assert not applies(q, k, None, 0.0, {"is_causal": False})
    with torch.no_grad():
        assert not applies(q, k, None, 0.0, {})  # nothing to differentiate: the kernel alone
    frozen = [t.detach() for t in (q, k, v)]
    assert not applies(frozen[0], frozen[1], None, 0.0, {})


@pytest.mark.skipif(unavailable("cpu") is not None, reason=f"torch.compile cannot run here: {unavailable('cpu')}")
def test_the_compiled_backward_equals_the_eager_one():
    """What a compiled layer runs: Inductor's fusion of the blocked backward, within float32 rounding of it eager."""
    (q, k, v), _ = _inputs(2, 6, 2, 2 * BLOCK + 37, 16, torch.float32)
    out = CausalAttention.apply(q, k, v, 0.25)
    lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k.repeat_interleave(3, 1), v.repeat_interleave(3, 1), 0.0, True, attn_mask=None, scale=0.25)[1]
    grad = torch.randn_like(out)
    eager = attention_backward(q, k, v, out, lse, grad, 0.25)
    compiled = torch.compile(attention_backward, dynamic=False)(q, k, v, out, lse, grad, 0.25)
    for got, want in zip(compiled, eager):
        assert _relative(got, want) < 1e-5
