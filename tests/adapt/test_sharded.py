"""The joint stages sharded with FSDP2 (``adapt/train/sharded.py``) under torchrun over gloo: equal to one process, with
clipping that matters, the default recipe at 3 processes, resume bit for bit and on another process count, the saved
state's size, and host memory per rank."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from ladderize.adapt.plan.config import AdaptConfig
from ladderize.adapt.stage_run import adapt
from tests.adapt.conftest import convert
from tests.adapt.test_multiprocess import launch_failure, sharp_dense

SEQ = 32
COMMON = ["--data", None, "--seq-len", str(SEQ), "--dtype", "float32", "--device", "cpu", "--no-compile"]


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
            "ACCELERATE_CONFIG_FILE": str(tmp_path / "no-config.yaml"), "LADDERIZE_PROGRESS_INTERVAL": "0"}


def _torchrun(processes: int) -> list[str]:
    """torchrun on one node, its rendezvous on a port the system picks when it binds it (``--standalone``: two
    launches at once cannot take the same port)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes)]


def _launch(processes: int, args: list[str], tmp_path: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    command = [*_torchrun(processes), "-m", "ladderize.cli", *args]
    done = subprocess.run(command, env=_env(tmp_path), capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, launch_failure(done.stderr)
    return done


def _single(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "ladderize.cli", *args], env=_env(tmp_path), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done


def _common(text_file: Path) -> list[str]:
    return [str(text_file) if item is None else item for item in COMMON]


def _updates_agree(one: Path, other: Path, start: Path, tolerance: float) -> float:
    """The largest difference of a trained tensor between two runs, relative to the norm of its update (asserted)."""
    a, b, base = (load_file(path / "model.safetensors") for path in (one, other, start))
    worst = 0.0
    for name in a:
        update = (a[name] - base[name]).norm().item()
        if update == 0:
            assert torch.equal(a[name], b[name]), name
            continue
        worst = max(worst, (a[name] - b[name]).norm().item() / update)
    assert worst <= tolerance, worst
    return worst


def _losses(path: Path, name: str = "loss_kd") -> list[float]:
    """The ``name`` loss of every step that has one (a recipe's curve holds every stage's steps)."""
    return [record[name] for record in json.loads((path / "adapt_curve.json").read_text()) if name in record]


@pytest.fixture(scope="module")
def sharp_ladder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("sharded")
    return convert(sharp_dense(root / "dense"), root / "ladder", ladder="1:4")


def test_two_processes_shard_and_equal_one_process_with_a_clip_that_matters(sharp_ladder, text_file, tmp_path):
    """kd at 2 processes (FSDP2 by default under a launcher) against one replicated process at the same global batch,
    with a clip that changes the result: losses within 1e-5 relative, each weight's update within 1e-3 of its norm."""
    stage = "kd:tokens=256,max_grad_norm=0.01,lr=1e-2,batch_size={}"
    two = _launch(2, ["adapt", str(sharp_ladder), str(tmp_path / "two"), *_common(text_file), "--stage", stage.format(2)],
                  tmp_path)
    assert "sharded over 2 processes with FSDP2" in two.stderr and "batch 2 = 1 per process x 2 processes" in two.stderr
    _single(["adapt", str(sharp_ladder), str(tmp_path / "one"), *_common(text_file), "--stage", stage.format(2)], tmp_path)
    _single(["adapt", str(sharp_ladder), str(tmp_path / "free"), *_common(text_file), "--stage",
             "kd:tokens=256,max_grad_norm=0,lr=1e-2,batch_size=2"], tmp_path)
    for a, b in zip(_losses(tmp_path / "one"), _losses(tmp_path / "two")):
        assert a == pytest.approx(b, rel=1e-5)
    _updates_agree(tmp_path / "one", tmp_path / "two", sharp_ladder, 1e-3)
    with pytest.raises(AssertionError):  # without the clip the result is another: the clip is doing something
        _updates_agree(tmp_path / "one", tmp_path / "free", sharp_ladder, 1e-3)


def test_three_processes_run_the_default_recipe_like_one_process(sharp_ladder, text_file, tmp_path):
    """The default recipe's stages (seq-local with a batch of 2 split over 3 processes, then kd with a batch of 3, one
    sequence per process) at 3 processes against one process with the same flags."""
    seq = "seq-local:tokens=192,epochs=1,batch_size=2"
    done = _launch(3, ["adapt", str(sharp_ladder), str(tmp_path / "three"), *_common(text_file), "--stage", seq,
                       "--stage", "kd:tokens=384,batch_size=3"], tmp_path)
    assert "1 wait each step" in done.stderr and done.stderr.count("1 wait each step") == 1  # the main process says it
    assert "batch 3 = 1 per process x 3 processes" in done.stderr
    _single(["adapt", str(sharp_ladder), str(tmp_path / "one"), *_common(text_file), "--stage", seq,
             "--stage", "kd:tokens=384,batch_size=3"], tmp_path)
    for a, b in zip(_losses(tmp_path / "one"), _losses(tmp_path / "three")):
        assert a == pytest.approx(b, rel=1e-5)
    assert len(_losses(tmp_path / "three")) == 4
    _updates_agree(tmp_path / "one", tmp_path / "three", sharp_ladder, 1e-3)


def test_the_default_recipe_on_a_token_budget_ends_equal_on_one_and_three_processes(ladder_dir, text_file, tmp_path):
    """``ladderize adapt L OUT --data TEXT --budget 24576 --batch-size 3`` on the 4-layer ladder 2:4, alone and under
    ``torchrun --nproc_per_node 3``: a batch of 3 is the step's on both (one sequence per process on 3), so both train
    the same tokens, and each weight's update agrees within 1e-3."""
    args = ["--data", str(text_file), "--budget", "24576", "--batch-size", "3", "--dtype", "float32", "--device", "cpu",
            "--no-compile"]
    three = _launch(3, ["adapt", str(ladder_dir), str(tmp_path / "three"), *args], tmp_path, timeout=600)
    assert "batch 3 = 1 per process x 3 processes" in three.stderr, three.stderr[-3000:]
    one = _single(["adapt", str(ladder_dir), str(tmp_path / "one"), *args], tmp_path)

    def trained(done: subprocess.CompletedProcess) -> str:
        return next(line for line in done.stdout.splitlines() + done.stderr.splitlines()
                    if line.startswith("adapted ")).split(" trained")[0]

    assert trained(one) == trained(three)
    assert _losses(tmp_path / "one") and len(_losses(tmp_path / "one")) == len(_losses(tmp_path / "three"))
    for a, b in zip(_losses(tmp_path / "one"), _losses(tmp_path / "three")):
        assert a == pytest.approx(b, rel=1e-3)
    worst = _updates_agree(tmp_path / "one", tmp_path / "three", ladder_dir, 1e-3)
    print(f"worst relative update difference, 1 against 3 processes: {worst:.2e}")


def test_a_batch_replicated_over_three_processes_equals_one_process(sharp_ladder, text_file, tmp_path):
    """The replicated path (``--shard ddp``: DDP through Accelerate) with kd's batch of 6 over 3 processes and 2
    micro-batches each (one sequence per micro-batch) against one process with the same flags."""
    stage = ["--stage", "kd:tokens=256,lr=1e-2,batch_size=6,grad_accum=2"]
    three = _launch(3, ["adapt", str(sharp_ladder), str(tmp_path / "three"), *_common(text_file), "--shard", "ddp",
                        *stage], tmp_path)
    assert "(FSDP2)" not in three.stderr  # replicated: replicated.py
    assert "batch 6 = 1 per process x 3 processes x 2 accumulated" in three.stderr, three.stderr[-3000:]
    _single(["adapt", str(sharp_ladder), str(tmp_path / "one"), *_common(text_file), *stage], tmp_path)
    for a, b in zip(_losses(tmp_path / "one"), _losses(tmp_path / "three"), strict=True):
        assert a == pytest.approx(b, rel=1e-5)
    _updates_agree(tmp_path / "one", tmp_path / "three", sharp_ladder, 1e-3)


def test_a_batch_that_does_not_divide_over_three_processes_is_refused_before_any_work(sharp_ladder, text_file, tmp_path):
    """``--batch-size 8 --grad-accum 4`` under ``torchrun --nproc_per_node 3``: 12 micro-batches for 8 sequences, so
    some would train nothing; every rank refuses it in one line naming the sizes that divide, nothing written."""
    stage = ["--objective", "kd", "--tokens", "256", "--batch-size", "8", "--grad-accum", "4"]
    command = [*_torchrun(3), "-m", "ladderize.cli", "adapt", str(sharp_ladder), str(tmp_path / "three"),
               *_common(text_file), *stage]
    refused = subprocess.run(command, env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    errors = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert refused.returncode != 0 and errors, refused.stderr[-3000:]
    assert all("--batch-size 8 does not divide into 3 processes x 4 micro-batches" in line and
               "give --batch-size 12" in line for line in errors)
    assert not (tmp_path / "three").exists()


def _config(ladder: Path, text_file: Path, out: Path, **overrides) -> AdaptConfig:
    settings = dict(checkpoint=str(ladder), out=str(out), data=str(text_file), objectives="kd", tokens=8 * 2 * SEQ,
                    seq_len=SEQ, batch_size=2, lr=1e-2, dtype="float32", device="cpu", compile=False, shard="fsdp")
    return AdaptConfig.from_flat(**{**settings, **overrides})


def test_a_sharded_resume_is_bit_identical(sharp_ladder, text_file, tmp_path):
    whole = adapt(_config(sharp_ladder, text_file, tmp_path / "whole"))
    cut = adapt(_config(sharp_ladder, text_file, tmp_path / "cut"), max_steps=3)
    assert cut.stopped_early and cut.steps == 3
    resumed = adapt(_config(sharp_ladder, text_file, tmp_path / "cut"), resume=True)
    assert resumed.resumed_from_step == 3 and resumed.steps == 8
    a, b = load_file(tmp_path / "whole" / "model.safetensors"), load_file(tmp_path / "cut" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert [r["loss_kd"] for r in whole.curve] == [r["loss_kd"] for r in resumed.curve]


def test_the_saved_state_is_the_trained_layers_and_their_adamw(text_file, tmp_path):
    """A model whose tensors are large beside DCP's per-tensor framing (a few KB): the state of a stopped run is
    the trained layers' fp32 weights and AdamW's two moments (12 bytes a parameter), the frozen layers left out."""
    from ladderize.checkpoint.shapes import ModelShape
    from ladderize.synthetic import write_synthetic_checkpoint

    dense = write_synthetic_checkpoint(tmp_path / "dense", ModelShape("mid", 256, 512, 4, 8, 4, 32, 512))
    ladder = convert(dense, tmp_path / "ladder", ladder="2:4")
    adapt(_config(ladder, text_file, tmp_path / "cut", teacher=str(dense)), max_steps=2)
    tensors = load_file(ladder / "model.safetensors")
    trained = sum(t.numel() for name, t in tensors.items() if name.startswith(("model.layers.2.", "model.layers.3.")))
    saved = sum(f.stat().st_size for f in (tmp_path / "cut.adapt-run" / "state" / "dcp").rglob("*") if f.is_file())
    print(f"saved {saved:,} bytes for {trained:,} trained of {sum(t.numel() for t in tensors.values()):,} parameters")
    assert 12 * trained <= saved <= 1.1 * 12 * trained, (saved, trained)


def test_a_run_saved_on_two_processes_continues_on_one(sharp_ladder, text_file, tmp_path):
    stage = "kd:tokens=256,lr=1e-2,batch_size=2"
    _launch(2, ["adapt", str(sharp_ladder), str(tmp_path / "out"), *_common(text_file), "--stage", stage,
                "--max-steps", "2"], tmp_path)
    done = _single(["adapt", str(sharp_ladder), str(tmp_path / "out"), *_common(text_file), "--stage", stage,
                    "--shard", "fsdp", "--resume"], tmp_path)
    assert "a run saved on 2" in done.stderr and "resumed from step 2" in done.stderr, done.stderr[-2000:]
    curve = json.loads((tmp_path / "out" / "adapt_curve.json").read_text())
    assert curve[-1]["tokens"] >= 256 and [r["step"] for r in curve][:2] == [1, 2]


def test_shard_fsdp_refuses_what_needs_the_whole_weights(sharp_ladder, text_file, tmp_path):
    from ladderize.errors import LadderizeError

    with pytest.raises(LadderizeError, match="--shard fsdp trains the converted layers: ema needs the replicated path"):
        adapt(_config(sharp_ladder, text_file, tmp_path / "o", ema=0.9))


def _peak_rss_mb(command: list[str], env: dict[str, str]) -> float:
    """The largest resident memory of any process ``command`` starts (its launcher's workers included), in MB."""
    probe = ("import resource, subprocess, sys; done = subprocess.run(sys.argv[1:]); "
             "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024); sys.exit(done.returncode)")
    done = subprocess.run([sys.executable, "-c", probe, *command], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, launch_failure(done.stderr)
    return float(done.stdout.strip().splitlines()[-1])


def test_host_memory_per_rank_at_two_processes_is_under_one_processs(text_file, tmp_path):
    """A 1.1 GB model (fp32): each rank holds half of the weights, gradients and AdamW state, and what a step gathers
    and frees leaves the process (``layer_source.map_large_allocations``), so its peak is one process's less half of
    what the model takes (measured 1.65 against 2.85 GB, 0.58x; the 0.4 GB of Python and torch do not shrink)."""
    from ladderize.checkpoint.shapes import ModelShape
    from ladderize.synthetic import write_synthetic_checkpoint

    shape = ModelShape("host-1g", 1024, 2816, 16, 16, 8, 64, 32000)
    assert shape.num_parameters * 4 > 1e9
    dense = write_synthetic_checkpoint(tmp_path / "dense", shape)
    ladder = convert(dense, tmp_path / "ladder", ladder="8:16")
    args = ["-m", "ladderize.cli", "adapt", str(ladder), None, "--data", str(text_file), "--seq-len", "16",
            "--dtype", "float32", "--device", "cpu", "--no-compile", "--stage", "kd:tokens=64,batch_size=2,lr=1e-4",
            "--max-steps", "1", "--shard", "fsdp", "--teacher", str(dense)]
    one = _peak_rss_mb([sys.executable, *[str(tmp_path / "one") if a is None else a for a in args]], _env(tmp_path))
    two = _peak_rss_mb([*_torchrun(2), *[str(tmp_path / "two") if a is None else a for a in args]], _env(tmp_path))
    print(f"peak RSS: one process {one:,.0f} MB, a rank of two {two:,.0f} MB ({two / one:.2f}x)")
    assert two <= 0.6 * one, (one, two)


def test_activation_checkpointing_recomputes_the_same_training(sharp_ladder, text_file, tmp_path):
    plain = adapt(_config(sharp_ladder, text_file, tmp_path / "plain", tokens=4 * 2 * SEQ))
    checked = adapt(_config(sharp_ladder, text_file, tmp_path / "checked", tokens=4 * 2 * SEQ,
                            activation_checkpointing=True))
    assert [r["loss_kd"] for r in plain.curve] == pytest.approx([r["loss_kd"] for r in checked.curve], rel=1e-6)
    a, b = load_file(tmp_path / "plain" / "model.safetensors"), load_file(tmp_path / "checked" / "model.safetensors")
    assert max((a[k] - b[k]).abs().max().item() for k in a) <= 1e-6


def test_the_replicated_training_recomputes_activations_too(sharp_ladder, text_file, tmp_path):
    """``--activation-checkpointing`` on the replicated training (``replicated.py``): the same training, its layers
    checkpointed."""
    checked_layers: list[bool] = []

    def progress(_info, model):
        checked_layers.append(all(layer.gradient_checkpointing for layer in model.model.layers))

    plain = adapt(_config(sharp_ladder, text_file, tmp_path / "plain", tokens=4 * 2 * SEQ, shard="ddp"))
    checked = adapt(_config(sharp_ladder, text_file, tmp_path / "checked", tokens=4 * 2 * SEQ, shard="ddp",
                            activation_checkpointing=True), progress=progress)
    assert checked_layers and all(checked_layers)
    assert [r["loss_kd"] for r in plain.curve] == pytest.approx([r["loss_kd"] for r in checked.curve], rel=1e-6)


@pytest.mark.parametrize("shard", ["fsdp", "ddp"])
def test_under_a_launcher_the_main_processs_clock_keeps_a_stages_deadline(shard, sharp_ladder, text_file, tmp_path):
    """A wall budget's joint stage stops at its deadline on every process together, by the main process's clock: with
    the deadline past there and an hour away on the other process, both stop after the first step and write OUT."""
    worker = Path(__file__).with_name("deadline_worker.py")
    env = {**_env(tmp_path), "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run([*_torchrun(2), str(worker), str(sharp_ladder), str(text_file), str(tmp_path / "out"), shard],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, launch_failure(done.stderr)
    reports = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert sorted((r["rank"], r["steps"]) for r in reports) == [(0, 1), (1, 1)]
    assert "stops here" in done.stdout + done.stderr and (tmp_path / "out" / "model.safetensors").is_file()


def test_under_a_launcher_the_main_processs_clock_keeps_the_sequential_stages_deadline(sharp_ladder, text_file, tmp_path):
    """The sequential stage keeps a wall budget's deadline under a launcher too, by the main process's clock: with the
    deadline past there and an hour away on the other process, both train each converted layer one step (the same
    count on both: a step count the processes disagreed on would leave one waiting in a collective) and write OUT."""
    from ladderize.checkpoint.io import load_config

    converted = len(load_config(sharp_ladder).layout.converted_layers)
    worker = Path(__file__).with_name("deadline_worker.py")
    env = {**_env(tmp_path), "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run([*_torchrun(2), str(worker), str(sharp_ladder), str(text_file), str(tmp_path / "out"), "seq"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, launch_failure(done.stderr)
    reports = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert sorted((r["rank"], r["steps"]) for r in reports) == [(0, converted), (1, converted)]
    assert "time is up" in done.stdout + done.stderr and (tmp_path / "out" / "model.safetensors").is_file()


def test_a_state_saved_by_one_strategy_resumes_on_the_other(sharp_ladder, text_file, tmp_path):
    """The joint stages keep one training state (a distributed checkpoint of the trained parameters and AdamW): a run
    stopped under the replicated training resumes sharded, and one stopped sharded resumes replicated, each ending as
    the uninterrupted run of the other strategy does (the tolerance of the sharded-equals-replicated test)."""
    tokens = 4 * 2 * SEQ
    whole = {shard: adapt(_config(sharp_ladder, text_file, tmp_path / f"whole-{shard}", tokens=tokens, shard=shard))
             for shard in ("ddp", "fsdp")}
    for saved_by, resumed_by in (("ddp", "fsdp"), ("fsdp", "ddp")):
        out = tmp_path / f"{saved_by}-then-{resumed_by}"
        adapt(_config(sharp_ladder, text_file, out, tokens=tokens, shard=saved_by), max_steps=2)
        resumed = adapt(_config(sharp_ladder, text_file, out, tokens=tokens, shard=resumed_by), resume=True)
        assert resumed.resumed_from_step == 2
        assert [r["loss_kd"] for r in resumed.curve] == pytest.approx(
            [r["loss_kd"] for r in whole[resumed_by].curve], rel=1e-5)
        _updates_agree(tmp_path / f"whole-{resumed_by}", out, sharp_ladder, 1e-4)


def _tied_ladder(root: Path) -> Path:
    """``sharp_dense``'s model with its LM head tied to the embedding (SmolLM2's way), converted ladder 1:4."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from tests.conftest import TINY, char_tokenizer

    torch.manual_seed(1)
    dense = root / "dense"
    LlamaForCausalLM(LlamaConfig(**{**TINY, "tie_word_embeddings": True}, initializer_range=0.15)).save_pretrained(dense)
    char_tokenizer().save_pretrained(dense)
    return convert(dense, root / "ladder", ladder="1:4")


def test_a_tied_checkpoint_trains_sharded_as_replicated(text_file, tmp_path):
    """A tied LM head is its embedding's weight in the sharded build too (one FSDP2 unit with it in the teacher):
    kd sharded on one process equals the replicated training."""
    from torch.distributed.tensor import DTensor

    from ladderize.adapt.process_group import start as _init_process_group
    from ladderize.adapt.train.sharded import _sharded_model
    from ladderize.checkpoint.io import load_config

    ladder = _tied_ladder(tmp_path)
    dense = tmp_path / "dense"
    teacher = _sharded_model(load_config(dense), str(dense), torch.float32, _init_process_group(torch.device("cpu")), ())
    assert isinstance(teacher.lm_head.weight, DTensor) and teacher.lm_head.weight is teacher.model.embed_tokens.weight
    sharded = adapt(_config(ladder, text_file, tmp_path / "sharded", tokens=4 * 2 * SEQ))
    replicated = adapt(_config(ladder, text_file, tmp_path / "replicated", tokens=4 * 2 * SEQ, shard="ddp"))
    assert [r["loss_kd"] for r in sharded.curve] == pytest.approx([r["loss_kd"] for r in replicated.curve], rel=1e-5)
    _updates_agree(tmp_path / "replicated", tmp_path / "sharded", ladder, 1e-4)


def test_the_student_holds_the_teachers_identical_frozen_parts_once(sharp_ladder, tmp_path):
    """The layers below the first converted one, the embedding, the final norm and an untied LM head are the
    teacher's own modules where both checkpoints hold them identical: the student's own parameters are its converted
    layers'. A head that differs is the student's own."""
    import shutil

    from safetensors.torch import save_file

    from ladderize.adapt.process_group import start as _init_process_group
    from ladderize.adapt.train.sharded import _identical_parts, _sharded_model, _teacher_pieces
    from ladderize.checkpoint.io import load_config

    dense = sharp_ladder.parent / "dense"
    other = tmp_path / "other-head"
    shutil.copytree(dense, other)
    tensors = load_file(other / "model.safetensors")
    tensors["lm_head.weight"] = tensors["lm_head.weight"] + 1.0
    save_file(tensors, other / "model.safetensors", metadata={"format": "pt"})

    device = _init_process_group(torch.device("cpu"))
    config = load_config(sharp_ladder)
    converted = config.layout.converted_layers
    first = min(converted)
    for teacher_path, head_shared in ((dense, True), (other, False)):
        same = _identical_parts(str(sharp_ladder), str(teacher_path), first, 0, 1, device)
        assert same == {"prefix": True, "norm": True, "head": head_shared}
        teacher = _sharded_model(load_config(teacher_path), str(teacher_path), torch.float32, device, trained=())
        student = _sharded_model(config, str(sharp_ladder), torch.float32, device, trained=converted,
                                 shared=_teacher_pieces(teacher, config, first, same))
        assert student.model.embed_tokens is teacher.model.embed_tokens and student.model.norm is teacher.model.norm
        assert (student.lm_head is teacher.lm_head) == head_shared
        assert all(student.model.layers[i] is teacher.model.layers[i] for i in range(first))
        teachers = {id(p) for p in teacher.parameters()}
        own = {id(p) for p in student.parameters() if id(p) not in teachers}
        expected = {id(p) for i in converted for p in student.model.layers[i].parameters()}
        if not head_shared:
            expected.add(id(student.lm_head.weight))
        assert own == expected


def test_each_rank_reads_only_its_rows_of_each_layer(tmp_path):
    """Under 3 processes each rank reads its own rows of every decoder-layer tensor (safetensors slices, uneven
    shards included: 100 MLP rows over 3 ranks), never a layer tensor whole, and its shards equal the checkpoint's."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from tests.conftest import TINY

    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**dict(TINY, intermediate_size=100))).save_pretrained(tmp_path / "dense")
    ladder = convert(tmp_path / "dense", tmp_path / "ladder", ladder="2:4")
    worker = Path(__file__).with_name("shard_read_worker.py")
    env = {**_env(tmp_path), "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run([*_torchrun(3), str(worker), str(ladder)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, launch_failure(done.stderr)
    reports = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert sorted(r["rank"] for r in reports) == [0, 1, 2]
    full = reports[0]["full_layer_bytes"]
    assert sum(r["layer_bytes"] for r in reports) == full  # every row read once, by one rank
    for report in reports:
        assert report["equal"] and report["whole_layer_reads"] == []
        assert report["layer_bytes"] <= full / 3 * 1.1  # a third, give or take the uneven chunks
