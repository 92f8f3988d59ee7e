"""Which sequences each training step reads: a shuffled order per epoch, a pure function of the seed, so a
resumed run reads what the uninterrupted one would; several processes share each step's rows without overlap."""

from __future__ import annotations

import functools

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
    start = step * batch_size
    return [int(batch_order(num_sequences, epoch, seed)[offset]) for epoch, offset in
            (divmod(position, num_sequences) for position in range(start, start + batch_size))]


def batch_at(data: TokenWindows | torch.Tensor, step: int, batch_size: int, seed: int) -> torch.Tensor:
    """The ``batch_size`` sequences used at global micro-step ``step`` (epochs wrap around)."""
    rows = batch_rows(len(data), step, batch_size, seed)
    return data.rows(rows) if isinstance(data, TokenWindows) else data[torch.tensor(rows)]
