"""``benchmarks/teacher_agreement.py`` on tiny random models: against a plainly written reference, itself, its buckets,
bad input."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from ladderize.errors import LadderizeError
from ladderize.eval.perplexity import perplexity
from tests.conftest import TINY, tiny_model
from tests.script_modules import script_module

from .conftest import tiny_llama

agreement = script_module("benchmarks", "teacher_agreement")
position_buckets, teacher_agreement = agreement.position_buckets, agreement.teacher_agreement

SEQ_LEN = 33  # 32 predicted positions: 8 buckets of 4, or uneven ones for 5 buckets


def _windows(n: int = 5, seq_len: int = SEQ_LEN, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, TINY["vocab_size"], (n, seq_len), generator=generator)


def _reference(student, teacher, ids: torch.Tensor) -> dict:
    """One window at a time, with torch's own kl_div and cross_entropy."""
    kl, top1, nll_s, nll_t, count = 0.0, 0.0, 0.0, 0.0, 0
    with torch.no_grad():
        for window in ids:
            s = student(window[None]).logits[0, :-1].float()
            t = teacher(window[None]).logits[0, :-1].float()
            target = window[1:]
            kl += F.kl_div(F.log_softmax(s, -1), F.log_softmax(t, -1), log_target=True, reduction="sum").item()
            top1 += (s.argmax(-1) == t.argmax(-1)).sum().item()
            nll_s += F.cross_entropy(s, target, reduction="sum").item()
            nll_t += F.cross_entropy(t, target, reduction="sum").item()
            count += target.numel()
    return {"kl": kl / count, "top1": top1 / count, "nll_student": nll_s / count, "nll_teacher": nll_t / count, "tokens": count}


def test_a_model_agrees_with_itself():
    model = tiny_model(0)
    result = teacher_agreement(model, model, _windows(), batch_size=2)
    assert abs(result["kl"]) < 1e-6
    assert result["top1"] == 1.0
    assert result["nll_student"] == result["nll_teacher"]
    assert all(b["gap"] == 0.0 and abs(b["kl"]) < 1e-6 for b in result["position_gap"])


@pytest.mark.parametrize("batch_size", [1, 2, 4])
def test_two_models_match_the_reference(batch_size: int):
    student = tiny_model(1, layer_modes=["dense", "dense", "ladder", "ladder"])
    teacher = tiny_llama(0)  # a plain transformers Llama works as the teacher
    ids = _windows()
    result = teacher_agreement(student, teacher, ids, batch_size=batch_size)
    expected = _reference(student, teacher, ids)
    assert result["tokens"] == expected["tokens"] == 5 * (SEQ_LEN - 1)
    for key in ("kl", "top1", "nll_student", "nll_teacher"):
        assert result[key] == pytest.approx(expected[key], abs=1e-5), key
    assert result["kl"] > 1e-3 and result["top1"] < 1.0
    assert not student.training and not teacher.training


def test_nlls_are_the_log_of_perplexity_on_the_same_windows():
    student, teacher = tiny_model(1), tiny_model(2)
    ids = _windows()
    result = teacher_agreement(student, teacher, ids)
    assert result["nll_student"] == pytest.approx(math.log(perplexity(student, ids, seq_len=SEQ_LEN)), abs=1e-5)
    assert result["nll_teacher"] == pytest.approx(math.log(perplexity(teacher, ids, seq_len=SEQ_LEN)), abs=1e-5)


@pytest.mark.parametrize("buckets", [1, 5, 8, 32])
def test_buckets_cover_the_positions_and_average_to_the_whole(buckets: int):
    student, teacher = tiny_model(1), tiny_model(2)
    result = teacher_agreement(student, teacher, _windows(), buckets=buckets)
    gap = result["position_gap"]
    assert len(gap) == buckets
    assert gap[0]["start"] == 0 and gap[-1]["end"] == SEQ_LEN - 1
    assert all(a["end"] == b["start"] for a, b in zip(gap, gap[1:]))
    assert all(b["end"] - b["start"] in (32 // buckets, -(-32 // buckets)) for b in gap)
    assert sum(b["tokens"] for b in gap) == result["tokens"]
    for key in ("nll_student", "nll_teacher", "kl"):
        weighted = sum(b[key] * b["tokens"] for b in gap) / result["tokens"]
        assert weighted == pytest.approx(result[key], abs=1e-9), key
    assert all(b["gap"] == pytest.approx(b["nll_student"] - b["nll_teacher"]) for b in gap)


def test_position_buckets_are_half_open_and_contiguous():
    assert position_buckets(10, 3) == [(0, 3), (3, 6), (6, 10)]
    assert position_buckets(4, 4) == [(0, 1), (1, 2), (2, 3), (3, 4)]


@pytest.mark.parametrize(("ids", "kwargs", "message"), [
    (_windows(), {"buckets": 0}, "buckets must be at least 1, got 0"),
    (_windows(), {"buckets": 33}, "33 position buckets for 32 predicted positions"),
    (_windows()[0], {}, r"ids must be a 2-D tensor \[windows, seq_len\] of token ids, got \(33,\)"),
    (_windows()[None], {}, r"ids must be a 2-D tensor .* got \(1, 5, 33\)"),
    (_windows(seq_len=1), {}, "at least one window of 2 or more tokens"),
    (_windows(), {"batch_size": 0}, "batch_size must be at least 1"),
])
def test_bad_arguments_are_one_line(ids, kwargs, message):
    model = tiny_model(0)
    with pytest.raises(LadderizeError, match=message) as caught:
        teacher_agreement(model, model, ids, **kwargs)
    assert "\n" not in str(caught.value)
