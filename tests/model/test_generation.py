"""KV-cache decoding and ``generate`` agree with full forwards in every layer mode."""

from __future__ import annotations

import pytest
import torch
from tests.conftest import tiny_model

from .helpers import ATOL, DENSE, HYBRID, LADDER, SPD_TP3, left_padded, logits, max_diff, positions_from_mask, token_ids

MODES = [DENSE, LADDER, SPD_TP3, HYBRID]
MODE_IDS = ["dense", "ladder", "spd-tp3", "hybrid"]


@torch.no_grad()
def decode_incrementally(model, ids: torch.Tensor, prefill: int, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Logits of a prefill of ``prefill`` tokens, then one token at a time through the KV cache."""
    pos = positions_from_mask(mask) if mask is not None else None

    def step(start: int, stop: int, cache):
        extra = {}
        if mask is not None:
            extra = dict(attention_mask=mask[:, :stop], position_ids=pos[:, start:stop])
        return model(ids[:, start:stop], past_key_values=cache, use_cache=True, **extra)

    out = step(0, prefill, None)
    chunks, cache = [out.logits], out.past_key_values
    assert cache is not None and cache.get_seq_length() == prefill
    for t in range(prefill, ids.shape[1]):
        out = step(t, t + 1, cache)
        chunks.append(out.logits)
        cache = out.past_key_values
    assert cache.get_seq_length() == ids.shape[1]
    return torch.cat(chunks, dim=1)


@pytest.mark.parametrize("overrides", MODES, ids=MODE_IDS)
def test_kv_cache_decoding_matches_full_forward(overrides):
    model = tiny_model(**overrides)
    ids = token_ids(batch=2, seq=10)
    full = logits(model, ids)
    assert max_diff(decode_incrementally(model, ids, prefill=4), full) <= ATOL


@pytest.mark.parametrize("overrides", MODES, ids=MODE_IDS)
def test_kv_cache_decoding_left_padded_batch(overrides):
    model = tiny_model(**overrides)
    ids, mask = left_padded(token_ids(batch=3, seq=11, seed=2), pads=[0, 2, 4])
    pos = positions_from_mask(mask)
    full = logits(model, ids, attention_mask=mask, position_ids=pos)
    cached = decode_incrementally(model, ids, prefill=5, mask=mask)
    real = mask.bool()
    assert max_diff(cached[real], full[real]) <= ATOL
    # A padded row must give the same logits as the same tokens without padding (row 2 vs its unpadded self).
    alone = logits(model, ids[2:, 4:])
    assert max_diff(full[2, 4:], alone[0]) <= ATOL


@torch.no_grad()
def greedy_without_cache(model, ids: torch.Tensor, mask: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Greedy decoding by repeated full forwards; finished rows continue with pad, as ``generate`` does."""
    eos, pad = model.generation_config.eos_token_id, model.generation_config.pad_token_id
    finished = torch.zeros(ids.shape[0], dtype=torch.bool)
    for _ in range(new_tokens):
        step_logits = logits(model, ids, attention_mask=mask, position_ids=positions_from_mask(mask))
        nxt = step_logits[:, -1].argmax(-1)
        nxt = torch.where(finished, torch.full_like(nxt, pad), nxt)
        finished |= nxt == eos
        ids = torch.cat([ids, nxt[:, None]], dim=1)
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        if finished.all():
            break
    return ids


@pytest.mark.parametrize("overrides", MODES, ids=MODE_IDS)
def test_generate_greedy_matches_full_forwards(overrides):
    model = tiny_model(**overrides)
    ids, mask = left_padded(token_ids(batch=3, seq=6, seed=3), pads=[0, 1, 3])
    new_tokens = 8
    with torch.no_grad():
        generated = model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False)
    expected = greedy_without_cache(model, ids, mask, new_tokens)
    assert generated.shape[1] > ids.shape[1]
    assert torch.equal(generated, expected[:, : generated.shape[1]])


@pytest.mark.parametrize("overrides", MODES, ids=MODE_IDS)
def test_generate_with_the_cache_equals_generate_without_it(overrides):
    """What a transformers release that renames the cache breaks first (5.24 passed it as ``cache``, the model read
    ``past_key_values`` and rebuilt an empty cache every step): a batch of 2, the second row left-padded."""
    model = tiny_model(**overrides)
    ids, mask = left_padded(token_ids(batch=2, seq=7, seed=5), pads=[0, 3])
    settings = dict(attention_mask=mask, max_new_tokens=10, do_sample=False, min_new_tokens=10)
    with torch.no_grad():
        cached = model.generate(ids, use_cache=True, **settings)
        uncached = model.generate(ids, use_cache=False, **settings)
    assert cached.shape == (2, ids.shape[1] + 10)
    assert torch.equal(cached, uncached)


def test_the_cache_is_taken_under_either_name_and_returned_under_transformers_own():
    from ladderize.model.modeling_ladder_llama import CACHE, CACHE_NAMES

    model = tiny_model(**HYBRID)
    ids = token_ids(batch=1, seq=6)
    full = logits(model, ids[:, :5])[:, -1]
    for name in CACHE_NAMES:  # a user's script on either side of the rename
        cache = getattr(model(ids[:, :4], use_cache=True), CACHE)
        assert cache is not None and cache.get_seq_length() == 4
        step = model(ids[:, 4:5], use_cache=True, **{name: cache})
        assert getattr(step, CACHE) is cache and cache.get_seq_length() == 5
        assert max_diff(step.logits[:, -1], full) <= ATOL
    with pytest.raises(ValueError, match="once"):
        model(ids[:, 4:5], use_cache=True, **{name: cache for name in CACHE_NAMES})
