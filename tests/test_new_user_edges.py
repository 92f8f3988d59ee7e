"""The smaller edges a new user met: a finished count's line printed once, lm-eval's own prints kept off stdout while
its loggers are quiet, and the unsupported-model refusal naming each architecture once."""

from __future__ import annotations

import logging

import pytest

from ladderize.errors import LadderizeError
from ladderize.progress import ProgressLine


def test_a_finished_count_prints_its_done_line_once():
    now = [0.0]
    line = ProgressLine("eval loglikelihood requests", 10, interval=15, clock=lambda: now[0])
    now[0] = 13.0
    assert line.update(10, tokens=845).endswith("done")
    assert line.update(10, tokens=845) is None  # lm-eval reports the end again: no second line at 0 tok/s
    line.update(3, tokens=100)  # a new count (the next task's requests)
    assert line.update(10, tokens=500).endswith("done")


def test_lm_evals_prints_are_kept_off_stdout_while_its_loggers_are_quiet(capsys, monkeypatch):
    from ladderize.eval.harness import quiet_prints

    logger = logging.getLogger("lm_eval")
    monkeypatch.setattr(logger, "level", logging.ERROR)
    with quiet_prints():
        print("bootstrapping for stddev: perplexity")
    assert capsys.readouterr().out == ""
    monkeypatch.setattr(logger, "level", logging.INFO)  # --verbose
    with quiet_prints():
        print("bootstrapping for stddev: perplexity")
    assert "bootstrapping" in capsys.readouterr().out


def test_the_unsupported_architecture_refusal_names_each_architecture_once():
    from ladderize.checkpoint.architectures import architecture_for

    with pytest.raises(LadderizeError) as refused:
        architecture_for({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]})
    line = str(refused.value)
    assert "LlamaForCausalLM (llama)" in line and "(llamaLadder)" not in line and "Ladder authors'" in line
