"""Half-precision forwards, gradient flow through ladder/SPD, and gradient checkpointing."""

from __future__ import annotations

import warnings

import pytest
import torch
from tests.conftest import tiny_model

from .helpers import DENSE, HYBRID, LADDER, SPD_TP3, logits, max_diff, token_ids

# A ladder/SPD hybrid with every mode and both transition orders (spd -> ladder, ladder -> spd).
TRAIN_LAYOUT = dict(layer_modes=["ladder", "spd", "ladder", "spd"], spd_tp_size=3)


@pytest.mark.parametrize("overrides", [DENSE, LADDER, SPD_TP3, HYBRID], ids=["dense", "ladder", "spd-tp3", "hybrid"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_forward_in_dtype_is_finite_and_close_to_fp32(overrides, dtype):
    ids = token_ids(batch=2, seq=10)
    reference = logits(tiny_model(**overrides), ids)
    model = tiny_model(**overrides).to(dtype)
    out = logits(model, ids)
    assert out.dtype == dtype
    assert torch.isfinite(out).all()
    # Sanity bound, not parity: a 4-layer forward accumulates a few roundings of the dtype's
    # machine epsilon (bf16: 2^-7, fp16: 2^-10) relative to the logit scale. Measured errors are
    # about 0.75 eps (bf16) and 0.6 eps (fp16); allow 4 eps. fp32 vs itself must be exact.
    tolerance = 4 * torch.finfo(dtype).eps * max(1.0, reference.abs().max().item()) if dtype != torch.float32 else 0.0
    assert max_diff(out, reference) <= tolerance


def _grads(model, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    loss = model(ids, labels=ids, use_cache=False).loss
    assert torch.isfinite(loss)
    loss.backward()
    return {name: p.grad.detach().clone() if p.grad is not None else None for name, p in model.named_parameters()}


def test_gradients_reach_every_parameter_of_a_hybrid():
    model = tiny_model(**TRAIN_LAYOUT).train()
    grads = _grads(model, token_ids(batch=2, seq=12))
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    assert len(trainable) == 3 + 9 * model.config.num_hidden_layers  # embed, final norm, untied lm_head; 9 per layer
    for name in trainable:
        grad = grads[name]
        assert grad is not None, f"{name} got no gradient"
        assert torch.isfinite(grad).all(), f"{name} has a non-finite gradient"
        assert grad.abs().sum() > 0, f"{name} has an all-zero gradient"


def test_gradient_checkpointing_gives_the_same_gradients():
    ids = token_ids(batch=2, seq=12)
    plain = tiny_model(**TRAIN_LAYOUT).train()
    expected = _grads(plain, ids)

    model = tiny_model(**TRAIN_LAYOUT)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # the method is being renamed in transformers v6
        model.gradient_checkpointing_enable()
    model.train()
    assert all(layer.gradient_checkpointing for layer in model.model.layers)

    calls = []
    hook = model.model.layers[1].self_attn.q_proj.register_forward_hook(lambda *_: calls.append(1))
    actual = _grads(model, ids)
    hook.remove()
    assert len(calls) == 2, "checkpointing should recompute the layer in backward"

    assert expected.keys() == actual.keys()
    for name, grad in expected.items():
        assert max_diff(actual[name], grad) <= 1e-6, name
