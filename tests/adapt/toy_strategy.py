"""A toy strategy in one file: ``handavg``, the replicated training with its gradients averaged by hand (one
all-reduce per parameter after the last micro-batch's backward, then a division by the process count) in place of
DDP's wrapper. One ``StrategyEntry`` and its run class, nothing else: ``--shard handavg``, the plan's words, its
pricing (it does not shard: the whole weights on every process) and the run follow from the entry (docs/architecture.md,
"Adding a strategy"; ``test_toy_strategy.py`` checks them). The step around it (precision, loss scaling, clip, AdamW)
is the loop's, as for every strategy.

Run as a script (``python tests/adapt/toy_strategy.py adapt ...``, under torchrun too), it registers the entry and runs
ladderize's command line.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.distributed as dist

from ladderize.adapt.plan.strategies import STRATEGIES, StrategyEntry, register
from ladderize.adapt.train.replicated import ReplicatedRun


class HandAveragedRun(ReplicatedRun):
    """``ReplicatedRun`` with the model left unwrapped: each process's gradients are summed over the processes and
    divided by their count after the last micro-batch of a step, as DDP's all-reduce would."""

    def wrap(self) -> None:
        self.state_module.to(self.device)
        self.loss_module = self.state_module

    @contextlib.contextmanager
    def synchronizing(self, last: bool) -> Iterator[None]:
        yield  # the micro-batch's forward and backward
        if last and self.world > 1:
            for param in self.params:
                if param.grad is None:
                    param.grad = torch.zeros_like(param)
                dist.all_reduce(param.grad)
                param.grad.div_(self.world)


TOY = StrategyEntry("handavg", "tests.adapt.toy_strategy:HandAveragedRun", shards=False, label="hand-averaged gradients")


def register_toy(monkeypatch=None) -> StrategyEntry:
    """Add ``handavg`` (undone by ``monkeypatch``; for good in a process of its own without one)."""
    if monkeypatch is not None:
        monkeypatch.setitem(STRATEGIES, TOY.name, TOY)
        return TOY
    return register(TOY)


if __name__ == "__main__":
    register_toy()
    from ladderize.cli import main

    main()
