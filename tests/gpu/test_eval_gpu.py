"""eval on CUDA equals eval on the CPU on a tiny model (float32, TF32 off), and the model and scores sit on the GPU.
Skipped (with the reason) where torch sees no CUDA device."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ladderize.eval.harness import evaluate_checkpoint
from tests.eval.conftest import tiny_data_dir, tiny_dense_dir, tiny_ladder_dir  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

TASKS = ["lambada_openai", "wikitext2_valid"]


def _metrics(results: dict) -> dict:
    return {(t, k): v for t, values in results.items() for k, v in values.items()
            if isinstance(v, (int, float)) and "stderr" not in k}


@pytest.mark.parametrize("batch_size", [4, "auto"])
def test_eval_cuda_equals_cpu(tiny_ladder_dir: Path, tiny_data_dir: Path, batch_size):
    # the same batch size on both devices: lm-eval's rolling perplexity depends on which windows share a batch (its
    # one-token-continuation cache groups rows whose tokens but the last agree; the tiny data repeats its text), and
    # lm-eval's own HFLM moves with it (on the CPU, batch 4 and 16: byte perplexity 130.256 and 130.186); "auto" is
    # the largest batch on both devices for this tiny model
    torch.backends.cuda.matmul.allow_tf32 = False
    cpu = evaluate_checkpoint(tiny_ladder_dir, TASKS, limit=6, batch_size=batch_size, data_dir=tiny_data_dir, chunk_chars=300,
                              device="cpu")
    cuda = evaluate_checkpoint(tiny_ladder_dir, TASKS, limit=6, batch_size=batch_size, data_dir=tiny_data_dir, chunk_chars=300,
                               device="auto")
    assert cuda["device"].startswith("cuda") and cuda["dtype"] == "float32"
    expected, got = _metrics(cpu["results"]), _metrics(cuda["results"])
    assert got.keys() == expected.keys()
    for key in expected:
        assert got[key] == pytest.approx(expected[key], rel=1e-4), key
