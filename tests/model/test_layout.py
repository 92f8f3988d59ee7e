"""Layer-range parsing, Layout construction and validation, and communication counts."""

from __future__ import annotations

import random

import pytest
from tests.conftest import TINY, TINY_TP2, tiny_config
from transformers import LlamaConfig

from ladderize.model import LayerMode, Layout, LayoutError, format_layer_ranges, parse_layer_ranges


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("16:32", list(range(16, 32))),
        ("-8:", list(range(24, 32))),
        (":4", [0, 1, 2, 3]),
        ("28:", [28, 29, 30, 31]),
        ("0:-30", [0, 1]),
        ("all", list(range(32))),
        ("ALL", list(range(32))),
        ("none", []),
        ("", []),
        (None, []),
        ("0:4,10", [0, 1, 2, 3, 10]),
        (" 0:2 , 5 ", [0, 1, 5]),
        ("5,1,3", [1, 3, 5]),
        ("0:3,2:5", [0, 1, 2, 3, 4]),  # overlapping items within one spec merge
        ("7", [7]),
        ("0", [0]),
        ("31", [31]),
        ("-1", [31]),
        ("-2", [30]),
    ],
)
def test_parse_layer_ranges(spec, expected):
    assert parse_layer_ranges(spec, 32) == expected


@pytest.mark.parametrize(
    "spec",
    ["32", "33", "-33", "0:40", "-40:", "a:b", "x", "1:2:3", "5:3", "2:2", "0,,1", ",", "1.5", "0:4;8"],
)
def test_parse_layer_ranges_rejects_bad_specs_with_one_line_message(spec):
    with pytest.raises(LayoutError) as info:
        parse_layer_ranges(spec, 32)
    message = str(info.value)
    assert message and "\n" not in message
    assert isinstance(info.value, ValueError)  # callers that catch ValueError keep working


def test_out_of_range_message_names_the_range_and_the_model_size():
    with pytest.raises(LayoutError, match=r"'0:40'.*32 layers"):
        parse_layer_ranges("0:40", 32)


@pytest.mark.parametrize(
    "layers, expected",
    [([], "none"), ([3], "3:4"), ([15, 16, 17, 20], "15:18,20:21"), ([2, 0, 1, 1], "0:3"), (range(32), "0:32")],
)
def test_format_layer_ranges(layers, expected):
    assert format_layer_ranges(layers) == expected


def test_format_then_parse_round_trips():
    rng = random.Random(0)
    for _ in range(200):
        layers = sorted(rng.sample(range(30), rng.randint(0, 30)))
        assert parse_layer_ranges(format_layer_ranges(layers), 30) == layers


def test_layout_from_ranges():
    layout = Layout.from_ranges(32, ladder="16:32", spd="0:4", spd_tp_size=8)
    assert layout.num_layers == 32
    assert layout.layers(LayerMode.LADDER) == list(range(16, 32))
    assert layout.layers(LayerMode.SPD) == [0, 1, 2, 3]
    assert layout.layers(LayerMode.DENSE) == list(range(4, 16))
    assert layout.spd_tp_size == 8
    assert layout.converted_layers == [0, 1, 2, 3] + list(range(16, 32))
    assert layout.ranges() == {"ladder": "16:32", "spd": "0:4"}
    assert layout.describe() == "ladder 16:32 + spd@tp8 0:4"
    assert Layout.from_ranges(4).modes == Layout.dense(4).modes == (LayerMode.DENSE,) * 4
    assert Layout.dense(4).describe() == "dense"
    assert Layout.from_ranges(4, ladder="all").modes == (LayerMode.LADDER,) * 4


def test_overlapping_ladder_and_spd_rejected():
    with pytest.raises(LayoutError, match="2:4") as info:
        Layout.from_ranges(8, ladder="0:4", spd="2:6")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("kwargs", [dict(ladder="0:9"), dict(spd="-9:"), dict(spd="8")])
def test_layout_out_of_range_rejected(kwargs):
    with pytest.raises(LayoutError) as info:
        Layout.from_ranges(8, **kwargs)
    assert "\n" not in str(info.value)


def test_spd_tp_degree_must_be_positive():
    with pytest.raises(LayoutError):
        Layout.from_ranges(4, spd="all", spd_tp_size=0)


@pytest.mark.parametrize(
    "tp, what",
    [(2, "key/value heads"), (4, "query heads"), (5, "query heads"), (6, "key/value heads")],
)
def test_tp_degree_not_dividing_heads_rejected(tp, what):
    # TINY: 6 query heads, 3 KV heads, intermediate 96.
    layout = Layout.from_ranges(4, spd="2:4", spd_tp_size=tp)
    with pytest.raises(LayoutError, match=what) as info:
        layout.validate(TINY["num_attention_heads"], TINY["num_key_value_heads"], TINY["intermediate_size"])
    assert "\n" not in str(info.value)
    with pytest.raises(LayoutError, match=what):  # the config validates on construction
        tiny_config(layer_modes=["dense", "dense", "spd", "spd"], spd_tp_size=tp)


def test_tp_degree_not_dividing_mlp_rejected():
    with pytest.raises(LayoutError, match="MLP intermediate size"):
        Layout.from_ranges(4, spd="all", spd_tp_size=3).validate(6, 3, 100)


def test_valid_tp_degrees_accepted():
    tiny_config(layer_modes=["spd"] * 4, spd_tp_size=3)
    tiny_config(**TINY_TP2, layer_modes=["spd"] * 4, spd_tp_size=2)
    tiny_config(**TINY_TP2, layer_modes=["spd"] * 4, spd_tp_size=4)
    # Without SPD layers the degree is irrelevant, so it is not checked.
    tiny_config(layer_modes=["ladder"] * 4, spd_tp_size=2)


def test_bad_head_order_rejected():
    with pytest.raises(LayoutError, match="permutation"):
        tiny_config(layer_modes=["spd"] * 4, spd_tp_size=3, spd_head_order=[[0, 0, 1], None, None, None])
    with pytest.raises(LayoutError, match="entries"):
        tiny_config(layer_modes=["spd"] * 4, spd_tp_size=3, spd_head_order=[[0, 1, 2]])
    with pytest.raises(LayoutError):
        tiny_config(layer_modes=["dense", "moe", "dense", "dense"])
    with pytest.raises(LayoutError):
        tiny_config(layer_modes=["dense"] * 3)


def test_allreduces_per_token():
    assert Layout.dense(32).allreduces_per_token() == {"total": 64, "overlappable": 0}
    # The last module's all-reduce has no next module to hide behind: the final norm reads r_2L.
    assert Layout.from_ranges(32, ladder="all").allreduces_per_token() == {"total": 64, "overlappable": 63}
    assert Layout.from_ranges(32, spd="all", spd_tp_size=8).allreduces_per_token() == {"total": 32, "overlappable": 0}
    mixed = Layout.from_ranges(32, ladder="16:32", spd="0:4", spd_tp_size=8)
    # 12 dense * 2 + 16 ladder * 2 + 4 spd * 1; ladder overlaps all but the very last all-reduce,
    # and the MLP all-reduce of dense layer 15 overlaps the first ladder attention (it reads r_{k-2}).
    assert mixed.allreduces_per_token() == {"total": 12 * 2 + 16 * 2 + 4, "overlappable": 16 * 2}


def test_layer_mode_properties():
    assert [m.allreduces_per_layer for m in LayerMode] == [2, 2, 1]
    assert [m.reads_stale_residual for m in LayerMode] == [False, True, False]
    assert [m.syncs_attention for m in LayerMode] == [True, True, False]
    assert [m.is_converted for m in LayerMode] == [False, True, True]


def test_head_order_and_rank_groups():
    from ladderize.model.layout import rank_kv_heads, rank_query_heads

    layout = Layout((LayerMode.SPD, LayerMode.SPD), spd_tp_size=2, spd_head_order=((3, 1, 0, 2), None))
    assert layout.head_order(0, 4) == [3, 1, 0, 2]
    assert layout.head_order(1, 4) == [0, 1, 2, 3]
    assert rank_kv_heads([3, 1, 0, 2], 2, 0) == [3, 1]
    assert rank_kv_heads([3, 1, 0, 2], 2, 1) == [0, 2]
    assert rank_query_heads([3, 1], num_attention_heads=8, num_key_value_heads=4) == [6, 7, 2, 3]


def test_layout_config_round_trip():
    config = tiny_config(layer_modes=["ladder", "spd", "dense", "spd"], spd_tp_size=3, spd_head_order=[None, [2, 0, 1], None, None])
    layout = config.layout
    assert layout.modes == (LayerMode.LADDER, LayerMode.SPD, LayerMode.DENSE, LayerMode.SPD)
    assert layout.spd_tp_size == 3
    assert layout.head_order(1, 3) == [2, 0, 1]
    fields = layout.config_fields()
    assert fields == {"layer_modes": ["ladder", "spd", "dense", "spd"], "spd_tp_size": 3, "spd_head_order": [None, [2, 0, 1], None, None]}
    assert tiny_config(**fields).layout == layout
    # A plain Llama config has no layout fields: all dense.
    assert Layout.from_config(LlamaConfig(**TINY)) == Layout.dense(TINY["num_hidden_layers"])
    assert tiny_config().layer_modes == ["dense"] * 4


def test_mode_program_reads_and_allreduces():
    from ladderize.model.layout import ModuleKind

    program = Layout.from_ranges(3, ladder="1:2", spd="2:3", spd_tp_size=2).program()
    got = [(op.k, op.layer, op.kind, op.reads, op.reads_local_partial, op.allreduce, op.overlaps_next) for op in program]
    A, M = ModuleKind.ATTENTION, ModuleKind.MLP
    assert got == [
        (1, 0, A, 0, False, True, False),  # dense reads r_{k-1}
        (2, 0, M, 1, False, True, True),  # overlaps: the ladder attention reads r_1
        (3, 1, A, 1, False, True, True),  # ladder reads r_{k-2}
        (4, 1, M, 2, False, True, False),  # the SPD attention after it reads the complete r_4
        (5, 2, A, 4, False, False, False),  # SPD attention: no all-reduce of its own
        (6, 2, M, 4, True, True, False),  # LN2(X + Y_r): the block input plus the rank's own partial
    ]
    # After an SPD block, a ladder attention reads the block's input (r after the SPD attention is its input).
    after_spd = Layout.from_ranges(2, ladder="1:2", spd="0:1", spd_tp_size=2).program()
    assert after_spd[2].reads == 0 and after_spd[1].overlaps_next
