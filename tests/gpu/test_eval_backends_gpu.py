"""eval's other engines on CUDA: ``--backend vllm --tp 2`` and ``--backend hf --parallelize`` give the metrics of
HFLM on one GPU, on a model of Llama-3-8B's layer shape (4 layers: the width, heads and vocabulary are what matter
to the kernels). Skipped (with the reason) without two CUDA devices, or without vLLM for the vLLM case."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest
import torch

from ladderize.eval.backends import EngineChoice
from ladderize.eval.harness import evaluate_checkpoint
from tests.eval.conftest import tiny_data_dir  # noqa: F401  (fixture)

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")]

SHAPE_8B = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=4, num_attention_heads=32,
                num_key_value_heads=8, head_dim=128, max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=500000.0,
                tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2)
TASKS = "lambada_openai,wikitext2_valid"
LL_RTOL, PPL_RTOL = 1e-3, 5e-3  # float32 on both; rolling windows of 2046 (vLLM) vs 2048 (HFLM) tokens


@pytest.fixture(scope="module")
def hybrid_8b_shape(tmp_path_factory) -> Path:
    """Random weights, float32: SPD layer 0 for TP 2, dense 1, ladder 2:4."""
    from ladderize.model import LadderLlamaConfig, LadderLlamaForCausalLM
    from ladderize.synthetic import char_tokenizer

    path = tmp_path_factory.mktemp("eval-8b-shape") / "hybrid"
    torch.manual_seed(0)
    config = LadderLlamaConfig(**SHAPE_8B, layer_modes=["spd", "dense", "ladder", "ladder"], spd_tp_size=2,
                               initializer_range=0.02)
    with torch.device("cuda"):
        model = LadderLlamaForCausalLM(config).eval()
    model.save_pretrained(path)
    char_tokenizer().save_pretrained(path)
    return path


def _metrics(results: dict) -> dict:
    return {(t, k): v for t, values in results.items() for k, v in values.items()
            if isinstance(v, (int, float)) and "stderr" not in k}


def _close(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for key, value in want.items():
        rel = PPL_RTOL if key[0] == "wikitext2_valid" else LL_RTOL
        assert got[key] == pytest.approx(value, rel=rel), key


@pytest.mark.skipif(find_spec("vllm") is None, reason="needs vLLM (pip install 'ladderize[vllm]')")
def test_vllm_tp2_equals_hflm(hybrid_8b_shape, tiny_data_dir, tmp_path):
    torch.backends.cuda.matmul.allow_tf32 = False
    hf = evaluate_checkpoint(hybrid_8b_shape, TASKS, limit=6, batch_size=4, data_dir=tiny_data_dir, max_length=2048,
                             dtype="float32", device="cuda")
    out = tmp_path / "vllm.json"
    done = subprocess.run([sys.executable, "-m", "ladderize.cli", "eval", str(hybrid_8b_shape), "--tasks", TASKS, "--limit", "6",
                           "--batch-size", "4", "--data-dir", str(tiny_data_dir), "--max-length", "2048", "--dtype", "float32",
                           "--backend", "vllm", "--tp", "2", "--json", str(out)], capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-4000:]
    vllm = json.loads(out.read_text())
    assert (vllm["backend"], vllm["tensor_parallel_size"], vllm["device"]) == ("vllm", 2, "cuda")
    _close(_metrics(vllm["results"]), _metrics(hf["results"]))
    print(f"eval seconds: HFLM {hf['eval_s']}, vLLM TP 2 {vllm['eval_s']} ({hf['eval_s'] / vllm['eval_s']:.2f}x)")


def test_parallelize_equals_one_device(hybrid_8b_shape, tiny_data_dir):
    torch.backends.cuda.matmul.allow_tf32 = False
    common = dict(limit=6, batch_size=4, data_dir=tiny_data_dir, max_length=2048, dtype="float32")
    one = evaluate_checkpoint(hybrid_8b_shape, TASKS, device="cuda", **common)
    spread = evaluate_checkpoint(hybrid_8b_shape, TASKS, **common, engine=EngineChoice(parallelize=True))
    assert spread["parallelize"] and spread["device"].startswith("device map over")
    _close(_metrics(spread["results"]), _metrics(one["results"]))

