"""End to end on the real SmolLM2-135M-Instruct (slow): a converted hybrid at TP=3, and greedy text vs transformers."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from ladderize.runtime.generate import Request, run_requests
from ladderize.runtime.launch import LaunchSpec

pytestmark = pytest.mark.slow


def test_converted_hybrid_at_tp3_matches_the_model(smollm2_dir: Path, tmp_path: Path) -> None:
    from ladderize.checkpoint.io import load_model
    from ladderize.convert.conversion import convert_checkpoint

    out = convert_checkpoint(str(smollm2_dir), tmp_path / "hybrid", ladder="24:30", spd="16:24", spd_tp_size=3)
    ids = torch.randint(0, 49152, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        reference = load_model(out).eval()(ids).logits.numpy()
    (response,) = run_requests(
        [Request(str(out), tuple(map(tuple, ids.tolist())), score_pieces=(8, 2, 1, 1))], LaunchSpec(tp=3, oversubscribe=True)
    )
    assert np.abs(response.logits - reference).max() <= 1e-4


def test_generate_cli_matches_transformers_generate(smollm2_dir: Path, monkeypatch, capsys) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ladderize import cli

    prompt = "The capital of France is"
    monkeypatch.setattr(
        sys, "argv", ["ladderize", "generate", str(smollm2_dir), "--prompt", prompt, "--max-new-tokens", "12", "--tp", "3",
                      "--oversubscribe", "--json"],
    )
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    assert not exit_info.value.code
    result = json.loads(capsys.readouterr().out)
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir).eval()
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        expected = model.generate(ids, max_new_tokens=12, do_sample=False)[0, ids.shape[1] :].tolist()
    assert result["tokens"] == expected
    assert result["text"] == tokenizer.decode(expected, skip_special_tokens=True)
