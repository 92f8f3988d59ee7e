"""Sensitivity reports are well-formed and auto-selection honours its budget; head permutations keep the dense function."""

from __future__ import annotations

import json

import pytest
import torch

from ladderize.convert.head_grouping import (
    apply_head_orders,
    group_heads,
    materialize_head_order,
    permute_heads,
)
from ladderize.convert.sensitivity import CATEGORIES, SensitivityReport, measure_sensitivity, select_layers
from ladderize.errors import LadderizeError
from ladderize.model import LayerMode
from tests.conftest import tiny_model

IDS = torch.randint(3, 128, (2, 24), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("mode,tp", [(LayerMode.SPD, 3), (LayerMode.LADDER, 1)])
def test_sensitivity_report_is_well_formed(mode, tp, tmp_path):
    model = tiny_model()
    report = measure_sensitivity(model, IDS, mode=mode, spd_tp_size=tp, data="random")
    assert [b.layer for b in report.blocks] == [3, 2, 1, 0]  # last block first
    assert sorted(report.ranking()) == [0, 1, 2, 3]
    assert all(b.category in CATEGORIES for b in report.blocks)
    # the last suffix converts every layer: compare with the real fully converted model
    from ladderize.eval.perplexity import perplexity
    from ladderize.model import Layout
    from ladderize.convert.relayout import with_layout

    full = with_layout(model, Layout(tuple([mode] * 4), tp))
    assert report.blocks[-1].ppl_suffix == pytest.approx(perplexity(full, IDS, seq_len=24), rel=1e-4)
    assert report.dense_ppl == pytest.approx(perplexity(model, IDS, seq_len=24), rel=1e-4)
    report.save(tmp_path / "s.json")
    again = SensitivityReport.load(tmp_path / "s.json")
    assert again.ranking() == report.ranking()
    assert set(json.loads((tmp_path / "s.json").read_text())) >= {"blocks", "ranking", "thresholds", "dense_ppl"}


def test_selection_honours_budget():
    report = measure_sensitivity(tiny_model(), IDS, mode=LayerMode.SPD, spd_tp_size=3)
    deltas = {b.layer: max(b.delta, 0) for b in report.blocks}
    for budget in (0.001, 0.02, 0.1, 0.5, 0.99):
        chosen = select_layers(report, budget)
        assert sum(deltas[i] for i in chosen) <= budget
    assert select_layers(report, 2) == sorted(report.ranking()[:2])
    with pytest.raises(LadderizeError):
        select_layers(report, 1.5)


def test_head_permutation_leaves_dense_logits_unchanged():
    model = tiny_model()
    before = model(IDS).logits
    permute_heads(model, 1, [2, 0, 1])
    permute_heads(model, 3, [1, 2, 0])
    assert (model(IDS).logits - before).abs().max().item() <= 1e-5


def test_recorded_order_equals_materialized_permutation():
    model = tiny_model(layer_modes=["dense", "spd", "spd", "dense"], spd_tp_size=3)
    grouped = apply_head_orders(model, {1: (2, 0, 1), 2: (1, 0, 2)})
    assert grouped.config.spd_head_order[1] == [2, 0, 1] or tuple(grouped.config.spd_head_order[1]) == (2, 0, 1)
    recorded = grouped(IDS).logits
    assert (recorded - model(IDS).logits).abs().max() > 1e-4  # grouping changes the SPD function
    materialized = materialize_head_order(grouped)
    assert materialized.layout.spd_head_order is None
    assert (materialized(IDS).logits - recorded).abs().max().item() <= 1e-5


def test_group_heads_picks_the_lowest_error_order():
    teacher = tiny_model()
    student = tiny_model(layer_modes=["dense", "spd", "dense", "spd"], spd_tp_size=3)
    student.load_state_dict(teacher.state_dict())
    orders = group_heads(student, teacher, IDS)
    assert set(orders) == {1, 3} and all(sorted(o) == [0, 1, 2] for o in orders.values())


def test_attention_maps_are_the_models_own_attention():
    """Head grouping's maps come from the model's attention: maps @ V equals the heads' output."""
    from ladderize.convert.residual_states import embed

    model = tiny_model()
    with torch.no_grad():
        state, attn_kwargs = embed(model, IDS[:2])
        attn = model.model.layers[1].self_attn
        hidden = model.model.layers[1].input_layernorm(state[0])
        maps = attn.attention_maps(hidden, attn_kwargs["position_embeddings"])  # [B, H, S, S]
        _, _, value = attn.projections(hidden, attn_kwargs["position_embeddings"])
        mixed = maps @ value.repeat_interleave(attn.num_key_value_groups, dim=1)  # [B, H, S, hd]
        heads = attn.heads(hidden, **{**attn_kwargs, "past_key_values": None})
    assert torch.allclose(maps.sum(-1), torch.ones(()), atol=1e-6)
    assert (mixed.transpose(1, 2).reshape(heads.shape) - heads).abs().max() <= 1e-5


def test_sensitivity_table_shows_total_increase_and_step(tmp_path):
    """Issue 26 item 7: the column named 'increase vs dense' held the block's step; both are shown, named for what they hold."""
    from rich.console import Console

    from ladderize.cli.render import sensitivity_table

    report = measure_sensitivity(tiny_model(), IDS, mode=LayerMode.SPD, spd_tp_size=3)
    for block in report.blocks:
        assert block.increase_vs_dense == pytest.approx((block.ppl_suffix - report.dense_ppl) / report.dense_ppl)
    # the last row converts every candidate: its total is the sum of every step
    assert report.blocks[-1].increase_vs_dense == pytest.approx(sum(b.delta for b in report.blocks))
    console = Console(width=300, record=True)
    console.print(sensitivity_table(report, "spd", "random"))
    text = console.export_text()
    assert "total vs dense" in text and "step of this block" in text
    last = report.blocks[-1]
    row = next(line for line in text.splitlines() if line.strip("│ ").startswith(str(last.layer)) and f"{last.ppl_suffix:.2f}" in line)
    assert f"{100 * last.increase_vs_dense:+.2f}%" in row and f"{100 * last.delta:+.2f}%" in row


def test_sensitivity_json_is_a_record_and_old_files_still_load(tmp_path):
    """Issue 26 item 15: the sensitivity JSON names its record and version like bench/predict/eval."""
    from ladderize.records import RECORD_VERSION, SENSITIVITY_RECORD

    report = measure_sensitivity(tiny_model(), IDS, mode=LayerMode.SPD, spd_tp_size=3)
    report.save(tmp_path / "s.json")
    raw = json.loads((tmp_path / "s.json").read_text())
    assert raw["record"] == SENSITIVITY_RECORD and raw["version"] == RECORD_VERSION
    for key in ("record", "version"):
        raw.pop(key)
    for block in raw["blocks"]:
        block.pop("increase_vs_dense")
    (tmp_path / "old.json").write_text(json.dumps(raw))
    old = SensitivityReport.load(tmp_path / "old.json")
    assert [b.increase_vs_dense for b in old.blocks] == pytest.approx([b.increase_vs_dense for b in report.blocks])
    (tmp_path / "bench.json").write_text(json.dumps({**raw, "record": "ladderize-bench"}))
    with pytest.raises(LadderizeError, match="not a ladderize-sensitivity record"):
        SensitivityReport.load(tmp_path / "bench.json")
