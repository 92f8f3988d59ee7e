"""A layer mode added at test time, touching no product file: the mode table drives everything.

The toy mode ``lspd`` is SPD's math with a stale attention read (one row of traits, nothing else):
its attention reads r_{k-2} (the ladder slot) and drops its all-reduce; its MLP reads the block's
input X = r_{k-1} plus the rank's own attention partial, as SPD's does. Registered by monkeypatching
the mode table (``MODE_TRAITS`` and the ``LayerMode`` enum), it must show in labels and records, be
checked for head divisibility, be refused at a TP degree other than the converted one, and run in the
HF model exactly as the equations written out plainly below. docs/architecture.md ("Adding a layer
mode") lists the files a new mode touches; this test is the check that nothing else needs to.
"""

from __future__ import annotations

import json
import multiprocessing
from dataclasses import replace

import pytest
import torch

from ladderize.errors import LadderizeError
from ladderize.model.layout import MODE_TRAITS, LayerMode, Layout, LayoutError, described_layers
from ladderize.checkpoint.shapes import ModelShape
from ladderize.runtime.bench import _bench_job as _BENCH_JOB
from ladderize.runtime.tp_check import validate_tp
from tests.cli_helpers import run_cli
from tests.conftest import TINY, TINY_TP2, tiny_model
from tests.model.reference import Reference, rms_norm, rope_cos_sin

TOY = "lspd"
TOY_TRAITS = replace(MODE_TRAITS["spd"], reads_stale=True, card_meaning="SPD whose attention reads the stale residual",
                     option_help="Toy layers (SPD, stale attention read)", what_if="every layer the toy")


def register_toy_mode(monkeypatch: pytest.MonkeyPatch | None = None) -> LayerMode:
    """Add ``lspd`` to the mode table (undone by ``monkeypatch``; for ever in a rank process without one)."""
    if TOY in LayerMode._value2member_map_:
        return LayerMode(TOY)
    member = str.__new__(LayerMode, TOY)
    member._name_, member._value_, member._sort_order_ = TOY.upper(), TOY, len(LayerMode._member_names_)
    member.__objclass__ = LayerMode
    patch = monkeypatch or pytest.MonkeyPatch()
    patch.setitem(MODE_TRAITS, TOY, TOY_TRAITS)
    patch.setattr(LayerMode, "_member_names_", [*LayerMode._member_names_, TOY.upper()])
    patch.setitem(LayerMode._member_map_, TOY.upper(), member)
    patch.setitem(LayerMode._value2member_map_, TOY, member)
    return member


if multiprocessing.current_process().name != "MainProcess":  # a spawned rank unpickling its job, before its arguments
    register_toy_mode()


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> LayerMode:
    return register_toy_mode(monkeypatch)


def toy_layout(toy: LayerMode, tp: int = 2) -> Layout:
    return Layout((LayerMode.DENSE, toy, LayerMode.LADDER, toy), spd_tp_size=tp)


def test_the_toy_is_only_a_row(toy):
    assert LayerMode(TOY) is toy and toy in list(LayerMode) and toy.is_converted
    assert toy.allreduces_per_layer == 1 and toy.reads_stale_residual
    assert list(LayerMode)[:3] == [LayerMode.DENSE, LayerMode.LADDER, LayerMode.SPD]  # the table's order holds


def test_labels_and_records_include_it(toy):
    layout = toy_layout(toy)
    assert layout.describe() == "ladder 2:3 + lspd@tp2 1:2,3:4"
    assert layout.ranges() == {"ladder": "2:3", "spd": "none", "lspd": "1:2,3:4"}
    assert described_layers(layout.describe()) == {"ladder": [2], "lspd": [1, 3]}
    assert Layout.from_mode_ranges(4, {"ladder": "2:3", "lspd": "1:2,3"}, 2) == layout
    with pytest.raises(LayoutError, match="both spd and lspd"):
        Layout.from_mode_ranges(4, {"spd": "0:2", "lspd": "1:3"}, 2)
    config = tiny_model(**TINY_TP2, **layout.config_fields()).config
    assert Layout.from_config(config) == layout
    assert layout.tp_dependent_layers == [1, 3] and layout.head_split_layers == [1, 3]
    # the dense MLP, the first toy MLP and the ladder attention and MLP are each followed by a stale read
    assert layout.allreduces_per_token() == {"total": 6, "overlappable": 4}


def test_model_card_names_it(toy):
    from ladderize.checkpoint.card import model_card

    config = tiny_model(**TINY_TP2, **toy_layout(toy).config_fields()).config
    card = model_card(config, {}, "toy")
    assert "| 1:2 | lspd (TP 2) | SPD whose attention reads the stale residual |" in card
    assert "- sync-point-drop" in card and "only at `--tensor-parallel-size 2`" in card


def test_validate_checks_its_head_split(toy):
    layout = toy_layout(toy, tp=4)
    layout.validate(num_attention_heads=8, num_key_value_heads=4, intermediate_size=128)
    with pytest.raises(LayoutError, match="SPD TP degree 4 does not divide the model's 6 query heads"):
        layout.validate(num_attention_heads=6, num_key_value_heads=3, intermediate_size=96)


def test_validate_tp_refuses_another_degree(toy):
    shape = ModelShape("tiny", **{k: v for k, v in TINY_TP2.items() if k in ModelShape.__dataclass_fields__})
    layout = toy_layout(toy, tp=2)
    validate_tp(shape, layout, 2)
    with pytest.raises(LadderizeError, match="converted for TP=2: it needs --tp 2, not --tp 4"):
        validate_tp(shape, layout, 4)
    validate_tp(shape, layout, 4, allow_spd_mismatch=True)


class ToyReference(Reference):
    """The equations of a toy block, written plainly: with X = r_{k-1} and the stale S = r_{k-2},
    ``out = X + sum_r (Y_r + Z_r)``, ``Y_r = Attn_r(LN1(S)) @ W_O[:, cols_r]^T``, ``Z_r = MLP_r(LN2(X + Y_r))``;
    the block records r_{2i+1} = X (its attention adds nothing before the single all-reduce)."""

    @torch.no_grad()
    def __call__(self, input_ids: torch.Tensor) -> torch.Tensor:
        batch, seq = input_ids.shape
        key_ok = torch.ones(batch, seq, dtype=torch.bool)
        cos, sin = rope_cos_sin(torch.arange(seq).expand(batch, seq), self.head_dim, self.theta)
        r0 = self.w["model.embed_tokens.weight"][input_ids]
        r = [r0, r0]  # r[k + 1] = r_k, r_{-1} = r_0
        for layer, mode in enumerate(self.modes):
            if mode == TOY:
                x, stale = r[-1], r[-2]
                r += [x, self.toy_block(layer, x, stale, cos, sin, key_ok)]
                continue
            for kind in ("attention", "mlp"):
                source = r[-2] if mode == "ladder" else r[-1]
                if kind == "attention":
                    r.append(r[-1] + self.attention(layer, self.ln1(layer, source), cos, sin, key_ok))
                else:
                    r.append(r[-1] + self.mlp(layer, self.ln2(layer, source)))
        return rms_norm(r[-1], self.w["model.norm.weight"], self.eps) @ self.w["lm_head.weight"].T

    def toy_block(self, layer, x, stale, cos, sin, key_ok):
        n, group = self.spd_tp, self.num_heads // self.num_kv_heads
        kv_per_rank, inner = self.num_kv_heads // n, self.intermediate // n
        heads = self.attention_heads(layer, self.ln1(layer, stale), cos, sin, key_ok)  # [B, S, H, hd]
        w_o = self._p(layer, "self_attn.o_proj.weight")
        out = x
        for rank in range(n):
            q_heads = [h for h in range(self.num_heads) if h // group in range(rank * kv_per_rank, (rank + 1) * kv_per_rank)]
            cols = torch.tensor([h * self.head_dim + d for h in q_heads for d in range(self.head_dim)])
            y = heads[:, :, q_heads].flatten(2) @ w_o[:, cols].T
            out = out + y + self.mlp(layer, self.ln2(layer, x + y), slice(rank * inner, (rank + 1) * inner))
        return out


@pytest.mark.parametrize("modes", [(TOY,) * 4, ("dense", TOY, "ladder", TOY), (TOY, "ladder", TOY, "dense")])
def test_hf_model_matches_its_equations(toy, modes):
    model = tiny_model(seed=3, **TINY_TP2, layer_modes=list(modes), spd_tp_size=2)
    ids = torch.randint(3, TINY["vocab_size"], (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = model(ids).logits
    expected = ToyReference(model.state_dict(), model.config)(ids)
    torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-4)
    spd = tiny_model(seed=3, **TINY_TP2, layer_modes=["spd" if m == TOY else m for m in modes], spd_tp_size=2)
    with torch.no_grad():
        assert not torch.allclose(spd(ids).logits, logits, atol=1e-3)  # the stale read matters


def test_inspect_reports_it(toy, tmp_path):
    from ladderize.convert.inspect import inspect_checkpoint

    model = tiny_model(seed=1, **TINY_TP2, **toy_layout(toy).config_fields())
    model.save_pretrained(tmp_path / "toy")
    info = inspect_checkpoint(tmp_path / "toy")
    assert info["layout"] == "ladder 2:3 + lspd@tp2 1:2,3:4"
    assert [entry["mode"] for entry in info["layers"]] == ["dense", TOY, "ladder", TOY]
    assert info["allreduces_per_token"] == {"total": 6, "overlappable": 4}
    json.dumps(info, default=str)


def _serve_with_toy(context, requests, options):
    """A rank's job (its module registered the toy mode in the spawned rank on import): the runtime's own serving."""
    from ladderize.runtime.generate import _serve

    return _serve(context, requests=requests, options=options)


@pytest.mark.parametrize("comm", ["shm", "gloo"])
def test_tp2_runtime_matches_the_hf_model(toy, tmp_path, comm):
    """TP=2 ranks on the CPU reproduce the single-device HF model's logits (scored in pieces: prefill and cached decode)."""
    import functools

    from ladderize.runtime.generate import Request, RuntimeOptions
    from ladderize.runtime.launch import LaunchSpec, run_ranks

    path = tmp_path / "toy"
    model = tiny_model(seed=5, **TINY_TP2, **toy_layout(toy).config_fields())
    model.save_pretrained(path)
    ids = torch.randint(3, TINY["vocab_size"], (2, 8), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = model(ids).logits.numpy()
    request = Request(str(path), tuple(tuple(row) for row in ids.tolist()), score_pieces=(5, 2, 1))
    job = functools.partial(_serve_with_toy, requests=(request,), options=RuntimeOptions())
    (response,) = run_ranks(job, LaunchSpec(tp=2, oversubscribe=True, comm=comm))
    assert response.allreduces_per_forward == 6
    assert abs(response.logits - expected).max() <= 1e-4


def test_convert_writes_it(toy, tiny_llama_dir, tmp_path):
    """``convert_checkpoint`` given the layout writes the toy mode into config and provenance; the model loads it."""
    from ladderize.convert.conversion import convert_checkpoint
    from ladderize.checkpoint.io import load_model, read_provenance

    layout = toy_layout(toy, tp=3)
    out = convert_checkpoint(str(tiny_llama_dir), tmp_path / "out", layout=layout)
    model = load_model(out)
    assert model.layout == layout
    assert read_provenance(out)["layout"]["describe"] == "ladder 2:3 + lspd@tp3 1:2,3:4"
    with pytest.raises(LayoutError, match="SPD TP degree 2 does not divide"):
        convert_checkpoint(str(tiny_llama_dir), tmp_path / "bad", layout=toy_layout(toy, tp=2))


def test_predict_prices_it(toy):
    """Predict's layout schedule runs the toy's program: SPD's all-reduce count, and no slower than all-SPD
    (the stale read lets more all-reduces overlap); at another TP degree the row says its outputs differ."""
    from ladderize.predict import PredictRequest, RooflineCompute, load_model_shape, predict
    from ladderize.predict.gpus import GPU_PROFILES
    from ladderize.predict.interconnect import PROFILES

    shape = load_model_shape("llama-3.1-70b")
    layout = Layout((toy,) * shape.num_hidden_layers, spd_tp_size=8)
    request = PredictRequest(shape, (4, 8), (1,), 1024, 512, PROFILES["h100-nvlink"], layout=layout,
                             schedules=("dense", "spd", "layout"))
    prediction = predict(request, RooflineCompute(GPU_PROFILES["h100"]))
    rows = {(r.tp, r.schedule): r for r in prediction.rows}
    assert rows[8, "layout"].allreduces_per_decode_step == rows[8, "spd"].allreduces_per_decode_step == 80
    assert rows[8, "layout"].e2e_speedup_vs_dense >= rows[8, "spd"].e2e_speedup_vs_dense > 1.0
    assert "converted for TP=8" in rows[4, "layout"].note and not rows[8, "layout"].note
    assert prediction.to_record().to_json()["layout"]["describe"] == "lspd@tp8 0:80"


def _bench_with_toy(context, source, spec, options):
    """A bench rank's job (its module registered the toy mode in the spawned rank on import): the bench's own job."""
    return _BENCH_JOB(context, source=source, spec=spec, options=options)


def test_bench_labels_and_refuses_it(toy, monkeypatch, tmp_path):
    """``run_bench`` at the converted degree (TP=2 ranks) labels its record and rows with the toy; TP 1 is refused;
    a report reads the record's label back (its converted layers from the label when the meta lacks them)."""
    from ladderize.report.collect import collect_runs

    from ladderize.runtime import bench
    from ladderize.runtime.launch import LaunchSpec

    monkeypatch.setattr(bench, "_bench_job", _bench_with_toy)  # pickled by name: the ranks import this module
    source = bench.ModelSource(synthetic=dict(bench.SYNTHETIC_CONFIGS["tiny"]), synthetic_name="tiny", layout_override=toy_layout(toy))
    spec = bench.BenchSpec(("native",), (1,), prompt_len=4, gen_len=2, warmup=0, repeats=1)
    with pytest.raises(LadderizeError, match="converted for TP=2: it needs --tp 2, not --tp 1"):
        bench.run_bench(source, [1], spec, LaunchSpec(tp=1))
    record = bench.run_bench(source, [2], spec, LaunchSpec(tp=2, oversubscribe=True, comm="shm"))
    assert record.layout == "ladder 2:3 + lspd@tp2 1:2,3:4"
    (row,) = record.rows
    assert row.layout == record.layout and row.allreduces_per_decode_step == 6
    assert record.meta["layers_converted"] == 3
    saved = record.to_json()
    del saved["meta"]["layers_converted"]
    (tmp_path / "bench.json").write_text(json.dumps(saved))
    (run,) = collect_runs([tmp_path / "bench.json"])
    assert run.label == "ladder 2:3 + lspd@tp2 1:2,3:4" and run.layers_converted == 3 and not run.is_dense


def test_cli_gives_it_options(toy, capsys, monkeypatch):
    """convert, bench and predict each get ``--lspd`` (convert also ``--lspd-budget``) from the row, help from its
    ``option_help``; the old options keep their place and words."""
    monkeypatch.setenv("COLUMNS", "400")  # one help line per option
    for command, expected in (("convert", ["--ladder", "--spd", "--lspd", "--lspd-budget"]),
                              ("bench", ["--ladder", "--spd", "--lspd"]), ("predict", ["--ladder", "--spd", "--lspd"])):
        code, out, err = run_cli([command, "--help"], capsys, monkeypatch)
        assert code == 0, err
        flags = [line.split()[1] for line in out.splitlines() if line.startswith("│ --")]
        assert [flag for flag in flags if flag in expected] == expected, (command, flags)
        toy_line = next(line for line in out.splitlines() if line.startswith("│ --lspd "))
        assert "Toy layers (SPD, stale attention read), same syntax." in toy_line
    code, out, _ = run_cli(["convert", "--help"], capsys, monkeypatch)
    assert f"With --lspd auto: {toy.budget_help}." in out
    assert "Layers converted to Ladder Residual: '16:32'" in out


def test_cli_converts_with_it_and_the_recipe_has_its_rate(toy, tiny_llama_dir, tmp_path, capsys, monkeypatch):
    """``convert --lspd`` writes the toy layout (its TP degree from ``--spd-tp``: the mode is TP-dependent, and
    refused without one, in its own name); the recipe finds the row's learning rates, or the first row's without."""
    from ladderize.adapt.plan.config import AdaptConfig
    from ladderize.adapt.plan.settings_sections import ObjectiveSettings, SequentialSettings
    from ladderize.adapt.plan.stages import load_recipe, measured_lr, resolve_stages
    from ladderize.checkpoint.io import read_provenance

    out = tmp_path / "toy"
    code, _, err = run_cli(["convert", tiny_llama_dir, out, "--ladder", "2:3", "--lspd", "1:2,3", "--device", "cpu"],
                           capsys, monkeypatch)
    assert code == 2 and "--lspd needs --spd-tp N" in err
    code, _, err = run_cli(["convert", tiny_llama_dir, out, "--ladder", "2:3", "--lspd", "1:2,3", "--spd-tp", "3",
                            "--device", "cpu"], capsys, monkeypatch)
    assert code == 0, err
    assert read_provenance(out)["layout"]["describe"] == "ladder 2:3 + lspd@tp3 1:2,3:4"
    code, _, err = run_cli(["convert", tiny_llama_dir, tmp_path / "x", "--lspd", "0:2", "--spd-tp", "3",
                            "--lspd-budget", "3"], capsys, monkeypatch)
    assert code == 2 and "--lspd-budget chooses the layers of --lspd auto" in err
    # its row's rates (the toy copies SPD's), the smallest of a layout's modes
    rates = TOY_TRAITS.learning_rates
    assert [stage.resolved.optimizer.lr for stage in resolve_stages(load_recipe("best"), str(out))] == [
        min(rates["sequential"], MODE_TRAITS["ladder"].learning_rates["sequential"]),
        min(rates["kd"], MODE_TRAITS["ladder"].learning_rates["kd"])]
    monkeypatch.setitem(MODE_TRAITS, TOY, replace(TOY_TRAITS, learning_rates={}))  # a row without measured rates
    sequential = AdaptConfig(sequential=SequentialSettings(local_schedule="sequential"))
    assert measured_lr(sequential, {TOY}) == MODE_TRAITS["ladder"].learning_rates["sequential"]
    assert measured_lr(AdaptConfig(objective=ObjectiveSettings(objectives="kd")), {TOY, "spd"}) == MODE_TRAITS["spd"].learning_rates["kd"]


def test_cli_bench_and_predict_take_it(toy, tmp_path, capsys, monkeypatch):
    """``bench --synthetic --lspd`` hands the runtime the toy layout (at the first --tp by default); ``predict --lspd``
    prices it as the 'layout' schedule, and the toy's whole-model what-if is one of predict's schedules."""
    from ladderize.runtime import bench

    seen = []
    monkeypatch.setattr(bench, "run_bench", lambda source, *args, **kwargs: seen.append(source))  # None: rank 0 prints
    code, _, err = run_cli(["bench", "--synthetic", "tiny", "--tp", "2", "--batch", "1", "--lspd", "1:2", "--ladder", "3",
                            "--device", "cpu", "--oversubscribe"], capsys, monkeypatch)
    assert code == 0, err
    assert seen[0].layout_override.describe() == "ladder 3:4 + lspd@tp2 1:2"

    record = tmp_path / "predict.json"
    code, _, err = run_cli(["predict", "--model", "llama-3.1-70b", "--tp", "8", "--batch", "1", "--lspd", "all",
                            "--compute", "roofline", "--json", record], capsys, monkeypatch)
    assert code == 0, err
    saved = json.loads(record.read_text())
    assert saved["layout"]["describe"] == "lspd@tp8 0:80" and saved["layout"]["lspd"] == "0:80"
    assert list(saved["schedules"]) == ["dense", "ladder", "spd", TOY, "domino", "upper-bound", "layout"]
    assert saved["schedules"][TOY] == "every layer the toy"
    rows = {row["schedule"]: row for row in saved["rows"]}
    assert rows[TOY]["allreduces_per_decode_step"] == rows["layout"]["allreduces_per_decode_step"] == 80


def test_architecture_doc_lists_what_this_test_touched():
    """docs/architecture.md's list of files a new mode touches starts with the mode table, the only file whose
    objects this test patches; the others are conditional ("only if"), and the doc names this test."""
    from pathlib import Path

    doc = (Path(__file__).parents[2] / "docs" / "architecture.md").read_text()
    section = doc.split("## Adding a layer mode", 1)[1].split("\n## ", 1)[0]
    items = [line for line in section.splitlines() if line[:3] in {f"{n}. " for n in range(1, 10)}]
    assert items[0].startswith("1. `model/layout.py`") and all("only if" in item for item in items[1:])
    assert LayerMode.__module__ == "ladderize.model.layout" and "tests/model/test_toy_mode.py" in section
