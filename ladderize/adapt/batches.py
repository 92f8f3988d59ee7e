"""Which sequences each training step reads: a shuffled order per epoch, a pure function of the seed, so a
resumed run reads what the uninterrupted one would; several processes share each step's rows without overlap.

A joint stage's batch is global: ``batch_size`` sequences per optimizer step, whatever the process count. Step ``s``
reads positions ``[s * batch_size, (s + 1) * batch_size)`` of the order; its rows are cut into ``processes x
grad_accum`` consecutive parts (``StepSplit``), part ``micro * processes + rank`` for process ``rank``'s micro-batch
``micro``. Where the batch does not divide, the first parts take one row more, and each part's loss is weighted by
its rows (``StepSplit.weight``), so that the step's gradient is that of the mean over the whole batch's tokens."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from ..corpus.windows import TokenWindows


@functools.lru_cache(maxsize=4)
def batch_order(num_sequences: int, epoch: int, seed: int) -> torch.Tensor:
    """The shuffled order of sequences in ``epoch``: a pure function of (epoch, seed), so resume is exact.
    Computed once per epoch (cached): the rows of a step look it up in O(1)."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(num_sequences, generator=generator)


def micro_batch_index(step: int, micro: int, grad_accum: int, processes: int, rank: int) -> int:
    """The global micro-step whose rows process ``rank`` trains at micro-batch ``micro`` of optimizer step ``step``:
    the processes take consecutive micro-steps, so their shares are disjoint and together read, in order, what one
    process with ``processes`` times the batch would."""
    return (step * grad_accum + micro) * processes + rank


def batch_rows(num_sequences: int, step: int, batch_size: int, seed: int) -> list[int]:
    """The indices of the ``batch_size`` sequences used at global micro-step ``step`` (epochs wrap around)."""
    return rows_at(num_sequences, step * batch_size, batch_size, seed)


def batch_at(data: TokenWindows | torch.Tensor, step: int, batch_size: int, seed: int) -> torch.Tensor:
    """The ``batch_size`` sequences used at global micro-step ``step`` (epochs wrap around)."""
    rows = batch_rows(len(data), step, batch_size, seed)
    return data.rows(rows) if isinstance(data, TokenWindows) else data[torch.tensor(rows)]


@dataclass(frozen=True)
class StepSplit:
    """How a joint stage's global batch of ``batch_size`` sequences per optimizer step is split over ``processes``
    processes and ``grad_accum`` micro-batches each: torchtitan's global batch = local batch x processes x
    accumulation, with uneven parts where it does not divide."""

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
        """The most rows of one micro-batch of one process (what its memory holds)."""
        return -(-self.batch_size // self.parts)

    def part(self, micro: int, rank: int) -> tuple[int, int]:
        """``(offset, rows)``: where in the step's batch process ``rank``'s micro-batch ``micro`` starts, and how many
        rows it takes (0 where the batch has fewer rows than parts)."""
        index = micro * self.processes + rank
        base, extra = divmod(self.batch_size, self.parts)
        return index * base + min(index, extra), base + (index < extra)

    def weight(self, rows: int) -> float:
        """The factor of a part's mean loss over its ``rows`` rows that makes the step's gradient the mean over the
        global batch (the processes' gradients are averaged and the micro-batches' divided by ``grad_accum``):
        exactly 1 where the batch divides, 0 for a part without rows."""
        return rows * self.parts / self.batch_size

    def rows(self, num_sequences: int, step: int, micro: int, rank: int, seed: int) -> tuple[list[int], float]:
        """The sequences process ``rank`` trains at micro-batch ``micro`` of optimizer step ``step``, and the weight
        of their loss. A part without rows takes the step's first row with weight 0: every process runs the forward
        and backward its collectives (DDP's all-reduce, FSDP2's gathers) wait for, and adds nothing."""
        offset, count = self.part(micro, rank)
        start = step * self.batch_size
        if count == 0:
            return rows_at(num_sequences, start, 1, seed), 0.0
        return rows_at(num_sequences, start + offset, count, seed), self.weight(count)

    def describe(self) -> str:
        """``batch 6 = 2 per process x 3 processes``, ``batch 12 = 2 per process x 3 processes x 2 accumulated``,
        ``batch 2 = 1 or 0 per process x 3 processes (each part's loss weighted by its rows)``; one process:
        ``batch 4`` or ``batch 4 = 2 per process x 2 accumulated``."""
        if self.parts == 1:
            return f"batch {self.batch_size}"
        local = str(self.local) if self.even else f"{self.local} or {self.local - 1}"
        split = f"{local} per process" + (f" x {self.processes} processes" if self.processes > 1 else "")
        accumulated = f" x {self.grad_accum} accumulated" if self.grad_accum > 1 else ""
        uneven = "" if self.even else " (each part's loss weighted by its rows)"
        return f"batch {self.batch_size} = {split}{accumulated}{uneven}"


def rows_at(num_sequences: int, start: int, count: int, seed: int) -> list[int]:
    """The ``count`` sequences at positions ``start``... of the epochs' orders laid end to end."""
    return [int(batch_order(num_sequences, epoch, seed)[offset]) for epoch, offset in
            (divmod(position, num_sequences) for position in range(start, start + count))]
