"""Per-rank slicing, SPD head groups, validation, and single-rank parity (in process)."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import TINY, tiny_model
from ladderize.errors import LadderizeError
from ladderize.model.layout import LayoutError
from ladderize.runtime.allreduce import Communicator
from ladderize.runtime.decode import Decoder
from ladderize.checkpoint.io import load_config
from ladderize.checkpoint.shapes import ModelShape
from ladderize.runtime.tp_check import validate_tp
from ladderize.runtime.engine import RankModel
from ladderize.runtime.plan import build_plan
from ladderize.runtime.tp_slicing import SafetensorsSource, StateDictSource, head_slices, layer_shard
from ladderize.runtime.weights import load_rank_weights
from tests.runtime.runtime_helpers import TINY_TP23, case_overrides, save_tiny


def test_head_slices_merge_contiguous_heads():
    assert head_slices([0, 1, 3], 4) == [slice(0, 8), slice(12, 16)]
    assert head_slices([2, 0], 4) == [slice(8, 12), slice(0, 4)]


def test_shards_follow_the_spd_head_groups_of_the_model():
    order = [2, 0, 1]
    model = tiny_model(layer_modes=["spd", "dense", "dense", "dense"], spd_tp_size=3, spd_head_order=[order, None, None, None])
    dims, layout = ModelShape.from_config(model.config), model.config.layout
    groups = model.model.layers[0].spd_groups  # the model's own single-device definition
    for rank in range(3):
        shard = layer_shard(dims, layout, 0, 3, rank)
        assert shard.kv_heads == (order[rank],)
        columns = [c for s in head_slices(shard.q_heads, dims.head_dim) for c in range(s.start, s.stop)]
        assert columns == groups[rank][0] and shard.inner == groups[rank][1]


@pytest.mark.parametrize("tp", [1, 3])
def test_rank_shards_reassemble_the_full_weights(tp):
    model = tiny_model(**case_overrides(3)["hybrid"])
    dims, layout, state = ModelShape.from_config(model.config), model.config.layout, model.state_dict()
    ranks = [load_rank_weights(StateDictSource(state), dims, layout, tp, r) for r in range(tp)]
    hd, layer = dims.head_dim, 2  # layer 2 is SPD with a head order
    q_rows = torch.cat([w.layers[layer].qkv[: w.heads_local * hd] for w in ranks])
    q_heads = [h for r in range(tp) for h in layer_shard(dims, layout, layer, tp, r).q_heads]
    expected = state[f"model.layers.{layer}.self_attn.q_proj.weight"].view(dims.num_heads, hd, -1)[q_heads]
    assert torch.equal(q_rows, expected.reshape(-1, dims.hidden_size))
    down = torch.cat([w.layers[layer].down for w in ranks], dim=1)
    assert torch.equal(down, state[f"model.layers.{layer}.mlp.down_proj.weight"])
    o_cols = torch.cat([w.layers[layer].o for w in ranks], dim=1)
    assert torch.equal(o_cols, state[f"model.layers.{layer}.self_attn.o_proj.weight"].view(dims.hidden_size, dims.num_heads, hd)[:, q_heads].reshape(dims.hidden_size, -1))
    assert all(torch.equal(w.layers[layer].o_bias, state[f"model.layers.{layer}.self_attn.o_proj.bias"]) for w in ranks)


def _assert_disk_slices_equal_memory(path, model, tp: int, rank: int) -> None:
    """The rank's weights sliced from the safetensors files equal those cut from the in-memory state dict."""
    config = load_config(path)
    layout = config.layout
    dims = ModelShape.from_config(config)
    from_disk = load_rank_weights(SafetensorsSource(path), dims, layout, tp, rank)
    in_memory = load_rank_weights(StateDictSource(model.state_dict()), dims, layout, tp, rank)
    for a, b in zip(from_disk.layers, in_memory.layers):
        assert all(torch.equal(x, y) for x, y in zip(vars(a).values(), vars(b).values()) if x is not None)
    assert torch.equal(from_disk.lm_head, in_memory.lm_head)


def test_safetensors_slices_match_the_state_dict(tmp_path):
    model = save_tiny(tmp_path / "ckpt", **case_overrides(3)["spd"])
    _assert_disk_slices_equal_memory(tmp_path / "ckpt", model, tp=3, rank=1)


def test_plain_llama_checkpoint_reads_as_dense(tiny_llama_dir):
    from transformers import LlamaConfig

    config = load_config(tiny_llama_dir)  # the one config reader: every convertible architecture
    layout = config.layout
    assert layout.describe() == "dense"
    assert ModelShape.from_config(config) == ModelShape.from_config(LlamaConfig.from_pretrained(tiny_llama_dir))


@pytest.mark.parametrize("case", ["dense", "ladder", "hybrid", "hybrid2"])
@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("linear", ["auto", "onednn", "aten"])
def test_single_rank_matches_the_model(case, static, linear):
    overrides = dict(case_overrides(1)[case])
    model = tiny_model(**overrides)
    dims, layout = ModelShape.from_config(model.config), model.config.layout
    weights = load_rank_weights(StateDictSource(model.state_dict()), dims, layout, 1, 0)
    rank_model = RankModel(weights, model.config, Communicator(1), linear=linear)
    ids = torch.randint(3, TINY["vocab_size"], (2, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        reference = model(ids).logits
        decoder = Decoder(rank_model, build_plan(layout), 2, 16, static=static)
        pieces = [decoder.prefill(ids[:, :5], last_only=False), decoder.extend(ids[:, 5:8], 5, last_only=False)]
        pieces += [decoder.extend(ids[:, i : i + 1], i, last_only=False) for i in range(8, 11)]
    assert torch.allclose(torch.cat(pieces, 1), reference, atol=1e-4, rtol=0)


def test_validate_tp_messages():
    dims = ModelShape.from_config(tiny_model().config)  # 6 query heads, 3 KV heads
    with pytest.raises(LayoutError, match="TP degree 2 does not divide the model's 3 key/value heads"):
        validate_tp(dims, tiny_model().config.layout, 2)
    spd = tiny_model(**{**TINY_TP23, "layer_modes": ["dense", "spd", "spd", "dense"], "spd_tp_size": 3})
    dims = ModelShape.from_config(spd.config)
    with pytest.raises(LadderizeError, match="converted for TP=3.*--allow-spd-mismatch"):
        validate_tp(dims, spd.config.layout, 2)
    validate_tp(dims, spd.config.layout, 2, allow_spd_mismatch=True)
    validate_tp(dims, spd.config.layout, 3)


def test_sharded_checkpoint_with_index(tmp_path):
    model = tiny_model(**case_overrides(3)["hybrid"])
    model.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    _assert_disk_slices_equal_memory(tmp_path / "sharded", model, tp=3, rank=2)


def test_missing_checkpoint_is_one_line(tmp_path):
    with pytest.raises(LadderizeError, match="no config.json"):
        load_config(tmp_path)
    (tmp_path / "config.json").write_text('{"model_type": "gpt2"}')
    with pytest.raises(LadderizeError, match="unsupported architecture"):
        load_config(tmp_path)
