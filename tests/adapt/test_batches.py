"""A joint stage's batch is global (``adapt/batches.py``, ``StepSplit``): the same sequences in the same optimizer
step on any process count and accumulation, split without overlap, each part's loss weighted by its rows."""

from __future__ import annotations

import pytest

from ladderize.adapt.batches import StepSplit, batch_rows, micro_batch_index


@pytest.mark.parametrize("batch", [1, 2, 5, 6, 12])
def test_a_step_reads_the_same_sequences_on_any_process_count(batch):
    for step in range(4):
        alone = batch_rows(37, step, batch, 3)
        for processes in (1, 2, 3, 8):
            for accum in (1, 2):
                split = StepSplit(batch, processes, accum)
                parts = [split.rows(37, step, micro, rank, 3) for micro in range(accum) for rank in range(processes)]
                read = [row for rows, weight in parts if weight for row in rows]
                assert read == alone  # the same rows, in order, none twice
                assert sum(weight for _, weight in parts) == pytest.approx(processes * accum)  # the mean over the batch
                assert all(len(rows) <= split.local for rows, _ in parts)
                assert all(weight == 0 or weight == len(rows) * processes * accum / batch for rows, weight in parts)


def test_an_even_split_is_the_per_process_order_of_before_with_weight_one():
    split = StepSplit(12, 3, 2)
    assert split.even and split.local == 2
    for step in range(3):
        for micro in range(2):
            for rank in range(3):
                rows, weight = split.rows(50, step, micro, rank, 7)
                assert weight == 1.0 and rows == batch_rows(50, micro_batch_index(step, micro, 2, 3, rank), 2, 7)


def test_the_split_says_how_the_batch_is_shared():
    assert StepSplit(6, 3).describe() == "batch 6 = 2 per process x 3 processes"
    assert StepSplit(12, 3, 2).describe() == "batch 12 = 2 per process x 3 processes x 2 accumulated"
    assert StepSplit(4, 1, 2).describe() == "batch 4 = 2 per process x 2 accumulated"
    assert StepSplit(4).describe() == "batch 4"
    assert StepSplit(2, 3).describe() == "batch 2 = 1 or 0 per process x 3 processes (each part's loss weighted by its rows)"
