"""eval on the device, the lm-eval way: device/dtype/batch size reach HFLM, the CPU path keeps its results, and
``accelerate launch`` with two processes (gloo) splits the requests as lm-eval's data-parallel mode and gives the
results of one process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ladderize.errors import LadderizeError
from ladderize.eval.harness import evaluate_checkpoint, parse_batch_size
from ladderize.checkpoint.io import load_model
from ladderize.checkpoint.placement import eval_dtype

TASKS = ["lambada_openai", "wikitext2_valid"]
# 3 documents each over 2 ranks (2 + 1: lm-eval pads rank 1's requests); the tiny wikitext file is 1 document, too few
DP_TASKS = ["lambada_openai", "shakespeare"]


def _metrics(results: dict) -> dict:
    return {(t, k): v for t, values in results.items() for k, v in values.items()
            if isinstance(v, (int, float)) and "stderr" not in k}


def test_parse_batch_size():
    assert parse_batch_size(8) == 8 and parse_batch_size("16") == 16
    assert parse_batch_size("auto") == "auto" and parse_batch_size("AUTO:4") == "auto:4"
    for bad in ("0", "-2", "eight", "auto:", "auto:x", "1.5"):
        with pytest.raises(LadderizeError, match="--batch-size must be a positive integer, auto or auto:N"):
            parse_batch_size(bad)


def test_eval_dtype_is_the_checkpoints_own(tiny_ladder_dir: Path):
    assert eval_dtype("auto") is None and eval_dtype(None) is None and eval_dtype("bf16") == torch.bfloat16
    model = load_model(tiny_ladder_dir, dtype=eval_dtype("auto"), device="cpu")
    stored = json.loads((tiny_ladder_dir / "config.json").read_text()).get("dtype", "float32")
    assert str(model.dtype).removeprefix("torch.") == stored


def test_device_map_load_equals_plain_load(tiny_ladder_dir: Path):
    """``load_model`` on an accelerator reads the weights straight onto it (``device_map``); that path, taken here to the
    CPU, gives the same model as the plain load."""
    from ladderize.model import LadderLlamaForCausalLM
    from ladderize.checkpoint.io import load_config

    plain = load_model(tiny_ladder_dir, device="cpu")
    mapped = LadderLlamaForCausalLM.from_pretrained(str(tiny_ladder_dir), config=load_config(tiny_ladder_dir), dtype="auto",
                                                    use_safetensors=True, device_map={"": "cpu"})
    a, b = plain.state_dict(), mapped.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_cpu_eval_records_placement_and_equals_the_default(tiny_ladder_dir: Path, tiny_data_dir: Path):
    """``--device cpu`` is today's path and the record says where; ``--batch-size auto`` runs lm-eval's search (on the
    CPU nothing runs out of memory, so it settles on max_batch_size, 64) and scores as that batch size does."""
    cpu = evaluate_checkpoint(tiny_ladder_dir, TASKS, limit=4, batch_size=64, data_dir=tiny_data_dir, chunk_chars=300, device="cpu")
    assert cpu["device"] == "cpu" and cpu["dtype"] == "float32" and cpu["processes"] == 1 and cpu["batch_size"] == 64
    auto = evaluate_checkpoint(tiny_ladder_dir, TASKS, limit=4, batch_size="auto", data_dir=tiny_data_dir, chunk_chars=300)
    assert auto["batch_size"] == "auto" and auto["device"] == "cpu"  # --device auto without CUDA
    assert _metrics(auto["results"]) == _metrics(cpu["results"])


def test_two_process_accelerate_launch_equals_one_process(tiny_ladder_dir: Path, tiny_data_dir: Path, tmp_path: Path):
    """lm-eval's data-parallel mode on our model instance: rank r scores documents r, r+2, ...; rank 0 gathers the
    metrics and alone writes the record, equal to one process's (the per-document scores are the same numbers; the
    means are summed in another order)."""
    out = tmp_path / "two.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
           "ACCELERATE_CONFIG_FILE": str(tmp_path / "no-config.yaml")}  # never read a user's accelerate config
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
              "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "0",
              "-m", "ladderize.cli", "eval", str(tiny_ladder_dir), "--tasks", ",".join(DP_TASKS), "--limit", "3",
              "--batch-size", "2", "--data-dir", str(tiny_data_dir), "--device", "cpu", "--json", str(out)]
    done = subprocess.run(launch, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("wrote ") == 1  # rank 0 alone reports
    two = json.loads(out.read_text())
    assert two["processes"] == 2 and two["device"] == "cpu"
    one = evaluate_checkpoint(tiny_ladder_dir, DP_TASKS, limit=3, batch_size=2, data_dir=tiny_data_dir, device="cpu")
    assert two["results"]["lambada_openai"]["sample_len"] == 3 == one["results"]["lambada_openai"]["sample_len"]
    expected, got = _metrics(one["results"]), _metrics(two["results"])
    assert got.keys() == expected.keys()
    for key in expected:
        assert got[key] == pytest.approx(expected[key], rel=1e-6), key
