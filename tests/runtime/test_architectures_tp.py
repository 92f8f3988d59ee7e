"""Every architecture ``convert`` accepts runs in the TP runtime, and KV heads replicate when TP exceeds them.

- Qwen2 (q/k/v biases) and Mistral (full attention), as their own transformers checkpoints and
  converted to a ladder hybrid, generate at TP=2 with logits equal to a single device (<= 1e-4).
- A model with 2 KV heads runs at TP=4: each KV head lives on two ranks, which split its query
  heads, and the logits equal the single-device model's.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

from ladderize.checkpoint.io import load_model
from ladderize.convert.conversion import convert_checkpoint
from ladderize.errors import LadderizeError
from ladderize.runtime.generate import Request, RuntimeOptions, run_requests
from ladderize.runtime.launch import LaunchSpec
from tests.convert.test_architectures import save_family_member
from tests.run_once import once_per_run
from tests.runtime.runtime_helpers import hf_greedy, save_tiny

SHAPE = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=128)  # fmt: skip  (3 layers: a dense one, then ladder 1:3)
PIECES = (5, 3, 1, 1)
ATOL = 1e-4


def _rows(ids: torch.Tensor) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(row) for row in ids.tolist())


@pytest.fixture(scope="module")
def families(tmp_path_factory):
    """Qwen2 and Mistral sources, raw and converted (ladder 1:3), served at TP=2 in one launch (once per run)."""
    return once_per_run(tmp_path_factory, "architectures-families", lambda: _families(tmp_path_factory))


def _families(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    ids = torch.randint(0, 96, (2, sum(PIECES)), generator=torch.Generator().manual_seed(0))
    cases, requests = {}, []
    for name, cls, config in (
        ("qwen2", Qwen2ForCausalLM, Qwen2Config(**SHAPE)),
        ("mistral", MistralForCausalLM, MistralConfig(**SHAPE, sliding_window=None)),
    ):
        source = save_family_member(cls, config, root / name)
        converted = convert_checkpoint(str(root / name), root / f"{name}-ladder", ladder="1:3")
        with torch.no_grad():
            cases[name] = source(ids).logits.numpy()
            cases[f"{name}-ladder"] = load_model(converted)(ids).logits.numpy()
        requests += [Request(str(root / name), _rows(ids), score_pieces=PIECES),
                     Request(str(converted), _rows(ids), score_pieces=PIECES)]  # fmt: skip
    responses = run_requests(requests, LaunchSpec(tp=2, oversubscribe=True), RuntimeOptions())
    return cases, dict(zip(cases, responses))


@pytest.mark.parametrize("case", ["qwen2", "qwen2-ladder", "mistral", "mistral-ladder"])
def test_family_checkpoints_run_at_tp2_like_one_device(families, case):
    expected, responses = families
    assert np.abs(responses[case].logits - expected[case]).max() <= ATOL


def test_ladder_differs_from_its_dense_source(families):
    expected, _ = families
    assert np.abs(expected["qwen2"] - expected["qwen2-ladder"]).max() > 1e-3  # the conversion was really applied


@pytest.fixture(scope="module")
def replicated(tmp_path_factory):
    """2 KV heads (8 query heads) at TP=4: dense and ladder, scored and greedily generated (once per run)."""
    return once_per_run(tmp_path_factory, "architectures-kv-replicated", lambda: _replicated(tmp_path_factory))


def _replicated(tmp_path_factory):
    root = tmp_path_factory.mktemp("kvrep")
    shape = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=8,
                 num_key_value_heads=2, head_dim=8)  # fmt: skip
    ids = torch.randint(3, 128, (2, sum(PIECES)), generator=torch.Generator().manual_seed(1))
    prompt = ids[:1, :6]
    expected, requests = {}, []
    for index, modes in enumerate((["dense"] * 4, ["dense", "ladder", "ladder", "ladder"])):
        path = root / f"case{index}"
        model = save_tiny(path, seed=index, **shape, layer_modes=modes)
        with torch.no_grad():
            expected[index] = (model(ids).logits.numpy(), hf_greedy(model, prompt, 6))
        requests += [Request(str(path), _rows(ids), score_pieces=PIECES), Request(str(path), _rows(prompt), max_new_tokens=6)]
    responses = run_requests(requests, LaunchSpec(tp=4, oversubscribe=True), RuntimeOptions())
    return expected, responses


@pytest.mark.parametrize("case", [0, 1], ids=["dense", "ladder"])
def test_kv_heads_replicate_when_tp_exceeds_them(replicated, case):
    expected, responses = replicated
    assert np.abs(responses[2 * case].logits - expected[case][0]).max() <= ATOL
    assert responses[2 * case + 1].tokens == expected[case][1]


def test_kv_replication_rank_heads():
    from ladderize.model.layout import kv_heads_per_rank, rank_kv_heads, rank_query_heads

    # 8 query heads, 2 KV heads, TP 4: ranks 0-1 hold KV head 0 and split its queries 0-3; ranks 2-3 head 1.
    assert [rank_kv_heads([0, 1], 4, r) for r in range(4)] == [[0], [0], [1], [1]]
    assert [rank_query_heads(rank_kv_heads([0, 1], 4, r), 8, 2, 4, r) for r in range(4)] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert kv_heads_per_rank(4, 2) == 1 and kv_heads_per_rank(2, 4) == 2


def test_tp_that_neither_divides_nor_multiplies_the_kv_heads_is_one_line():
    from ladderize.model.layout import Layout, LayoutError
    from ladderize.checkpoint.shapes import ModelShape
    from ladderize.runtime.tp_check import validate_tp

    dims = ModelShape("tiny", hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=24,
                      num_key_value_heads=4, head_dim=8, vocab_size=128, rms_norm_eps=1e-6)
    validate_tp(dims, Layout.dense(2), 8)  # 8 = 2 x 4 KV heads: replicated
    with pytest.raises((LadderizeError, LayoutError), match="does not divide the model's 4 key/value heads"):
        validate_tp(dims, Layout.dense(2), 6)  # 6 neither divides 4 nor is a multiple of it
    with pytest.raises((LadderizeError, LayoutError), match="key/value heads"):  # SPD head groups cannot replicate
        validate_tp(dims, Layout.from_ranges(2, spd="all", spd_tp_size=8), 8)
