"""``accelerate launch --num_processes 2 --cpu`` (gloo DDP) with the joint kd objective matches one process at the same global batch."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from ladderize.adapt.plan.config import AdaptConfig
from ladderize.adapt.stage_run import adapt
from ladderize.checkpoint.io import load_model
from ladderize.progress import counted
from tests.adapt.conftest import convert

# Per-step relative tolerance of the averaged loss: the two runs see the same sequences and
# differ only in the order of the fp32 sums (gloo all-reduce of the gradients, the mean of the
# per-rank losses); measured: equal to 1e-7 relative (kd ~0.3), where one process with another batch
# split (or the single process that ``accelerate launch --cpu`` starts, see docs/adapt.md) differs by ~10%.
LOSS_RTOL = 1e-4


def launch_failure(stderr: str) -> str:
    """Every process's error lines first (a crashed rank's own error is far above the launcher's last lines), then the end."""
    errors = [line for line in stderr.splitlines() if "Error" in line and "File " not in line]
    return "\n".join(errors[:30]) + "\n...\n" + stderr[-1500:]


def sharp_dense(path):
    """A tiny dense checkpoint with larger weights than the shared one: peaked logits, so that kd's KL is O(0.1),
    far above fp32 noise (with near-uniform logits it is ~1e-4 and Adam amplifies the noise of its tiny gradients)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from tests.conftest import TINY, char_tokenizer

    torch.manual_seed(1)
    LlamaForCausalLM(LlamaConfig(**TINY, initializer_range=0.15)).save_pretrained(path)
    char_tokenizer().save_pretrained(path)
    return path


def test_two_process_accelerate_launch_matches_one_process(text_file, tmp_path):
    ladder_dir = convert(sharp_dense(tmp_path / "dense"), tmp_path / "ladder", ladder="1:4")
    steps, seq_len = 4, 32
    common = ["--data", str(text_file), "--objective", "kd", "--tokens", str(steps * 2 * seq_len), "--seq-len", str(seq_len),
              "--lr", "1e-3", "--save-every", "2", "--dtype", "float32"]  # fp32: the data-parallel sums, not rounding
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
           "ACCELERATE_CONFIG_FILE": str(tmp_path / "no-config.yaml")}  # never read a user's accelerate config
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
              "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "0",
              "-m", "ladderize.cli", "adapt", str(ladder_dir), str(tmp_path / "two"), "--batch-size", "2", *common]
    done = subprocess.run(launch, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, launch_failure(done.stderr)
    assert f"adapted {steps} steps, {steps * 2 * seq_len} tokens" in done.stdout

    one = adapt(AdaptConfig.from_flat(checkpoint=str(ladder_dir), out=str(tmp_path / "one"), data=str(text_file), objectives="kd",
                            tokens=steps * 2 * seq_len, seq_len=seq_len, batch_size=2, lr=1e-3, dtype="float32"))
    two = json.loads((tmp_path / "two" / "adapt_curve.json").read_text())
    assert [r["tokens"] for r in two] == [r["tokens"] for r in one.curve]
    for a, b in zip(one.curve, two):
        assert abs(a["loss_kd"] - b["loss_kd"]) <= LOSS_RTOL * abs(a["loss_kd"]), (a, b)
    print("kd loss, 1 process:", [r["loss_kd"] for r in one.curve], "2 processes:", [r["loss_kd"] for r in two])
    assert min(r["loss_kd"] for r in one.curve) > 1e-2  # a loss well above fp32 noise
    w1, w2 = load_model(tmp_path / "one").state_dict(), load_model(tmp_path / "two").state_dict()
    base = load_model(ladder_dir).state_dict()
    assert max((w1[k] - w2[k]).abs().max().item() for k in w1) < 1e-5 < max((w1[k] - base[k]).abs().max().item() for k in w1)


SEQUENTIAL = (9, 32, 3, 2)  # a sequential stage's sequences, sequence length, batch and epochs on the tiny ladder


def _sequential_command(text_file, tmp_path) -> tuple[list[str], dict[str, str]]:
    """The flags of the ``SEQUENTIAL`` stage, in fp32 on the CPU, and the environment its launches run in."""
    sequences, seq_len, batch, epochs = SEQUENTIAL
    flags = ["--data", str(text_file), "--objective", "local", "--local-schedule", "sequential", "--tokens",
             str(sequences * seq_len), "--seq-len", str(seq_len), "--batch-size", str(batch), "--epochs", str(epochs),
             "--lr", "3e-3", "--device", "cpu", "--dtype", "float32"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
           "ACCELERATE_CONFIG_FILE": str(tmp_path / "no-config.yaml")}  # never read a user's accelerate config
    return flags, env


def test_two_process_sequential_stage_is_data_parallel_and_matches_one_process(ladder_dir, text_file, tmp_path):
    """Each process trains the layer on its part of every batch (3 rows: 2 and 1, a ragged split), gradients summed."""
    sequences, seq_len, batch, epochs = SEQUENTIAL
    common, env = _sequential_command(text_file, tmp_path)
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
              "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "0",
              "-m", "ladderize.cli", "adapt", str(ladder_dir), str(tmp_path / "two"), *common]
    done = subprocess.run(launch, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, launch_failure(done.stderr)

    one = adapt(AdaptConfig.from_flat(checkpoint=str(ladder_dir), out=str(tmp_path / "one"), data=str(text_file), objectives="local",
                            local_schedule="sequential", tokens=sequences * seq_len, seq_len=seq_len, batch_size=batch,
                            epochs=epochs, lr=3e-3, device="cpu", dtype="float32"))
    two = json.loads((tmp_path / "two" / "adapt_curve.json").read_text())
    assert [(r["step"], r["layer"]) for r in two] == [(r["step"], r["layer"]) for r in one.curve] and len(two) == 12
    for a, b in zip(one.curve, two):
        assert abs(a["loss_local"] - b["loss_local"]) <= LOSS_RTOL * abs(a["loss_local"]), (a, b)
    print("local loss, max relative difference 2 vs 1 process:",
          max(abs(a["loss_local"] - b["loss_local"]) / abs(a["loss_local"]) for a, b in zip(one.curve, two)))
    assert [a["loss_local"] for a in one.curve] != [b["loss_local"] for b in two]  # two processes really summed parts
    w1, w2 = load_model(tmp_path / "one").state_dict(), load_model(tmp_path / "two").state_dict()
    base = load_model(ladder_dir).state_dict()
    assert max((w1[k] - w2[k]).abs().max().item() for k in w1) < 1e-5 < max((w1[k] - base[k]).abs().max().item() for k in w1)
    assert not (tmp_path / "two.adapt-run").exists()  # the main process settled the run dir


def test_two_processes_run_one_plan_of_a_wall_budget(ladder_dir, text_file, tmp_path):
    """Each process times its own pace, and two paces rarely give the same sizes: the main process's plan (and its
    re-plan after stage 1) is the one both run; two plans would leave one process waiting in an all-reduce."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
           "ACCELERATE_CONFIG_FILE": str(tmp_path / "no-config.yaml")}
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
              "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "0",
              "-m", "ladderize.cli", "adapt", str(ladder_dir), str(tmp_path / "two"), "--data", str(text_file),
              "--seq-len", "32", "--batch-size", "2", "--device", "cpu", "--budget", "30s", "--keep-state",
              "--stage", "seq-local:tokens=128,epochs=1", "--stage", "kd:tokens=64"]
    done = subprocess.run(launch, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, launch_failure(done.stderr)
    record = json.loads((tmp_path / "two.adapt-run" / "recipe.json").read_text())
    entry, = record["budget"]["replanned"]
    assert entry["after_stage"] == 1 and entry["tokens"] == record["plan"][1]["tokens"]
    said = [line for line in done.stderr.splitlines() if "re-planned kd" in line]  # the main process says it
    planned = [line for line in done.stdout.splitlines() if line.startswith("  2. kd: kd (joint), ")]
    assert len(said) == 1 and len(planned) == 1, done.stdout + done.stderr
    before = int(planned[0].split(", ")[1].removesuffix(" tokens").replace(",", ""))
    assert f"re-planned kd {before:,} -> {counted(record['plan'][1]['tokens'], 'token')}" in said[0], said


def test_a_sequential_stage_stopped_on_two_processes_resumes_on_one_from_its_tokens(ladder_dir, text_file, tmp_path):
    """A sequential stage launched on 2 processes and stopped inside its second layer (``--max-steps 8``: the first
    layer's 6 steps finished and kept) resumes on 1 process from the finished layer's step and tokens, trains the
    steps left, and ends as one uninterrupted process does (within the data-parallel sums' rounding)."""
    sequences, seq_len, batch, epochs = SEQUENTIAL
    common, env = _sequential_command(text_file, tmp_path)
    command = ["-m", "ladderize.cli", "adapt", str(ladder_dir), str(tmp_path / "two"), *common]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    cut = subprocess.run([*torchrun, *command, "--max-steps", "8"], env=env, capture_output=True, text=True, timeout=240)
    assert cut.returncode == 0, launch_failure(cut.stderr)
    state = json.loads((tmp_path / "two.adapt-run" / "state" / "trainer_state.json").read_text())
    assert (state["step"], state["tokens"], state["layer_done"]) == (6, 6 * batch * seq_len, 2)
    resumed = subprocess.run([sys.executable, *command, "--resume"], env=env, capture_output=True, text=True, timeout=240)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed after layer 2 (step 6)" in resumed.stdout + resumed.stderr

    one = adapt(AdaptConfig.from_flat(checkpoint=str(ladder_dir), out=str(tmp_path / "one"), data=str(text_file),
                                      objectives="local", local_schedule="sequential", tokens=sequences * seq_len,
                                      seq_len=seq_len, batch_size=batch, epochs=epochs, lr=3e-3, device="cpu",
                                      dtype="float32"))
    two = json.loads((tmp_path / "two" / "adapt_curve.json").read_text())
    assert [(r["step"], r["tokens"], r["layer"]) for r in two] == [(r["step"], r["tokens"], r["layer"]) for r in one.curve]
    for a, b in zip(one.curve, two):
        assert abs(a["loss_local"] - b["loss_local"]) <= LOSS_RTOL * abs(a["loss_local"]), (a, b)
    w1, w2 = load_model(tmp_path / "one").state_dict(), load_model(tmp_path / "two").state_dict()
    assert max((w1[k] - w2[k]).abs().max().item() for k in w1) < 1e-5
