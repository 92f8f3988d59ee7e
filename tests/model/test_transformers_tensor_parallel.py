"""transformers' own tensor parallelism (``from_pretrained(tp_plan="auto")``) on ladderize's model: a ladder
checkpoint computes what it computes on one device; a layout with SPD layers is refused in one line that names
ladderize's runtime, because transformers' plan all-reduces every attention output that SPD keeps local."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers.distributed import DistributedConfig

from ladderize.model import LadderLlamaForCausalLM, Layout, LayoutError
from ladderize.model.modeling_ladder_llama import check_transformers_tensor_parallel
from ladderize.runtime.launch import free_port
from tests.conftest import TINY_TP2, tiny_model

from .helpers import HYBRID, LADDER, LADDER_UPPER, max_diff, token_ids

ROOT = Path(__file__).resolve().parents[2]
LADDER_BOTH_WAYS = dict(layer_modes=["dense", "ladder", "ladder", "dense"])  # dense -> ladder -> dense
SPD_HYBRID_TP2 = dict(layer_modes=["dense", "spd", "ladder", "spd"], spd_tp_size=2)


def _assert_refusal(message: str) -> None:
    assert "\n" not in message and message.startswith("transformers' tensor parallelism (tp_plan) cannot run")
    assert "ladderize bench" in message and "ladderize.runtime" in message, message


def test_spd_layouts_are_refused_in_one_line_where_transformers_resolves_its_plan():
    """transformers resolves the model's plans after building it and before reading any weight: a layout with SPD
    layers is refused there at 2 ranks, not at 1 (no tensor parallelism: SPD computed exactly); ladder is not."""
    model = tiny_model(**{**TINY_TP2, **SPD_HYBRID_TP2})
    with pytest.raises(LayoutError) as refused:
        model._resolve_parallel_plans(DistributedConfig(tp_size=2))
    _assert_refusal(str(refused.value))
    assert "layers 1:2,3:4 " in str(refused.value)  # the layers whose attention output stays local
    model._resolve_parallel_plans(DistributedConfig(tp_size=1))
    layout = Layout.from_config(tiny_model(**HYBRID).config)
    with pytest.raises(LayoutError):
        check_transformers_tensor_parallel(layout, 3)  # at the degree it was converted for too
    for ladder in (LADDER, LADDER_UPPER):
        check_transformers_tensor_parallel(Layout.from_config(tiny_model(**ladder).config), 2)


def test_transformers_plan_of_a_ladder_model_shards_the_tied_pair_on_the_vocabulary():
    model = tiny_model(**{**TINY_TP2, **LADDER_BOTH_WAYS, "tie_word_embeddings": True})
    tp_plan, _, _ = model._resolve_parallel_plans(DistributedConfig(tp_size=2))
    assert tp_plan["model.embed_tokens.weight"] == "embedding_rowwise"
    assert tp_plan["lm_head.weight"] == "colwise_gather_output"  # both Shard(0) of the [vocab, hidden] weight
    assert tp_plan["model.layers.1.self_attn.o_proj"] == "rowwise"


def _run_group(command: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """``command`` in a session of its own, the whole session killed past ``timeout`` (torchrun and its workers)."""
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        pytest.fail(f"torchrun ran past {timeout} s: {stderr[-3000:]}")
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


@pytest.mark.timeout(300)
def test_tp_plan_auto_on_two_processes_runs_ladder_as_one_device_and_refuses_spd(tmp_path):
    """torchrun, 2 CPU processes over gloo: the ladder checkpoint (tied head; dense -> ladder -> dense) gives the
    one-device logits on both ranks with its weights really split; the SPD checkpoint is refused on each rank with
    the one-line message before any weight is read, and the process group still works after it."""
    folders = {}
    for name, layout in (("ladder", LADDER_BOTH_WAYS), ("spd", SPD_HYBRID_TP2)):
        folders[name] = tmp_path / name
        tiny_model(**{**TINY_TP2, **layout, "tie_word_embeddings": True}).save_pretrained(folders[name])
    ids = token_ids(seq=9)
    torch.save(ids, tmp_path / "ids.pt")
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2",
               "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
               str(Path(__file__).with_name("transformers_tp_worker.py")),
               str(folders["ladder"]), str(folders["spd"]), str(tmp_path / "ids.pt"), str(tmp_path)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": str(ROOT)}
    done = _run_group(command, env, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    reports = json.loads(done.stdout.strip().splitlines()[-1])
    with torch.no_grad():
        expected = LadderLlamaForCausalLM.from_pretrained(folders["ladder"]).eval()(ids).logits
    for rank, report in enumerate(reports):
        assert max_diff(torch.load(tmp_path / f"logits-{rank}.pt"), expected) <= 1e-5
        half = {"q_proj": TINY_TP2["num_attention_heads"] * TINY_TP2["head_dim"] // 2,
                "lm_head": TINY_TP2["vocab_size"] // 2, "embed_tokens": TINY_TP2["vocab_size"] // 2}
        assert report["local_rows"] == half and report["tied"], report
        assert report["spd"] is not None and report["spd"].startswith("LayoutError: "), report["spd"]
        _assert_refusal(report["spd"].removeprefix("LayoutError: "))
    assert "DTensor" not in done.stderr, done.stderr[-3000:]
