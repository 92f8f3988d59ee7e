"""convert_checkpoint: exact dense reproduction, layouts in the config, sharding, provenance, dtypes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, LlamaForCausalLM

from ladderize.checkpoint.architectures import expected_tensors
from ladderize.checkpoint.architectures import PROVENANCE_FILE
from ladderize.checkpoint.io import load_model, read_provenance
from ladderize.convert.conversion import convert_checkpoint
from ladderize.convert.sources import sha256_file
from ladderize.model import LadderLlamaForCausalLM
from tests.model.helpers import logits_without_ladderize

TOL = 1e-4


def _ids(vocab: int, shape=(2, 11), seed: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed))


def test_no_layers_changed_reproduces_llama(tiny_llama_dir: Path, tmp_path: Path) -> None:
    out = convert_checkpoint(str(tiny_llama_dir), tmp_path / "out")
    reference = LlamaForCausalLM.from_pretrained(tiny_llama_dir).eval()
    converted = AutoModelForCausalLM.from_pretrained(out).eval()
    assert isinstance(converted, LadderLlamaForCausalLM)
    ids = _ids(reference.config.vocab_size)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # left padding
    with torch.no_grad():
        for kwargs in ({}, {"attention_mask": mask}):
            diff = (reference(ids, **kwargs).logits - converted(ids, **kwargs).logits).abs().max().item()
            assert diff <= TOL, kwargs


def test_layout_lands_in_config_and_changes_function(tiny_llama_dir: Path, tmp_path: Path) -> None:
    dense = load_model(convert_checkpoint(str(tiny_llama_dir), tmp_path / "dense"))
    out = convert_checkpoint(str(tiny_llama_dir), tmp_path / "hybrid", ladder="-2:", spd="0:1", spd_tp_size=3)
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "ladder_llama"
    assert config["layer_modes"] == ["spd", "dense", "ladder", "ladder"]
    assert config["spd_tp_size"] == 3
    assert config["auto_map"]["AutoModelForCausalLM"] == "modeling_ladder_llama.LadderLlamaForCausalLM"
    for name in ("layout.py", "configuration_ladder_llama.py", "modeling_ladder_llama.py"):
        assert (out / name).is_file()
    hybrid = load_model(out)
    ids = _ids(dense.config.vocab_size)
    with torch.no_grad():
        assert (dense(ids).logits - hybrid(ids).logits).abs().max() > 1e-3
    # the weights themselves are untouched: conversion is a config edit
    for (name, a), (_, b) in zip(dense.state_dict().items(), hybrid.state_dict().items()):
        assert torch.equal(a, b), name


def test_sharded_output_and_sharded_source(tiny_llama_dir: Path, tmp_path: Path) -> None:
    sharded = convert_checkpoint(str(tiny_llama_dir), tmp_path / "sharded", max_shard_bytes=40_000)
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 2 and all((sharded / s).is_file() for s in shards)
    assert shards[0].startswith("model-00001-of-")
    config = json.loads((sharded / "config.json").read_text())
    names = set(index["weight_map"])
    assert names == set(expected_tensors(config))
    for shard in shards:
        with safe_open(str(sharded / shard), framework="pt") as handle:
            for name in handle.keys():
                assert torch.isfinite(handle.get_tensor(name)).all(), name
    # a sharded source converts again, to the same function
    again = convert_checkpoint(str(sharded), tmp_path / "again", ladder="1:3")
    a, b = load_model(sharded), load_model(again)
    for key, value in a.state_dict().items():
        assert torch.equal(value, b.state_dict()[key])


def test_provenance_records_source_ranges_version_and_hashes(tiny_llama_dir: Path, tmp_path: Path) -> None:
    import ladderize

    out = convert_checkpoint(str(tiny_llama_dir), tmp_path / "out", ladder="2:4", spd="0:1", spd_tp_size=3)
    record = read_provenance(out)
    assert (out / PROVENANCE_FILE).is_file()
    assert record["ladderize_version"] == ladderize.__version__
    assert record["layout"]["ladder"] == "2:4" and record["layout"]["spd"] == "0:1"
    assert record["layout"]["spd_tp_size"] == 3
    assert record["source"]["path"] == str(tiny_llama_dir)
    hashes = record["source"]["files_sha256"]
    assert hashes["model.safetensors"] == sha256_file(tiny_llama_dir / "model.safetensors")
    assert hashes["config.json"] == sha256_file(tiny_llama_dir / "config.json")


@pytest.mark.parametrize("dtype,expected", [("bfloat16", torch.bfloat16), ("float16", torch.float16)])
def test_dtype_conversion(tiny_llama_dir: Path, tmp_path: Path, dtype: str, expected: torch.dtype) -> None:
    out = convert_checkpoint(str(tiny_llama_dir), tmp_path / dtype, dtype=dtype)
    with safe_open(str(out / "model.safetensors"), framework="pt") as handle:
        assert {handle.get_tensor(n).dtype for n in handle.keys()} == {expected}
    model = load_model(out)
    assert model.dtype == expected
    assert json.loads((out / "config.json").read_text())["dtype"] == dtype


def test_force_replaces_existing_output(tiny_llama_dir: Path, tmp_path: Path) -> None:
    out = convert_checkpoint(str(tiny_llama_dir), tmp_path / "out", ladder="all")
    convert_checkpoint(str(tiny_llama_dir), out, spd="all", spd_tp_size=3, force=True)
    assert json.loads((out / "config.json").read_text())["layer_modes"] == ["spd"] * 4
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_remote_code_loads_without_ladderize(tiny_llama_dir: Path, tmp_path: Path) -> None:
    """Users without ladderize load the checkpoint through auto_map + trust_remote_code."""
    out = convert_checkpoint(str(tiny_llama_dir), tmp_path / "out", ladder="2:", spd="0:1", spd_tp_size=3)
    ids = _ids(128, (1, 7))
    with torch.no_grad():
        expected = load_model(out)(ids).logits
    assert (logits_without_ladderize(out, ids, tmp_path) - expected).abs().max() <= TOL


def test_auto_model_loads_the_base_model_with_and_without_ladderize(tiny_llama_dir: Path, tmp_path: Path) -> None:
    """``AutoModel`` gives the decoder without the head: registered with ladderize, and named in ``auto_map``
    for remote code; its hidden states are the causal LM's base model's."""
    import subprocess
    import sys

    from transformers import AutoModel

    from ladderize.model import LadderLlamaModel

    out = convert_checkpoint(str(tiny_llama_dir), tmp_path / "out", ladder="2:", spd="0:1", spd_tp_size=3)
    assert json.loads((out / "config.json").read_text())["auto_map"]["AutoModel"] == "modeling_ladder_llama.LadderLlamaModel"
    ids = _ids(128, (2, 7))
    base = AutoModel.from_pretrained(out).eval()
    assert type(base) is LadderLlamaModel
    with torch.no_grad():
        expected = load_model(out).model(ids).last_hidden_state
        assert torch.equal(base(ids).last_hidden_state, expected)
    torch.save(ids, tmp_path / "ids.pt")
    script = f"""
import sys
sys.modules["ladderize"] = None
import torch
from transformers import AutoModel
model = AutoModel.from_pretrained({str(out)!r}, trust_remote_code=True).eval()
assert type(model).__module__.startswith("transformers_modules") and type(model).__name__ == "LadderLlamaModel"
with torch.no_grad():
    torch.save(model(torch.load({str(tmp_path / 'ids.pt')!r})).last_hidden_state, {str(tmp_path / 'hidden.pt')!r})
"""
    env = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "PATH": "/usr/bin:/bin"}
    run = subprocess.run([sys.executable, "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert (torch.load(tmp_path / "hidden.pt") - expected).abs().max() <= TOL


def test_plain_llama_output_loads_without_ladderize(tiny_llama_dir, tmp_path):
    """``plain=True`` (what ``pull`` writes): model_type llama, no custom code, same function."""
    import json

    from transformers import AutoConfig, AutoModelForCausalLM, LlamaForCausalLM

    from ladderize.checkpoint.io import load_model
    from ladderize.convert.conversion import convert_checkpoint

    out = convert_checkpoint(str(tiny_llama_dir), tmp_path / "plain", plain=True)
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "llama" and config["architectures"] == ["LlamaForCausalLM"]
    assert "auto_map" not in config and "layer_modes" not in config
    assert not list(out.glob("*.py"))  # no modeling code travels with it
    assert AutoConfig.from_pretrained(out).model_type == "llama"
    ids = torch.randint(0, 128, (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        auto = AutoModelForCausalLM.from_pretrained(out).eval()
        assert type(auto) is LlamaForCausalLM
        source = LlamaForCausalLM.from_pretrained(tiny_llama_dir).eval()
        assert torch.equal(auto(ids).logits, source(ids).logits)
        assert (load_model(out)(ids).logits - source(ids).logits).abs().max() <= 1e-5  # ladderize reads it too


def test_plain_output_of_a_converted_layout_is_refused(tiny_llama_dir, tmp_path):
    from ladderize.convert.conversion import convert_checkpoint
    from ladderize.errors import LadderizeError

    with pytest.raises(LadderizeError, match="plain Llama checkpoint cannot hold"):
        convert_checkpoint(str(tiny_llama_dir), tmp_path / "x", ladder="2:4", plain=True)


def test_the_command_copies_dense_only_when_asked_and_a_converted_source_keeps_its_layout(
        tiny_llama_dir: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    """``convert SRC OUT --layout dense`` writes the unconverted copy (without it convert refuses:
    tests/cli/test_quick_refusals.py); a converted SRC with no layout option is copied with its own layout."""
    from tests.cli_helpers import run_cli

    code, _, err = run_cli(["convert", tiny_llama_dir, tmp_path / "dense", "--layout", "dense"], capsys, monkeypatch)
    assert code == 0, err
    assert json.loads((tmp_path / "dense" / "config.json").read_text())["layer_modes"] == ["dense"] * 4
    converted = convert_checkpoint(str(tiny_llama_dir), tmp_path / "ladder", ladder="2:")
    code, _, err = run_cli(["convert", converted, tmp_path / "again", "--dtype", "bfloat16"], capsys, monkeypatch)
    assert code == 0, err
    assert json.loads((tmp_path / "again" / "config.json").read_text())["layer_modes"] == ["dense"] * 2 + ["ladder"] * 2
