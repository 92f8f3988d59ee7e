"""The shared block math (``ladderize/model/block.py``): against plainly written formulas, against
transformers' Llama, and the HF model against the runtime's rank model through it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tests.conftest import TINY, tiny_model
from tests.runtime.runtime_helpers import case_overrides
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaRMSNorm, LlamaRotaryEmbedding, apply_rotary_pos_emb

from ladderize.model.block import (
    attention_partial,
    fold_rotary_sign,
    mlp_partial,
    qkv_heads,
    rms_norm,
    rotate,
    spd_block,
    spd_share,
    split_heads,
)

from .helpers import token_ids
from .reference import apply_rope, rope_cos_sin
from .reference import rms_norm as reference_rms_norm

DTYPES = [torch.float32, torch.bfloat16]


def _randn(*shape: int, seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_is_llamas_bit_for_bit_on_cpu(dtype):
    x, weight = _randn(3, 7, 48, dtype=dtype), _randn(48, seed=1, dtype=dtype)
    llama = LlamaRMSNorm(48, eps=1e-6).to(dtype)
    with torch.no_grad():
        llama.weight.copy_(weight)
        assert torch.equal(rms_norm(x, weight, 1e-6), llama(x))
    if dtype == torch.float32:
        assert torch.allclose(rms_norm(x, weight, 1e-6), reference_rms_norm(x, weight, 1e-6), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rotate_is_llamas_rotary_bit_for_bit(dtype):
    """The roll form with the folded sign equals ``x * cos + rotate_half(x) * sin`` exactly, and the reference."""
    config = LlamaConfig(hidden_size=64, num_attention_heads=4, head_dim=16, rope_theta=10000.0)
    batch, seq, heads, kv_heads, hd = 2, 9, 4, 2, 16
    positions = torch.arange(3, 3 + seq).expand(batch, seq)
    q, k = _randn(batch, heads, seq, hd, dtype=dtype), _randn(batch, kv_heads, seq, hd, seed=1, dtype=dtype)
    cos, sin = LlamaRotaryEmbedding(config)(q, positions)  # [B, S, hd]
    q_llama, k_llama = apply_rotary_pos_emb(q, k, cos, sin)
    cos_f, sin_f = fold_rotary_sign(cos, sin)
    assert torch.equal(rotate(q.transpose(1, 2), cos_f, sin_f).transpose(1, 2), q_llama)
    assert torch.equal(rotate(k.transpose(1, 2), cos_f, sin_f).transpose(1, 2), k_llama)
    if dtype == torch.float32:
        ref_cos, ref_sin = rope_cos_sin(positions, hd, 10000.0)
        assert torch.allclose(q_llama, apply_rope(q, ref_cos, ref_sin), atol=1e-5)


def test_qkv_heads_of_a_fused_projection_equal_the_separate_ones():
    """The runtime's fused q|k|v (one rotary op) and the HF model's separate projections agree exactly."""
    batch, seq, heads, kv_heads, hd = 2, 5, 6, 3, 8
    q, k, v = (_randn(batch, seq, n * hd, seed=n) for n in (heads, kv_heads, kv_heads + 10))
    v = v[..., : kv_heads * hd]
    cos, sin = fold_rotary_sign(_randn(seq, hd, seed=7), _randn(seq, hd, seed=8))
    fused_q, fused_k, fused_v = qkv_heads(torch.cat([q, k, v], -1), heads, kv_heads, hd, cos, sin)
    assert torch.equal(fused_q, rotate(split_heads(q, hd), cos, sin))
    assert torch.equal(fused_k, rotate(split_heads(k, hd), cos, sin))
    assert torch.equal(fused_v, split_heads(v, hd)) and fused_v.shape == (batch, seq, kv_heads, hd)


def test_partials_over_groups_sum_to_the_whole_modules():
    """o_proj over head groups' columns and the MLP over intermediate slices add up to the full modules."""
    d, heads, hd, inner = 24, 6, 4, 36
    x, h = _randn(2, 5, d), _randn(2, 5, heads * hd, seed=1)
    w_o, w_gate, w_up, w_down = (0.2 * _randn(*s, seed=i + 2) for i, s in enumerate([(d, heads * hd), (inner, d), (inner, d), (d, inner)]))
    groups = [torch.tensor([0, 1, 2, 3, 12, 13, 14, 15]), torch.arange(4, 12), torch.arange(16, 24)]  # heads {0,3}, {1,2}, {4,5}
    o_sum = sum(attention_partial(h.index_select(-1, cols), w_o.index_select(1, cols)) for cols in groups)
    assert torch.allclose(o_sum, h @ w_o.T, atol=1e-5)
    slices = [slice(0, 12), slice(12, 24), slice(24, 36)]
    mlp_sum = sum(mlp_partial(x @ w_gate[s].T, x @ w_up[s].T, w_down[:, s], F.silu) for s in slices)
    full = (F.silu(x @ w_gate.T) * (x @ w_up.T)) @ w_down.T
    assert torch.allclose(mlp_sum, full, atol=1e-5)
    packed = mlp_partial(x @ w_gate.T, x @ w_up.T, w_down, F.silu, linear=lambda a, w, b: a @ w.T)  # the linear is an argument
    assert torch.allclose(packed, full, atol=1e-5)


def test_spd_block_is_the_papers_equation():
    """out = X + sum_r (Y_r + Z_r) + b_O + b_down with Z_r = MLP_r(X + Y_r + b_O), written out by hand."""
    x, o_bias, down_bias = _randn(2, 3, 8), _randn(8, seed=1), _randn(8, seed=2)
    ys = [_randn(2, 3, 8, seed=3 + r) for r in range(3)]
    mlps = [lambda h, r=r: torch.tanh(h * (r + 1)) for r in range(3)]
    out = spd_block(x, (spd_share(x, y, o_bias, mlp) for y, mlp in zip(ys, mlps)), (o_bias, down_bias))
    expected = x + sum(y + mlp(x + y + o_bias) for y, mlp in zip(ys, mlps)) + o_bias + down_bias
    assert torch.allclose(out, expected, atol=1e-6)
    no_bias = spd_block(x, (spd_share(x, y, None, mlp) for y, mlp in zip(ys, mlps)), (None, None))
    assert torch.allclose(no_bias, x + sum(y + mlp(x + y) for y, mlp in zip(ys, mlps)), atol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
def test_dense_model_equals_transformers_llama_bit_for_bit(dtype):
    """Through block.py the dense model still computes exactly what transformers' Llama computes."""
    model = tiny_model(layer_modes=["dense"] * 4).to(dtype)
    llama = LlamaForCausalLM(LlamaConfig(**TINY)).to(dtype).eval()
    llama.load_state_dict(model.state_dict(), strict=True)
    ids = token_ids(batch=2, seq=12)
    with torch.no_grad():
        assert torch.equal(model(ids, use_cache=False).logits, llama(ids, use_cache=False).logits)


@pytest.mark.parametrize("case", ["spd", "hybrid"])
def test_model_spd_block_equals_the_sum_of_rank_model_shares(case):
    """The HF model's SPD block on one device and three runtime ranks' ``RankModel.step_partial`` shares, summed."""
    from ladderize.runtime.allreduce import Communicator
    from ladderize.checkpoint.shapes import ModelShape
    from ladderize.runtime.engine import RankModel
    from ladderize.runtime.plan import StepKind
    from ladderize.runtime.tp_slicing import StateDictSource
    from ladderize.runtime.weights import load_rank_weights

    model = tiny_model(**case_overrides(3)[case])  # layer 2 is SPD with a reversed head order (and biases: hybrid)
    layer, tp = 2, 3
    dims, layout, state = ModelShape.from_config(model.config), model.config.layout, model.state_dict()
    x = _randn(2, 6, dims.hidden_size, seed=4)
    with torch.no_grad():
        spd_layer = model.model.layers[layer]
        assert spd_layer.mlp_op.reads_local_partial  # the layer under test is SPD
        expected = spd_layer(x, x, **model.model.layer_kwargs(x))[0]  # the SPD block on input x: forward from (x, x)
        shares, bias = [], None
        for rank in range(tp):
            weights = load_rank_weights(StateDictSource(state), dims, layout, tp, rank)
            rank_model = RankModel(weights, model.config, Communicator(1), linear="aten")
            cache = rank_model.new_cache(2, 8)
            share, bias = rank_model.step_partial(StepKind.SPD_BLOCK, rank_model.w.layers[layer], x,
                                           cache.keys[layer], cache.values[layer], 0)  # fmt: skip
            shares.append(share)
    summed = x + (sum(shares) if bias is None else sum(shares) + bias)
    assert (bias is not None) == (case == "hybrid")
    torch.testing.assert_close(summed, expected, atol=1e-5, rtol=1e-5)
