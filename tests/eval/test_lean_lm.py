"""LeanHFLM gives lm-eval's HFLM results without ever computing logits for a whole batch."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from lm_eval.api.instance import Instance
from lm_eval.models.huggingface import HFLM

from ladderize.checkpoint.io import load_model
from ladderize.eval.lean_lm import LeanHFLM
from tests.eval.conftest import PASSAGES, TEXT, char_tokenizer


def _requests(kind: str, args: list[tuple]) -> list[Instance]:
    return [Instance(request_type=kind, doc={}, arguments=a, idx=i) for i, a in enumerate(args)]


LOGLIKELIHOOD = [(p[: p.rindex(" ")], p[p.rindex(" "):]) for p in PASSAGES]
# one context with several one-token continuations: lm-eval's one-token cache hands them back for one row
LOGLIKELIHOOD += [("to be or not to be that is the q", c) for c in ("u", "x", "e")]
LOGLIKELIHOOD += [("the cat sat", " on the mat and looked"), ("the cat sat", " on the mat and looked")]
ROLLING = [(TEXT[:700],), (TEXT[300:420],), (PASSAGES[0],)]


@pytest.fixture(scope="module")
def models(tiny_ladder_dir: Path):
    model = load_model(tiny_ladder_dir).eval()
    tokenizer = char_tokenizer()
    return model, tokenizer


@pytest.mark.parametrize("batch_size", [1, 4])
def test_lean_equals_hflm_request_by_request(models, batch_size):
    model, tokenizer = models
    plain = HFLM(pretrained=model, tokenizer=tokenizer, backend="causal", batch_size=batch_size, max_length=64)
    seen = []
    lean = LeanHFLM(pretrained=model, tokenizer=tokenizer, backend="causal", batch_size=batch_size, max_length=64, chunk=5,
                    progress=lambda kind, done, total, tokens: seen.append((kind, done, total, tokens)))
    expected = plain.loglikelihood(_requests("loglikelihood", LOGLIKELIHOOD), disable_tqdm=True)
    got = lean.loglikelihood(_requests("loglikelihood", LOGLIKELIHOOD), disable_tqdm=True)
    assert [g[1] for g in got] == [e[1] for e in expected]
    assert [g[0] for g in got] == pytest.approx([e[0] for e in expected], rel=1e-6, abs=1e-6)
    assert seen[0][:3] == ("loglikelihood", 0, len(LOGLIKELIHOOD)) and seen[-1][1:3] == (len(LOGLIKELIHOOD), len(LOGLIKELIHOOD))
    seen.clear()
    expected = plain.loglikelihood_rolling(_requests("loglikelihood_rolling", ROLLING), disable_tqdm=True)
    got = lean.loglikelihood_rolling(_requests("loglikelihood_rolling", ROLLING), disable_tqdm=True)
    assert got == pytest.approx(expected, rel=1e-6)
    windows = seen[0][2]
    assert seen[0][0] == "loglikelihood_rolling" and windows > len(ROLLING)  # the 700-character text needs several windows
    assert seen[-1][1] == windows and seen[-1][3] > 700


def test_progress_moves_within_a_batch_a_decoder_layer_at_a_time(models):
    """A batch of rolling windows that takes minutes reports its progress from its first layer, not at its end."""
    model, tokenizer = models
    seen = []
    lean = LeanHFLM(pretrained=model, tokenizer=tokenizer, backend="causal", batch_size=4, max_length=64,
                    progress=lambda kind, done, total, tokens: seen.append((done, total, tokens)))
    lean.loglikelihood_rolling(_requests("loglikelihood_rolling", ROLLING), disable_tqdm=True)
    windows, layers = seen[0][1], model.config.num_hidden_layers
    first_batch = min(4, windows)
    # the start, then one update per layer of the first batch (a quarter of its windows each), before the batch ends
    assert seen[0] == (0, windows, 0)
    assert [done for done, _, _ in seen[1:layers]] == pytest.approx([first_batch * n / layers for n in range(1, layers)])
    assert 0 < seen[1][2] < seen[layers - 1][2]  # tokens through the model move with the layers
    dones = [done for done, _, _ in seen]
    assert dones == sorted(dones) and dones[-1] == windows and all(total == windows for _, total, _ in seen)
    assert len(seen) >= 1 + layers * -(-windows // 4)


def test_lean_never_computes_logits_for_a_batch(models):
    """The memory claim, structurally: the LM head sees at most ``chunk`` positions, and the full forward never runs."""
    model, tokenizer = models
    rows_per_call = []
    handle = model.lm_head.register_forward_hook(lambda _m, inputs, _out: rows_per_call.append(inputs[0].shape))
    full_forward = model.register_forward_hook(lambda *_: pytest.fail("the model's full forward (all logits) ran"))
    try:
        lean = LeanHFLM(pretrained=model, tokenizer=tokenizer, backend="causal", batch_size=4, max_length=64, chunk=8)
        lean.loglikelihood_rolling(_requests("loglikelihood_rolling", ROLLING), disable_tqdm=True)
    finally:
        handle.remove()
        full_forward.remove()
    assert rows_per_call and all(len(shape) == 2 and shape[0] <= 8 for shape in rows_per_call)


def test_lean_batch_size_auto_sizes_as_hflm_and_scores_lean(models):
    """``auto``: lm-eval's largest-batch search picks the size (its ``_batch_scheduler``), then the batches are scored
    lean; results equal HFLM's with the same ``auto``."""
    model, tokenizer = models
    plain = HFLM(pretrained=model, tokenizer=tokenizer, backend="causal", batch_size="auto", max_batch_size=4, max_length=64)
    lean = LeanHFLM(pretrained=model, tokenizer=tokenizer, backend="causal", batch_size="auto", max_batch_size=4, max_length=64)
    assert lean._lean()
    detected = []
    original = lean._detect_batch_size
    lean._detect_batch_size = lambda *a, **k: detected.append(original(*a, **k)) or detected[-1]
    expected = plain.loglikelihood(_requests("loglikelihood", LOGLIKELIHOOD), disable_tqdm=True)
    got = lean.loglikelihood(_requests("loglikelihood", LOGLIKELIHOOD), disable_tqdm=True)
    assert detected == [4]  # searched once for this request list, from max_batch_size down
    assert [g[1] for g in got] == [e[1] for e in expected]
    assert [g[0] for g in got] == pytest.approx([e[0] for e in expected], rel=1e-6, abs=1e-6)
    expected = plain.loglikelihood_rolling(_requests("loglikelihood_rolling", ROLLING), disable_tqdm=True)
    assert lean.loglikelihood_rolling(_requests("loglikelihood_rolling", ROLLING), disable_tqdm=True) == pytest.approx(expected, rel=1e-6)
    assert torch.is_grad_enabled()


def test_scores_live_on_the_model_device(models, monkeypatch):
    """Every tensor the lean scoring allocates is on the model's device (here the CPU, checked through torch.empty's
    device argument: on CUDA a CPU buffer compared with the model's tensors would fail)."""
    model, tokenizer = models
    lean = LeanHFLM(pretrained=model, tokenizer=tokenizer, backend="causal", batch_size=4, max_length=64)
    devices = []
    real_empty = torch.empty

    def empty(*args, **kwargs):
        devices.append(kwargs.get("device"))
        return real_empty(*args, **kwargs)

    monkeypatch.setattr(torch, "empty", empty)
    lean.loglikelihood(_requests("loglikelihood", LOGLIKELIHOOD), disable_tqdm=True)
    assert devices and all(d is not None and torch.device(d) == lean.device for d in devices), devices
