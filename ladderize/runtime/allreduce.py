"""All-reduce wrappers: blocking, asynchronous and no-op, with counting and exposed-time accounting.

``Communicator.all_reduce(partial, async_op)`` returns an ``InFlight`` whose ``wait()``
gives the summed tensor. The blocking path waits inside ``all_reduce``; the async path
returns at once (``torch.distributed.all_reduce(..., async_op=True)``) and the caller
waits when it needs the result. With ``communicate=False`` (the upper-bound schedule, or a
single rank) nothing is sent and the local partial comes back unchanged.

``exposed_s`` is the host time spent inside the all-reduce calls and ``wait()``: on CPU
(gloo) that is the communication the computation did not hide. On CUDA the calls only
enqueue work on NCCL's stream, so host time says little there; the benchmark then
derives the share from the upper-bound run instead (see ``bench.py``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist


@dataclass
class CommStats:
    """Counters of one rank; ``reset()`` between timed runs."""

    allreduce_count: int = 0
    issue_s: float = 0.0  # inside dist.all_reduce (the whole operation when blocking)
    wait_s: float = 0.0  # inside Work.wait() of asynchronous all-reduces
    bytes_reduced: int = 0

    @property
    def exposed_s(self) -> float:
        return self.issue_s + self.wait_s

    def reset(self) -> None:
        self.allreduce_count, self.issue_s, self.wait_s, self.bytes_reduced = 0, 0.0, 0.0, 0


class InFlight:
    """An all-reduce that may still be running; ``wait()`` returns the reduced tensor."""

    __slots__ = ("_tensor", "_work", "_stats")

    def __init__(self, tensor: torch.Tensor, work, stats: CommStats | None):
        self._tensor, self._work, self._stats = tensor, work, stats

    def wait(self) -> torch.Tensor:
        if self._work is not None:
            start = time.perf_counter()
            self._work.wait()
            if self._stats is not None:
                self._stats.wait_s += time.perf_counter() - start
            self._work = None
        return self._tensor


@dataclass
class Communicator:
    """Sums partial outputs over the TP group (or pretends to, for the upper bound)."""

    world_size: int = 1
    group: object | None = None  # a torch.distributed ProcessGroup; None = the default group
    stats: CommStats = field(default_factory=CommStats)

    @property
    def active(self) -> bool:
        return self.world_size > 1

    def all_reduce(self, partial: torch.Tensor, async_op: bool, communicate: bool = True) -> InFlight:
        """Sum ``partial`` (in place) over the ranks; ``async_op`` returns before the sum is done."""
        if not (communicate and self.active):
            return InFlight(partial, None, None)
        self.stats.allreduce_count += 1
        self.stats.bytes_reduced += partial.numel() * partial.element_size()
        start = time.perf_counter()
        work = dist.all_reduce(partial, op=dist.ReduceOp.SUM, group=self.group, async_op=async_op)
        self.stats.issue_s += time.perf_counter() - start
        return InFlight(partial, work if async_op else None, self.stats)


__all__ = ["CommStats", "Communicator", "InFlight"]
