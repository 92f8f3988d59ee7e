"""Which sequences each training step reads: a shuffled order per epoch, a pure function of the seed, so a
resumed run reads what the uninterrupted one would; several processes share each step's rows without overlap.

A joint stage's batch is global: ``batch_size`` sequences per optimizer step, whatever the process count. Step ``s``
reads positions ``[s * batch_size, (s + 1) * batch_size)`` of the order; its rows are cut into ``processes x
grad_accum`` consecutive parts (``StepSplit``), part ``micro * processes + rank`` for process ``rank``'s micro-batch
``micro``. The batch must divide into those parts (torchtitan's rule, ``StepSplit.check``): each part holds the same
rows, so the processes' averaged gradients, each divided by ``grad_accum``, are the mean over the whole batch's tokens,
and no process runs a micro-batch without rows."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from ...errors import LadderizeError


@functools.lru_cache(maxsize=4)
def batch_order(num_sequences: int, epoch: int, seed: int) -> torch.Tensor:
    """The shuffled order of sequences in ``epoch``: a pure function of (epoch, seed), so resume is exact.
    Computed once per epoch (cached): the rows of a step look it up in O(1)."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(num_sequences, generator=generator)


@dataclass(frozen=True)
class StepSplit:
    """How a joint stage's global batch of ``batch_size`` sequences per optimizer step is split over ``processes``
    processes and ``grad_accum`` micro-batches each: torchtitan's global batch = local batch x processes x
    accumulation, which must divide (``check``): every micro-batch of every process trains ``local`` sequences."""

    batch_size: int
    processes: int = 1
    grad_accum: int = 1

    @property
    def parts(self) -> int:
        return self.processes * self.grad_accum

    @property
    def even(self) -> bool:
        return self.batch_size % self.parts == 0

    @property
    def local(self) -> int:
        """The rows of one micro-batch of one process (what its memory holds; rounded up where the batch does not
        divide, which ``check`` refuses)."""
        return -(-self.batch_size // self.parts)

    def check(self, flag: str = "--batch-size") -> None:
        """Refuse, in one line, a batch that does not divide into ``processes x grad_accum`` micro-batches of at least
        one sequence, naming the nearest batch sizes that do and the accumulations that divide this one."""
        if self.even:
            return
        parts = self.parts
        below, above = self.batch_size // parts * parts, -(-self.batch_size // parts) * parts
        sizes = " or ".join(str(size) for size in (below, above) if size > 0)
        accums = [n for n in range(1, self.batch_size // self.processes + 1)
                  if self.batch_size % (self.processes * n) == 0] if self.batch_size % self.processes == 0 else []
        where = f"{self.processes} process{'es' if self.processes > 1 else ''} x {self.grad_accum} micro-batch" + \
            ("es" if self.grad_accum > 1 else "")
        alternative = f", or --grad-accum {' or '.join(map(str, accums))}" if accums else ""
        raise LadderizeError(f"{flag} {self.batch_size} does not divide into {where} of at least one sequence each "
                             f"(every micro-batch of every process trains the same rows): give {flag} {sizes}"
                             f"{alternative}")

    def part(self, micro: int, rank: int) -> tuple[int, int]:
        """``(offset, rows)``: where in the step's batch process ``rank``'s micro-batch ``micro`` starts, and its rows."""
        index = micro * self.processes + rank
        return index * self.local, self.local

    def rows(self, num_sequences: int, step: int, micro: int, rank: int, seed: int) -> list[int]:
        """The sequences process ``rank`` trains at micro-batch ``micro`` of optimizer step ``step``: ``local`` of them
        (a batch that does not divide is refused, ``check``; an empty micro-batch is never run)."""
        assert self.even and self.local > 0, f"batch {self.batch_size} over {self.parts} micro-batches: not refused"
        offset, count = self.part(micro, rank)
        return rows_at(num_sequences, step * self.batch_size + offset, count, seed)

    def describe(self) -> str:
        """``batch 6 = 2 per process x 3 processes``, ``batch 12 = 2 per process x 3 processes x 2 accumulated``;
        one process: ``batch 4`` or ``batch 4 = 2 per process x 2 accumulated``."""
        if self.parts == 1:
            return f"batch {self.batch_size}"
        split = f"{self.local} per process" + (f" x {self.processes} processes" if self.processes > 1 else "")
        accumulated = f" x {self.grad_accum} accumulated" if self.grad_accum > 1 else ""
        return f"batch {self.batch_size} = {split}{accumulated}"


def dividing_accumulation(batch_size: int, processes: int, least: int) -> int | None:
    """The fewest micro-batches, at least ``least``, that ``batch_size`` divides into on ``processes`` processes (None:
    none; the batch does not divide over the processes, or ``least`` is above its rows per process)."""
    if batch_size % processes:
        return None
    per_process = batch_size // processes
    return next((n for n in range(max(1, least), per_process + 1) if per_process % n == 0), None)


def divisible_batch(batch_size: int, parts: int) -> int:
    """The smallest batch of at least ``batch_size`` sequences that divides into ``parts`` micro-batches."""
    return -(-batch_size // parts) * parts


def rows_at(num_sequences: int, start: int, count: int, seed: int) -> list[int]:
    """The ``count`` sequences at positions ``start``... of the epochs' orders laid end to end."""
    return [int(batch_order(num_sequences, epoch, seed)[offset]) for epoch, offset in
            (divmod(position, num_sequences) for position in range(start, start + count))]
