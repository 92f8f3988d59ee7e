"""Tiny checkpoints for the runtime tests: every mode, a head order, biases, and a char tokenizer."""

from __future__ import annotations

from pathlib import Path

import torch

from tests.conftest import TINY, TINY_TP2, tiny_model

# TP 2 and TP 3 both divide these heads (12 query, 6 KV) and the MLP width: for SPD-mismatch runs.
TINY_TP23 = dict(TINY, num_attention_heads=12, num_key_value_heads=6, hidden_size=48, head_dim=4, intermediate_size=96)


def shape_for(tp: int) -> dict:
    return TINY_TP2 if tp % 2 == 0 else TINY


def case_overrides(tp: int) -> dict[str, dict]:
    """Model variants per test case (all 4 layers); SPD variants are converted for ``tp``."""
    kv = shape_for(tp)["num_key_value_heads"]
    reversed_heads = list(reversed(range(kv)))
    return {
        "dense": dict(layer_modes=["dense"] * 4),
        "ladder": dict(layer_modes=["ladder"] * 4),
        "spd": dict(layer_modes=["spd"] * 4, spd_tp_size=tp, spd_head_order=[None, reversed_heads, None, reversed_heads]),
        # dense -> ladder, ladder -> spd, spd -> ladder transitions, with every bias present
        "hybrid": dict(
            layer_modes=["dense", "ladder", "spd", "ladder"],
            spd_tp_size=tp,
            spd_head_order=[None, None, reversed_heads, None],
            attention_bias=True,
            mlp_bias=True,
        ),
        # ladder first, ladder -> dense, spd last
        "hybrid2": dict(layer_modes=["ladder", "ladder", "dense", "spd"], spd_tp_size=tp),
    }


def save_tiny(path: Path, seed: int = 0, **overrides):
    """Save a tiny random LadderLlama checkpoint; return the in-memory model."""
    model = tiny_model(seed=seed, **overrides)
    model.save_pretrained(path)
    return model


def save_char_tokenizer(path: Path) -> None:
    """Save the shared character-level tokenizer (fits TINY's vocabulary) beside a checkpoint."""
    from tests.conftest import char_tokenizer

    char_tokenizer().save_pretrained(path)


def hf_greedy(model, input_ids: torch.Tensor, max_new_tokens: int) -> list[list[int]]:
    """New tokens from transformers' own ``generate`` (greedy)."""
    with torch.no_grad():
        out = model.generate(input_ids, max_new_tokens=max_new_tokens, do_sample=False)
    return out[:, input_ids.shape[1] :].tolist()
