"""A joint stage's batch is global (``adapt/plan/batches.py``, ``StepSplit``): the same sequences in the same optimizer
step on any process count and accumulation that divides it, split without overlap; one that does not divide is
refused in one line."""

from __future__ import annotations

import pytest

from ladderize.adapt.plan.batches import StepSplit, dividing_accumulation, divisible_batch, rows_at
from ladderize.adapt.plan.cost import Launch
from ladderize.adapt.plan.adapt_plan import build_plan
from ladderize.errors import LadderizeError
from ladderize.adapt.plan.config import GivenSettings
from tests.adapt.test_cost import _config_only


def batch_rows(num_sequences: int, step: int, batch_size: int, seed: int) -> list[int]:
    """The indices of the ``batch_size`` sequences one process alone trains at micro-step ``step`` (epochs wrap)."""
    return rows_at(num_sequences, step * batch_size, batch_size, seed)


@pytest.mark.parametrize("batch", [1, 2, 6, 12, 24])
def test_a_step_reads_the_same_sequences_on_any_process_count_that_divides_it(batch):
    for step in range(4):
        alone = batch_rows(37, step, batch, 3)
        for processes in (1, 2, 3, 8):
            for accum in (1, 2):
                split = StepSplit(batch, processes, accum)
                if not split.even:
                    continue
                parts = [split.rows(37, step, micro, rank, 3) for micro in range(accum) for rank in range(processes)]
                assert [row for rows in parts for row in rows] == alone  # the same rows, in order, none twice
                assert all(len(rows) == split.local > 0 for rows in parts)


def test_an_even_split_is_the_per_process_order():
    split = StepSplit(12, 3, 2)
    assert split.even and split.local == 2
    for step in range(3):
        for micro in range(2):
            for rank in range(3):
                rows = split.rows(50, step, micro, rank, 7)
                assert rows == batch_rows(50, (step * 2 + micro) * 3 + rank, 2, 7)  # consecutive micro-steps


def test_the_split_says_how_the_batch_is_shared():
    assert StepSplit(6, 3).describe() == "batch 6 = 2 per process x 3 processes"
    assert StepSplit(12, 3, 2).describe() == "batch 12 = 2 per process x 3 processes x 2 accumulated"
    assert StepSplit(4, 1, 2).describe() == "batch 4 = 2 per process x 2 accumulated"
    assert StepSplit(4).describe() == "batch 4"


def test_a_batch_that_does_not_divide_is_refused_naming_the_sizes_that_do():
    with pytest.raises(LadderizeError) as one:
        StepSplit(2, 1, 4).check()
    assert "--batch-size 2 does not divide into 1 process x 4 micro-batches" in str(one.value)
    assert "give --batch-size 4, or --grad-accum 1 or 2" in str(one.value)
    with pytest.raises(LadderizeError) as three:
        StepSplit(8, 3, 4).check()
    assert str(three.value).endswith("give --batch-size 12")  # 8 rows over 3 processes: no accumulation divides them
    with pytest.raises(LadderizeError, match="give --batch-size 12 or 18"):
        StepSplit(13, 3, 2).check()
    StepSplit(12, 3, 2).check()
    with pytest.raises(AssertionError):  # the loop's backstop: a part without rows is never run
        StepSplit(2, 3).rows(10, 0, 0, 2, 0)


def test_the_accumulation_chosen_for_memory_divides_the_batch():
    assert dividing_accumulation(16, 8, 1) == 1 and dividing_accumulation(48, 8, 4) == 6
    assert dividing_accumulation(12, 1, 5) == 6 and dividing_accumulation(12, 8, 1) is None
    assert dividing_accumulation(8, 8, 2) is None  # one row per process: it cannot be split further
    assert divisible_batch(2, 4) == 4 and divisible_batch(8, 12) == 12 and divisible_batch(12, 6) == 12


def test_the_plan_refuses_a_given_batch_that_does_not_divide_and_rounds_a_preset_s(tmp_path):
    """``--batch-size 2 --grad-accum 4`` on one process and ``--batch-size 8 --grad-accum 4`` on 3 are refused before
    anything is read but config.json; a preset's batch is rounded up to the launch, with a line."""
    folder = _config_only(tmp_path, "llama-3.1-8b", 16)
    with pytest.raises(LadderizeError, match=r"--batch-size 2 does not divide into 1 process x 4 micro-batches .*"
                                             r"give --batch-size 4, or --grad-accum 1 or 2"):
        build_plan(folder, single=GivenSettings.of({"objectives": "kd", "batch_size": 2, "grad_accum": 4}), launch=Launch(1))
    with pytest.raises(LadderizeError, match=r"--batch-size 8 does not divide into 3 processes x 4 micro-batches"):
        build_plan(folder, shared=GivenSettings.of({"batch_size": 8, "grad_accum": 4}), launch=Launch(3))
    said: list[str] = []
    plan = build_plan(folder, launch=Launch(3), say=said.append)  # the default recipe: kd's preset batch of 2
    kd = plan.stages[-1]
    assert kd.resolved.training.batch_size == 3 and StepSplit(3, 3).even
    assert any("batch 2 rounded up to 3, to divide into 3 process(es)" in line for line in said)


def test_no_run_trains_an_empty_micro_batch(ladder_dir, text_file, tmp_path, monkeypatch):
    """Every micro-batch a run trains holds rows (counted at the split every training step reads)."""
    from ladderize.adapt.plan.config import AdaptConfig
    from ladderize.adapt.stage_run import adapt

    counted: list[int] = []
    rows = StepSplit.rows

    def counting(self, *args):
        read = rows(self, *args)
        counted.append(len(read))
        return read

    monkeypatch.setattr(StepSplit, "rows", counting)
    config = AdaptConfig.from_flat(checkpoint=str(ladder_dir), out=str(tmp_path / "out"), data=str(text_file), objectives="kd",
                         tokens=4 * 32 * 3, seq_len=32, batch_size=4, grad_accum=2, dtype="float32", device="cpu",
                         compile=False)
    adapt(config)
    assert len(counted) >= 3 * 2 and min(counted) == 2  # 3 steps x 2 micro-batches of 2 rows
    with pytest.raises(LadderizeError, match="--batch-size 4 does not divide into 1 process x 3 micro-batches"):
        adapt(AdaptConfig.from_flat(**{**config.flat(), "out": str(tmp_path / "other"), "grad_accum": 3}))
    assert not (tmp_path / "other").exists()
