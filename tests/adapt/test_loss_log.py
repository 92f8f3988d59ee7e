"""The joint training (replicated and sharded) reads their losses on the host only when they log them: a step that
is not logged leaves them on the device (``adapt/train/loss_log.py``)."""

from __future__ import annotations

import sys

import pytest
import torch

from ladderize.adapt.train import loss_log
from ladderize.adapt.plan.config import AdaptConfig
from ladderize.adapt.stage_run import adapt

SEQ, STEPS = 16, 8
LOOPS = frozenset({"train", "train_step", "flush"})  # the training loop, its step and its one read


def _reads_in_the_loop(monkeypatch) -> list[str]:
    """The host reads of a tensor (``item``, ``tolist``) that a training loop makes from here on, by caller name."""
    reads: list[str] = []
    for name in ("item", "tolist"):
        original = getattr(torch.Tensor, name)

        def counting(self, *args, _original=original, **kwargs):
            caller = sys._getframe(1).f_code.co_name
            if caller in LOOPS:
                reads.append(caller)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counting)
    return reads


def _config(ladder_dir, text_file, out, shard: str) -> AdaptConfig:
    return AdaptConfig.from_flat(checkpoint=str(ladder_dir), out=str(out), data=str(text_file), objectives="kd",
                       tokens=STEPS * 2 * SEQ, seq_len=SEQ, batch_size=2, lr=1e-2, dtype="float32", device="cpu",
                       compile=False, shard=shard)


@pytest.mark.parametrize("shard", ["ddp", "fsdp"])
def test_losses_are_read_once_a_logged_window_and_the_curve_is_every_steps(shard, ladder_dir, text_file, tmp_path,
                                                                          monkeypatch):
    """With a read every 4 steps, 8 steps read the losses twice (one ``tolist`` each) and give the same curve, step
    for step, as a read every step."""
    every = adapt(_config(ladder_dir, text_file, tmp_path / "every", shard)).curve
    monkeypatch.setattr(loss_log, "LOG_EVERY_CPU", 4)
    reads = _reads_in_the_loop(monkeypatch)
    windowed = adapt(_config(ladder_dir, text_file, tmp_path / "windowed", shard)).curve
    assert reads == ["flush", "flush"], reads
    assert [r["step"] for r in windowed] == list(range(1, STEPS + 1))
    assert [r["loss_kd"] for r in windowed] == [r["loss_kd"] for r in every]
    assert [r["lr"] for r in windowed] == [r["lr"] for r in every]
