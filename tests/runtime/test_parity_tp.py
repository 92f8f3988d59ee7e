"""TP=2 and TP=3 on CPU reproduce the single-device model (logits <= 1e-4) and transformers' greedy tokens.

Every check runs over both all-reduce paths of one host: shared memory (``--comm shm``) and
gloo (``--comm gloo``). Each (TP degree, path) starts its ranks once (module-scoped fixture)
and serves every request; the tests then check the responses.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ladderize.runtime.decode import Sampling
from ladderize.runtime.generate import Request, RuntimeOptions, run_requests
from ladderize.runtime.launch import LaunchSpec
from tests.run_once import once_per_run
from tests.runtime.runtime_helpers import TINY_TP23, case_overrides, hf_greedy, save_tiny, shape_for

CASES = ["dense", "ladder", "spd", "hybrid", "hybrid2"]
PIECES = (5, 3, 1, 1, 1, 1)  # prefill 5, a cached chunk of 3, then single-token decode steps
NEW_TOKENS = 8
ATOL = 1e-4
SAMPLING = Sampling(temperature=0.9, top_k=40, top_p=0.95, seed=11)


def _rows(ids: torch.Tensor) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(row) for row in ids.tolist())


def _serve(tp: int, tmp_path_factory, static_decode: bool, comm: str) -> dict:
    root = tmp_path_factory.mktemp(f"tp{tp}{comm}")
    shape = shape_for(tp)
    ids = torch.randint(3, shape["vocab_size"], (2, sum(PIECES)), generator=torch.Generator().manual_seed(tp))
    prompt = ids[:1, :6]
    requests, expected = [], {}
    for index, (case, overrides) in enumerate(case_overrides(tp).items()):
        path = root / case
        model = save_tiny(path, seed=index, **shape, **overrides)
        with torch.no_grad():
            expected[case] = (model(ids).logits.numpy(), hf_greedy(model, prompt, NEW_TOKENS))
        requests.append(Request(str(path), _rows(ids), score_pieces=PIECES))
        requests.append(Request(str(path), _rows(prompt), max_new_tokens=NEW_TOKENS))
    # comparison schedules on the dense checkpoint: domino is dense math; upper-bound skips communication
    requests.append(Request(str(root / "dense"), _rows(ids), score_pieces=PIECES, schedule="domino"))
    requests.append(Request(str(root / "dense"), _rows(ids), score_pieces=PIECES, schedule="upper-bound"))
    # a checkpoint converted for SPD at TP=3 run at TP=2 with the override: SPD semantics at TP=2
    if tp == 2:
        mismatch = dict(TINY_TP23, layer_modes=["dense", "spd", "ladder", "spd"], spd_tp_size=3)
        model = save_tiny(root / "mismatch", seed=7, **mismatch)
        twin = save_tiny(root / "twin", seed=7, **{**mismatch, "spd_tp_size": 2})
        assert torch.equal(model.lm_head.weight, twin.lm_head.weight)
        with torch.no_grad():
            expected["mismatch"] = (twin(ids).logits.numpy(), None)
        requests.append(Request(str(root / "mismatch"), _rows(ids), score_pieces=PIECES))
    # sampling: every rank draws from identical logits with the same seed (no SPD: TP=1 is the same model)
    requests.append(Request(str(root / "ladder"), _rows(prompt), max_new_tokens=NEW_TOKENS, sampling=SAMPLING))
    options = RuntimeOptions(allow_spd_mismatch=True, static_decode=static_decode)
    responses = run_requests(requests, LaunchSpec(tp=tp, oversubscribe=True, comm=comm), options)
    # the same sampled request on one rank, in this process
    single = run_requests([requests[-1]], LaunchSpec(tp=1), RuntimeOptions(static_decode=static_decode))
    return {"expected": expected, "responses": responses, "tp": tp, "comm": comm, "sampled_single_rank": single[0].tokens}


_SERVED: dict[tuple[int, str], dict] = {}


def _served(tp: int, comm: str, tmp_path_factory) -> dict:
    """Each (TP, comm) is served once per test run, whichever fixture and worker asks first."""
    if (tp, comm) not in _SERVED:  # TP=3 also covers the shape-static decode path
        _SERVED[tp, comm] = once_per_run(tmp_path_factory, f"parity-tp{tp}-{comm}",
                                         lambda: _serve(tp, tmp_path_factory, static_decode=tp == 3, comm=comm))
    return _SERVED[tp, comm]


@pytest.fixture(params=["shm", "gloo"])
def tp2(request, tmp_path_factory):
    return _served(2, request.param, tmp_path_factory)


@pytest.fixture(params=[(2, "shm"), (3, "shm"), (2, "gloo"), (3, "gloo")], ids=lambda p: f"tp{p[0]}-{p[1]}")
def served(request, tmp_path_factory):
    return _served(*request.param, tmp_path_factory)


@pytest.mark.parametrize("case", CASES)
def test_logits_match_single_device(served, case):
    index = CASES.index(case)
    logits = served["responses"][2 * index].logits
    reference = served["expected"][case][0]
    assert logits.shape == reference.shape
    assert np.abs(logits - reference).max() <= ATOL, f"{case} at TP={served['tp']} over {served['comm']}"


@pytest.mark.parametrize("case", CASES)
def test_greedy_tokens_match_transformers_generate(served, case):
    index = CASES.index(case)
    assert served["responses"][2 * index + 1].tokens == served["expected"][case][1]


def test_comparison_schedules(served):
    domino, upper = served["responses"][2 * len(CASES)], served["responses"][2 * len(CASES) + 1]
    reference = served["expected"]["dense"][0]
    assert np.abs(domino.logits - reference).max() <= ATOL  # domino is dense math, split in 2 chunks
    assert domino.allreduces_per_forward == 2 * 8  # 4 layers x 2 modules x 2 chunks
    assert upper.allreduces_per_forward == 0
    assert np.abs(upper.logits - reference).max() > 1e-2  # no communication: wrong on purpose


def test_plans_count_allreduces(served):
    counts = [served["responses"][2 * i].allreduces_per_forward for i in range(len(CASES))]
    assert counts == [8, 8, 4, 7, 7]  # dense 2/layer, ladder 2/layer, spd 1/layer


def test_sampling_is_seeded_and_rank_consistent(served):
    tokens = served["responses"][-1].tokens
    assert len(tokens[0]) == NEW_TOKENS or 2 in tokens[0]  # stops only at EOS
    assert tokens == served["sampled_single_rank"]


def test_spd_mismatch_override_runs_spd_at_the_new_degree(tp2):
    logits = tp2["responses"][-2].logits
    assert np.abs(logits - tp2["expected"]["mismatch"][0]).max() <= ATOL
