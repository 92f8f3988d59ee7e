"""The communication plan follows each layer's mode (no processes needed)."""

from __future__ import annotations

import pytest

from ladderize.errors import LadderizeError
from ladderize.model.layout import LayerMode, Layout
from ladderize.runtime.plan import Schedule, StepKind, build_plan, domino_chunks_for


def layout(*modes: str, spd_tp_size: int = 2) -> Layout:
    return Layout(tuple(LayerMode(m) for m in modes), spd_tp_size=spd_tp_size)


def test_dense_is_blocking_two_per_layer():
    plan = build_plan(Layout.dense(3))
    assert [s.kind for s in plan.steps] == [StepKind.ATTENTION, StepKind.MLP] * 3
    assert not any(s.reads_stale or s.overlapped for s in plan.steps)
    assert plan.allreduces_per_forward == 6 == Layout.dense(3).allreduces_per_token()["total"]


def test_ladder_overlaps_every_allreduce_but_the_last():
    plan = build_plan(layout("ladder", "ladder"))
    assert all(s.reads_stale for s in plan.steps)
    assert [s.overlapped for s in plan.steps] == [True, True, True, False]  # the final norm needs r_2L


def test_hybrid_transitions():
    # dense -> ladder: the dense MLP's all-reduce overlaps the first ladder attention (it reads r_{k-2});
    # ladder -> spd: the SPD block reads the complete stream; spd -> ladder: the SPD all-reduce overlaps.
    plan = build_plan(layout("dense", "ladder", "spd", "ladder", "dense"))
    got = [(s.layer, s.kind.value, s.reads_stale, s.overlapped) for s in plan.steps]
    assert got == [
        (0, "attention", False, False),
        (0, "mlp", False, True),
        (1, "attention", True, True),
        (1, "mlp", True, False),
        (2, "spd_block", False, True),
        (3, "attention", True, True),
        (3, "mlp", True, False),
        (4, "attention", False, False),
        (4, "mlp", False, False),
    ]
    native = layout("dense", "ladder", "spd", "ladder", "dense")
    assert plan.allreduces_per_forward == native.allreduces_per_token()["total"] == 9


def test_spd_has_one_allreduce_per_block():
    plan = build_plan(layout("spd", "spd", "dense"))
    assert [s.kind for s in plan.steps] == [StepKind.SPD_BLOCK, StepKind.SPD_BLOCK, StepKind.ATTENTION, StepKind.MLP]
    assert plan.allreduces_per_forward == 4


def test_comparison_schedules_use_dense_math():
    native = layout("ladder", "spd")
    dense = build_plan(native, "dense")
    assert dense.layout.modes == (LayerMode.DENSE, LayerMode.DENSE) and dense.communicate
    upper = build_plan(native, Schedule.UPPER_BOUND)
    assert not upper.communicate and upper.allreduces_per_forward == 0
    domino = build_plan(native, "domino", chunks=3)
    assert domino.chunks == 3 and all(s.overlapped for s in domino.steps)
    assert domino.allreduces_per_forward == 12 and domino.overlapped_allreduces == 11
    assert build_plan(native, "native", chunks=3).chunks == 1


def test_domino_chunks_and_bad_schedule():
    assert domino_chunks_for(1, 2) == 1 and domino_chunks_for(16, 4) == 4 and domino_chunks_for(3, 4) == 3
    with pytest.raises(LadderizeError, match="unknown schedule"):
        build_plan(Layout.dense(2), "fastest")


def test_inspect_overlappable_count_equals_the_runtime_plan_for_every_layout(tmp_path):
    """Every layout of 4 layers over {dense, ladder, spd}: inspect's counts are the plan's."""
    import itertools

    from ladderize.convert.inspect import inspect_checkpoint
    from tests.conftest import tiny_model

    all_ladder = Layout.from_ranges(4, ladder="all")
    tiny_model(layer_modes=["ladder"] * 4).save_pretrained(tmp_path / "ladder")
    reported = inspect_checkpoint(tmp_path / "ladder")["allreduces_per_token"]
    assert reported == {"total": 8, "overlappable": build_plan(all_ladder).overlapped_allreduces} == {"total": 8, "overlappable": 7}
    for modes in itertools.product(list(LayerMode), repeat=4):
        native = Layout(tuple(modes), spd_tp_size=2)
        plan = build_plan(native)
        counts = native.allreduces_per_token()
        assert counts["total"] == plan.allreduces_per_forward, native.describe()
        assert counts["overlappable"] == plan.overlapped_allreduces, native.describe()
