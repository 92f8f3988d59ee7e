"""Bad input to ``ladderize convert``: one readable line, exit code 2, and no OUT left behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from tests.cli_helpers import error_lines, run_cli


def _assert_clean_failure(code: int, err: str, out: Path, pattern: str) -> None:
    lines = error_lines(err)
    assert code == 2
    assert len(lines) == 1, err
    assert lines[0].startswith("error:") and pattern in lines[0], lines[0]
    assert "Traceback" not in err
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")]  # no temp dirs


def test_non_llama_checkpoint(tmp_path: Path, capsys, monkeypatch) -> None:
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50)).save_pretrained(tmp_path / "gpt2")
    out = tmp_path / "out"
    code, _, err = run_cli(["convert", tmp_path / "gpt2", out], capsys, monkeypatch)
    _assert_clean_failure(code, err, out, "unsupported architecture 'GPT2LMHeadModel'")


@pytest.mark.parametrize(
    "flags,pattern",
    [
        (["--ladder", "2:9"], "outside the model's 4 layers"),
        (["--spd", "-6:", "--spd-tp", "3"], "outside the model's 4 layers"),
        (["--ladder", "3:1"], "selects no layers"),
        (["--ladder", "1:3", "--spd", "2:4", "--spd-tp", "3"], "both ladder and spd"),
        (["--ladder", "x:y"], "cannot parse layer range"),
        (["--spd", "all", "--spd-tp", "4"], "SPD TP degree 4 does not divide the model's 6 query heads"),
        (["--spd", "all", "--spd-tp", "2"], "SPD TP degree 2 does not divide the model's 3 key/value heads"),
        (["--dtype", "int8"], "unknown dtype"),
        (["--spd", "0:3", "--spd-tp", "3", "--spd-budget", "8"], "--spd-budget chooses the layers of --spd auto"),
        (["--ladder", "2:4", "--ladder-budget", "0.05"], "--ladder-budget chooses the layers of --ladder auto"),
        (["--ladder", "2:4", "--sensitivity", "report.json"], "--sensitivity is read by --ladder auto or --spd auto only"),
    ],
)
def test_bad_layout(tiny_llama_dir: Path, tmp_path: Path, capsys, monkeypatch, flags, pattern) -> None:
    out = tmp_path / "out"
    code, _, err = run_cli(["convert", tiny_llama_dir, out, *flags], capsys, monkeypatch)
    _assert_clean_failure(code, err, out, pattern)


def test_missing_source(tmp_path: Path, capsys, monkeypatch) -> None:
    out = tmp_path / "out"
    code, _, err = run_cli(["convert", tmp_path / "nope", out], capsys, monkeypatch)
    _assert_clean_failure(code, err, out, "does not exist")


def test_hub_id_offline(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "out"
    code, _, err = run_cli(["convert", "no-such-org/no-such-model", out, "--ladder", "2:4"], capsys, monkeypatch)
    _assert_clean_failure(code, err, out, "source no-such-org/no-such-model is not a local path, and with the hub offline")


@pytest.mark.parametrize("damage", ["weights", "config", "no-config", "pickle-only", "gguf"])
def test_corrupt_source(tiny_llama_dir: Path, tmp_path: Path, capsys, monkeypatch, damage: str) -> None:
    src = tiny_llama_dir
    if damage == "weights":
        (src / "model.safetensors").write_bytes(b"\x00\x01garbage" * 10)
        pattern = "corrupt safetensors file"
    elif damage == "config":
        (src / "config.json").write_text("{not json")
        pattern = "cannot read"
    elif damage == "no-config":
        (src / "config.json").unlink()
        pattern = "has no config.json"
    elif damage == "pickle-only":
        (src / "model.safetensors").unlink()
        torch.save({"x": torch.zeros(1)}, src / "pytorch_model.bin")
        pattern = "ladderize loads safetensors only, never pickles"
    else:
        src = tmp_path / "broken.gguf"
        src.write_bytes(b"GGUF-but-not-really")
        pattern = "cannot read GGUF file"
    out = tmp_path / "out"
    code, _, err = run_cli(["convert", src, out, "--ladder", "2:4"], capsys, monkeypatch)
    _assert_clean_failure(code, err, out, pattern)


def test_missing_tensor(tiny_llama_dir: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    from safetensors.torch import load_file, save_file

    weights = load_file(tiny_llama_dir / "model.safetensors")
    del weights["model.layers.1.mlp.up_proj.weight"]
    save_file(weights, tiny_llama_dir / "model.safetensors", metadata={"format": "pt"})
    out = tmp_path / "out"
    code, _, err = run_cli(["convert", tiny_llama_dir, out, "--layout", "dense"], capsys, monkeypatch)
    _assert_clean_failure(code, err, out, "missing tensor model.layers.1.mlp.up_proj.weight")


def test_existing_output_needs_force(tiny_llama_dir: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    code, _, err = run_cli(["convert", tiny_llama_dir, out], capsys, monkeypatch)
    assert code == 2 and "already exists; pass --force" in error_lines(err)[0]
    assert (out / "keep.txt").read_text() == "precious"
    code, _, _ = run_cli(["convert", tiny_llama_dir, out, "--force", "--ladder", "all"], capsys, monkeypatch)
    assert code == 0 and not (out / "keep.txt").exists()
    assert json.loads((out / "config.json").read_text())["layer_modes"] == ["ladder"] * 4
