"""The schedule simulator on cases small enough to compute by hand."""

from __future__ import annotations

import pytest

from ladderize.model.layout import LayerMode, Layout
from ladderize.predict.simulate import ModuleCost, plan_modules, simulate, simulate_step

DENSE, LADDER, SPD = LayerMode.DENSE, LayerMode.LADDER, LayerMode.SPD


def test_dense_blocks_on_every_allreduce():
    attention, mlp = ModuleCost(3.0, 1.0), ModuleCost(5.0, 2.0)
    step = simulate_step([DENSE] * 4, attention, mlp, head_s=7.0, overlap_slowdown=0.5)
    assert step.total_s == pytest.approx(4 * (3 + 1 + 5 + 2) + 7)
    assert step.num_allreduces == 8
    assert step.exposed_comm_s == pytest.approx(4 * 3)  # blocking: no overlap, so no slowdown either


def test_upper_bound_is_pure_compute():
    step = simulate_step([LADDER] * 3, ModuleCost(3.0, 9.0), ModuleCost(5.0, 9.0), head_s=1.0, communicate=False)
    assert step.total_s == pytest.approx(3 * 8 + 1)
    assert step.num_allreduces == 0 and step.exposed_comm_s == 0


def test_ladder_matches_upper_bound_when_compute_dominates():
    layers, attention, mlp, head = 10, ModuleCost(100.0, 1.0), ModuleCost(200.0, 1.0), 50.0
    ladder = simulate_step([LADDER] * layers, attention, mlp, head_s=head)
    upper = simulate_step([LADDER] * layers, attention, mlp, head_s=head, communicate=False)
    # Every all-reduce hides behind the next module; only the last one (before the LM head) shows.
    assert ladder.total_s == pytest.approx(upper.total_s + 1.0)
    assert ladder.total_s / upper.total_s == pytest.approx(1.0, abs=1e-3)


def test_ladder_saves_only_the_compute_it_overlaps_when_communication_dominates():
    layers, attention, mlp = 6, ModuleCost(1.0, 100.0), ModuleCost(2.0, 100.0)
    dense = simulate_step([DENSE] * layers, attention, mlp)
    ladder = simulate_step([LADDER] * layers, attention, mlp)
    # The comm stream runs back to back: the first module, then 2L all-reduces.
    assert ladder.total_s == pytest.approx(1.0 + 2 * layers * 100.0)
    # Every module's compute is hidden except the first one's, which nothing precedes.
    assert dense.total_s - ladder.total_s == pytest.approx(layers * (1.0 + 2.0) - 1.0)


def test_ladder_exposes_only_the_excess_of_each_allreduce():
    # a = 5 hides fully behind the MLP (10) but exceeds the attention (2) by 3, once per layer boundary.
    layers, attention, mlp, a = 4, ModuleCost(2.0, 5.0), ModuleCost(10.0, 5.0), 5.0
    ladder = simulate_step([LADDER] * layers, attention, mlp)
    compute = layers * (2.0 + 10.0)
    excess = (layers - 1) * (a - 2.0)  # MLP all-reduce of layers 0..L-2 behind the next attention
    assert ladder.total_s == pytest.approx(compute + excess + a)  # + the last all-reduce before the head


@pytest.mark.parametrize("chosen", ["2:6", "0:8", "7"])
def test_spd_halves_the_attention_syncs_of_the_chosen_blocks(chosen):
    layout = Layout.from_ranges(8, spd=chosen, spd_tp_size=8)
    attention, mlp, a = ModuleCost(3.0, 4.0), ModuleCost(5.0, 4.0), 4.0
    dense = simulate_step(Layout.dense(8).modes, attention, mlp)
    spd = simulate_step(layout.modes, attention, mlp)
    spd_layers = len(layout.layers(SPD))
    assert SPD.allreduces_per_layer * 2 == DENSE.allreduces_per_layer
    assert spd.num_allreduces == layout.allreduces_per_token()["total"] == 16 - spd_layers
    assert dense.total_s - spd.total_s == pytest.approx(spd_layers * a)


def test_spd_mlp_starts_right_after_its_attention():
    planned = plan_modules([SPD, DENSE], ModuleCost(1.0, 9.0), ModuleCost(1.0, 9.0))
    assert planned[0].allreduce_s == 0.0  # SPD attention: no sync
    assert planned[1].waits_for is None  # its MLP needs no all-reduce of this step
    assert planned[2].waits_for == 1  # the next layer waits for the SPD layer's single sync


def test_domino_two_chunks_by_hand():
    # One dense layer, two chunks, each module c=4 per chunk and a=1 per chunk all-reduce.
    step = simulate_step([DENSE], ModuleCost(4.0, 1.0), ModuleCost(4.0, 1.0), chunks=2)
    # attn c1 [0,4] ar [4,5]; attn c2 [4,8] ar [8,9]; mlp c1 [8,12] ar [12,13]; mlp c2 [12,16] ar [16,17].
    assert step.total_s == pytest.approx(17.0)
    unsplit = simulate_step([DENSE], ModuleCost(8.0, 2.0), ModuleCost(8.0, 2.0))
    assert unsplit.total_s == pytest.approx(20.0)


def test_overlap_slowdown_stretches_overlapped_compute():
    # Two ladder layers, every module c=10, a=4, slowdown 0.5: three modules overlap 4 units of comm and
    # each takes 4 + (10 - 4 / 1.5) = 11.333.
    step = simulate_step([LADDER, LADDER], ModuleCost(10.0, 4.0), ModuleCost(10.0, 4.0), overlap_slowdown=0.5)
    assert step.total_s == pytest.approx(10 + 3 * (4 + 10 - 4 / 1.5) + 4)
    assert step.compute_s == pytest.approx(40.0)


def test_first_ladder_layer_after_dense_reads_the_post_attention_state():
    planned = plan_modules([DENSE, LADDER], ModuleCost(1.0, 1.0), ModuleCost(1.0, 1.0))
    # Module 2 (ladder attention) reads r_0 of its own numbering: the dense layer's post-attention state.
    assert [m.waits_for for m in planned] == [None, 0, 0, 1]


def test_empty_plan_and_bad_chunks():
    assert simulate([], head_s=2.0).total_s == 2.0
    with pytest.raises(ValueError):
        plan_modules([DENSE], ModuleCost(1, 1), ModuleCost(1, 1), chunks=0)
