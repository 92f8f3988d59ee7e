"""Equality with a direct lm-eval run on the real SmolLM2-135M: lambada_openai, --limit 100 (slow)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .test_eval import _metrics, direct_lm_eval

LIMIT = 100


@pytest.mark.slow
def test_smollm2_lambada_equals_direct_lm_eval(tmp_path: Path, bundled_data_dir: Path):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from ladderize.convert.pull import pull_model
    from ladderize.eval.harness import evaluate_checkpoint, load_tokenizer

    torch.set_num_threads(max(1, torch.get_num_threads()))
    data = bundled_data_dir  # the first 100 LAMBADA passages, shipped with the tests
    assert len((data / "lambada_openai" / "lambada_test.jsonl").read_text().splitlines()) == LIMIT
    dense = pull_model("smollm2-135m")
    ours = evaluate_checkpoint(dense, "lambada_openai", limit=LIMIT, batch_size=16, data_dir=data)
    assert ours["layout"] == "dense" and ours["results"]["lambada_openai"]["sample_len"] == LIMIT

    # transformers' own LlamaForCausalLM on the same weights (the checkpoint's config minus the ladderize fields)
    raw = json.loads((dense / "config.json").read_text())
    for key in ("layer_modes", "spd_tp_size", "spd_head_order", "auto_map", "architectures", "model_type"):
        raw.pop(key, None)
    reference = LlamaForCausalLM.from_pretrained(str(dense), config=LlamaConfig(**raw)).eval()
    direct = direct_lm_eval(reference, load_tokenizer(dense), ["lambada_openai"], data, tmp_path, limit=LIMIT, batch_size=16)

    ours_metrics, direct_metrics = _metrics(ours["results"]), _metrics(direct)
    print("ours:", ours["results"]["lambada_openai"], "\ndirect:", direct["lambada_openai"])
    assert ours_metrics.keys() == direct_metrics.keys()
    for key, value in direct_metrics.items():
        assert ours_metrics[key] == pytest.approx(value, rel=1e-6), key
    # a sanity floor for a trained model (these Q4_1-dequantized weights score 0.30 on the first 100)
    assert ours["results"]["lambada_openai"]["acc,none"] > 0.2
