"""Function parity: dense vs transformers' Llama, and every layout vs the independent reference."""

from __future__ import annotations

import pytest
import torch
from tests.conftest import TINY, TINY_TP2, tiny_model
from transformers import LlamaConfig, LlamaForCausalLM

from .helpers import (
    ATOL,
    DENSE,
    HYBRID,
    LADDER,
    LADDER_LOWER,
    LADDER_UPPER,
    SPD_TP3,
    left_padded,
    logits,
    max_diff,
    positions_from_mask,
    token_ids,
)
from .reference import reference_logits

# (id, tiny_model overrides). Every layout here is checked against the reference.
LAYOUTS = [
    ("dense", DENSE),
    ("ladder-all", LADDER),
    ("ladder-upper", LADDER_UPPER),
    ("ladder-lower", LADDER_LOWER),
    ("spd-tp2", dict(TINY_TP2, layer_modes=["spd"] * 4, spd_tp_size=2)),
    ("spd-tp3", SPD_TP3),
    ("spd-then-ladder", dict(layer_modes=["dense", "spd", "ladder", "ladder"], spd_tp_size=3)),
    ("ladder-then-spd", dict(layer_modes=["ladder", "ladder", "spd", "dense"], spd_tp_size=3)),
    ("ladder-spd-alternating", dict(layer_modes=["spd", "ladder", "spd", "ladder"], spd_tp_size=3)),
    ("hybrid", HYBRID),
    ("hybrid-rope-theta", dict(HYBRID, rope_parameters={"rope_type": "default", "rope_theta": 500000.0})),
    (
        "spd-head-order",
        dict(layer_modes=["spd", "dense", "spd", "spd"], spd_tp_size=3, spd_head_order=[[2, 0, 1], None, [1, 2, 0], None]),
    ),
    (
        "spd-tp2-head-order",
        dict(TINY_TP2, layer_modes=["dense", "spd", "spd", "ladder"], spd_tp_size=2,
             spd_head_order=[None, [3, 1, 0, 2], [1, 0, 3, 2], None]),
    ),
]


@pytest.mark.parametrize("overrides", [o for _, o in LAYOUTS], ids=[name for name, _ in LAYOUTS])
def test_model_matches_reference(overrides):
    model = tiny_model(**overrides)
    ids = token_ids(batch=2, seq=9)
    assert max_diff(logits(model, ids), reference_logits(model, ids)) <= ATOL


def test_reference_matches_with_left_padding():
    """Padding masks keys only; compare the real (non-pad) positions."""
    model = tiny_model(**HYBRID)
    ids, mask = left_padded(token_ids(batch=3, seq=8), pads=[0, 3, 5])
    pos = positions_from_mask(mask)
    ours = logits(model, ids, attention_mask=mask, position_ids=pos)
    ref = reference_logits(model, ids, attention_mask=mask, position_ids=pos)
    real = mask.bool()
    assert max_diff(ours[real], ref[real]) <= ATOL


def _randomize_biases(model):
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(".bias"):
                param.normal_(0.0, 0.1)
    return model


def _hf_llama(model, **overrides) -> LlamaForCausalLM:
    llama = LlamaForCausalLM(LlamaConfig(**TINY, **overrides)).eval()
    missing, unexpected = llama.load_state_dict(model.state_dict(), strict=True)
    assert not missing and not unexpected
    return llama


BIASES = dict(attention_bias=True, mlp_bias=True)


@pytest.mark.parametrize("bias", [{}, BIASES], ids=["no-bias", "bias"])
def test_dense_matches_transformers_llama(bias):
    model = _randomize_biases(tiny_model(**DENSE, **bias))
    llama = _hf_llama(model, **bias)
    ids = token_ids(batch=2, seq=12)
    ours = logits(model, ids)
    assert max_diff(ours, logits(llama, ids)) <= ATOL
    if not bias:  # the reference has no biases; without them it agrees with HF too
        assert max_diff(ours, reference_logits(model, ids)) <= ATOL


def test_dense_matches_transformers_llama_with_padded_mask():
    model = tiny_model(**DENSE)
    llama = _hf_llama(model)
    ids, mask = left_padded(token_ids(batch=3, seq=10), pads=[0, 2, 6])
    ours = logits(model, ids, attention_mask=mask)
    theirs = logits(llama, ids, attention_mask=mask)
    real = mask.bool()
    assert max_diff(ours[real], theirs[real]) <= ATOL
    # The mask must matter: the padded rows differ from an unmasked forward.
    unmasked = logits(model, ids)
    assert max_diff(ours[1:][real[1:]], unmasked[1:][real[1:]]) > 1e-3


@pytest.mark.parametrize(
    "overrides",
    [LADDER, LADDER_UPPER, LADDER_LOWER, SPD_TP3, HYBRID, dict(layer_modes=["dense", "dense", "dense", "spd"], spd_tp_size=3)],
    ids=["ladder", "ladder-upper", "ladder-lower", "spd-tp3", "hybrid", "spd-last"],
)
def test_converted_layouts_change_logits(overrides):
    """Same weights, different layout: if a mode were ignored the logits would equal dense."""
    ids = token_ids()
    dense = logits(tiny_model(**DENSE), ids)
    assert max_diff(logits(tiny_model(**overrides), ids), dense) > 1e-3


def test_spd_head_order_changes_logits():
    ids = token_ids()
    natural = logits(tiny_model(**SPD_TP3), ids)
    regrouped = logits(tiny_model(**SPD_TP3, spd_head_order=[[2, 0, 1]] * 4), ids)
    assert max_diff(natural, regrouped) > 1e-3
    # At TP 1 a single rank owns every head, so the head order cannot matter.
    tp1 = dict(layer_modes=["spd"] * 4, spd_tp_size=1)
    assert max_diff(logits(tiny_model(**tp1), ids), logits(tiny_model(**tp1, spd_head_order=[[2, 0, 1]] * 4), ids)) <= 1e-5


def test_spd_depends_on_tp_degree():
    ids = token_ids()
    tp1 = logits(tiny_model(layer_modes=["spd"] * 4, spd_tp_size=1), ids)
    tp3 = logits(tiny_model(**SPD_TP3), ids)
    assert max_diff(tp1, tp3) > 1e-3


@pytest.mark.parametrize(
    "shape",
    [{}, TINY_TP2, BIASES, dict(attention_bias=True, attention_out_bias=False)],
    ids=["tiny", "tiny-tp2", "biases", "qkv-bias-only"],
)
def test_spd_at_tp1_equals_dense(shape):
    ids = token_ids()
    dense_model = _randomize_biases(tiny_model(**shape, **DENSE))
    spd_model = tiny_model(**shape, layer_modes=["spd"] * 4, spd_tp_size=1)
    spd_model.load_state_dict(dense_model.state_dict())
    assert max_diff(logits(spd_model, ids), logits(dense_model, ids)) <= 1e-5


def test_reference_is_sensitive_to_layout():
    """Guard against a reference that ignores the layout (it would make the parity tests vacuous)."""
    model = tiny_model(**HYBRID)
    ids = token_ids()
    as_dense = reference_logits(model, ids, config=tiny_model(**DENSE).config)
    assert max_diff(as_dense, reference_logits(model, ids)) > 1e-3


def test_hidden_states_and_logits_to_keep():
    model = tiny_model(**HYBRID)
    ids = token_ids(seq=7)
    with torch.no_grad():
        full = model(ids, output_hidden_states=True)
        last = model(ids, logits_to_keep=1).logits
    assert len(full.hidden_states) == model.config.num_hidden_layers + 1
    assert last.shape == (2, 1, model.config.vocab_size)
    assert max_diff(last, full.logits[:, -1:]) <= 1e-6
