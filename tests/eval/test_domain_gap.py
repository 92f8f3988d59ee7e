"""``benchmarks/adapt_domain_gap.py``'s last-word measure on tiny random models: against a plainly written reference,
and zero for a model against itself."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.conftest import TINY, tiny_model
from tests.script_modules import script_module

from .conftest import tiny_llama

last_word = script_module("benchmarks", "adapt_domain_gap").last_word


def _window(seq_len: int = 17) -> torch.Tensor:
    return torch.randint(0, TINY["vocab_size"], (1, seq_len), generator=torch.Generator().manual_seed(3))


def test_a_model_against_itself_has_no_gap():
    model = tiny_model(0)
    kl, gap = last_word(model, model, _window(), 3)
    assert abs(kl) < 1e-6 and gap == 0.0


@pytest.mark.parametrize("word_tokens", [1, 3])
def test_the_last_word_matches_the_reference(word_tokens: int):
    student = tiny_model(1, layer_modes=["dense", "dense", "ladder", "ladder"])
    teacher = tiny_llama(0)
    ids = _window()
    with torch.no_grad():
        s = student(ids).logits[0].float()
        t = teacher(ids).logits[0].float()
    kl = nll_gap = 0.0
    for position in range(ids.shape[1] - word_tokens, ids.shape[1]):  # each of the word's tokens, from the one before
        kl += F.kl_div(F.log_softmax(s[position - 1], -1), F.log_softmax(t[position - 1], -1), log_target=True,
                       reduction="sum").item()
        target = ids[0, position : position + 1]
        nll_gap += (F.cross_entropy(s[position - 1][None], target) - F.cross_entropy(t[position - 1][None], target)).item()
    got_kl, got_gap = last_word(student, teacher, ids, word_tokens)
    assert kl > 1e-3  # the two models differ, so the check can fail
    assert got_kl == pytest.approx(kl, rel=1e-5)
    assert got_gap == pytest.approx(nll_gap, rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("extra", [["x=/nonexistent/ckpt"], ["x=.", "--passages", "0"]])
def test_bad_input_is_one_line_before_any_model_loads(extra: list[str], tmp_path):
    import subprocess
    import sys

    from tests.script_modules import ROOT

    if extra[0] == "x=.":
        (tmp_path / "config.json").write_text("{}")
        extra = [f"x={tmp_path}", *extra[1:]]
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "adapt_domain_gap.py"), *extra, "--name", "refused"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and ("no config.json" in lines[0] or "at least 1" in lines[0]), done.stderr
    assert not (ROOT / "benchmarks" / "results" / "adapt_domain_gap" / "refused.json").exists()
