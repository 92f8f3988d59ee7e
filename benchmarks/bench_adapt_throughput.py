"""Benchmark: adapt's kd stage at Llama shapes, as ``ladderize adapt`` runs it: tokens/s per GPU, MFU, peak memory.

    python benchmarks/bench_adapt_throughput.py [--shapes llama-1b,llama-3b,llama-8b] [--steps 30] [--seq-len 2048]
                                                [--batch-size auto] [--activation-checkpointing] [--out STEM]
    python benchmarks/bench_adapt_throughput.py --rehearse     # the CPU rehearsal (tiny shape, CI)

For each shape: a random-weight dense checkpoint (the teacher, bf16 on disk), the same weights converted with ladder
on the upper half of the layers (the student: the teacher's tensors, linked, and a converted config), and the kd stage
on random text through ``adapt.train.adapt``, sharded with FSDP2 (``adapt/train/sharded.py``) over the processes it runs
under (one here; ``torchrun`` launches more), stopped after ``--steps`` steps. The batch per process is, by default,
the largest that the plan's estimate of the kd stage (``adapt.cost.JointMemory.for_step``, the head's terms included)
fits in the device's usable memory (times ``--memory-share``) with the plan's margin left free, at most ``--max-batch``,
as the plan grows a batch; a shape that does not fit at batch 1 is recorded as refused.

Figures: tokens/s per GPU over the steps after the first logged window (its one-time costs left out), MFU by the true
count (``cost.FlopCount``: 6 x trained + 4 x pass-through + 2 x forward-only parameters, over the GPU's dense BF16
peak), the estimate's and CUDA's peak memory, and torchtitan's published per-GPU figure beside them. Saves
``STEM.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import string
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

RESULTS = Path(__file__).parent / "results"
# torchtitan's README: Llama-3.1-8B on 8 x H100 with FSDP, full training (about 48 GFLOP per token), per GPU
TORCHTITAN_8B = {"tokens_per_s_per_gpu": 5762, "compiled_tokens_per_s_per_gpu": 6667, "mfu": "33-39%",
                 "source": "github.com/pytorch/torchtitan, docs/performance.md: Llama 3.1 8B, 8 H100s, FSDP"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="llama-1b,llama-3b,llama-8b")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--batch-size", default="auto", help="sequences per process per step, or auto (fills the device)")
    parser.add_argument("--max-batch", type=int, default=16)
    parser.add_argument("--memory-share", type=float, default=1.0,
                        help="the share of the GPU's memory a process may plan for (0.5: two processes on one GPU)")
    parser.add_argument("--activation-checkpointing", action="store_true")
    parser.add_argument("--vocab-size", type=int, default=None, help="replace each shape's vocabulary (the rehearsal's 128,256)")
    parser.add_argument("--first-fit", action="store_true",
                        help="stop at the first shape that fits (give --shapes largest first: the largest that fits)")
    parser.add_argument("--rehearse", action="store_true", help="tiny shape on the CPU, a few steps (CI)")
    parser.add_argument("--work", type=Path, default=None, help="scratch folder (default: a temp dir, removed)")
    parser.add_argument("--out", type=Path, default=RESULTS / "adapt_throughput")
    args = parser.parse_args()
    if args.rehearse:
        args.shapes, args.steps, args.seq_len = "tiny", min(args.steps, 3), min(args.seq_len, 32)
    work = args.work or Path(tempfile.mkdtemp(prefix="adapt-throughput-"))
    rows = []
    try:
        for name in args.shapes.split(","):
            rows.append(bench_shape(name.strip(), args, work))
            print(json.dumps(rows[-1]), flush=True)
            write(args.out, rows, args)
            if args.first_fit and rows[-1]["status"] == "ok":
                break
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    write(args.out, rows, args)


def write(stem: Path, rows: list[dict], args) -> None:
    import torch

    from ladderize.checkpoint.atomic import write_json

    if int(os.environ.get("RANK", "0")) != 0:
        return
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    record = {"device": device, "torch": torch.__version__, "processes": int(os.environ.get("WORLD_SIZE", "1")),
              "seq_len": args.seq_len, "steps": args.steps, "activation_checkpointing": args.activation_checkpointing,
              "rows": rows, "torchtitan_llama_3_1_8b": TORCHTITAN_8B}
    stem.parent.mkdir(parents=True, exist_ok=True)
    write_json(stem.with_suffix(".json"), record)


def bench_shape(name: str, args, work: Path) -> dict:
    import torch

    from ladderize.adapt.plan.config import AdaptConfig, GivenSettings
    from ladderize.adapt.plan.cost import FlopCount, JointMemory, Launch, usable_bytes
    from ladderize.adapt.plan.adapt_plan import FILL_MARGIN
    from ladderize.adapt.plan.planned_stage import PlannedStage
    from ladderize.adapt.stage_run import adapt
    from ladderize.checkpoint.shapes import preset

    shape = preset(name)
    if args.vocab_size:
        shape = shape.with_(vocab_size=args.vocab_size)
    layers = shape.num_hidden_layers
    converted = list(range(layers // 2, layers))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    cuda = torch.cuda.is_available() and not args.rehearse
    row = {"shape": shape.name, "hidden": shape.hidden_size, "vocab": shape.vocab_size,
           "layout": f"ladder {layers // 2}:{layers}", "processes": world, "memory_share": args.memory_share,
           "model_flops_per_token": FlopCount.for_stage(shape, converted, {"kd"}).per_token}
    usable = usable_bytes(args.memory_share * torch.cuda.get_device_properties(0).total_memory) if cuda else None
    # the plan's own stage: kd sharded, in the run's compute dtype, priced as the plan prices it (head terms included)
    step = {"objectives": "kd", "seq_len": args.seq_len, "shard": "fsdp", "batch_size": world,
            "activation_checkpointing": args.activation_checkpointing, "dtype": None if cuda else "float32"}

    def estimate(batch: int) -> JointMemory:
        return JointMemory.for_step(shape, converted, PlannedStage.of(1, "kd", GivenSettings.of({**step, "batch_size": batch * world})), world,
                                    batch * args.seq_len)

    if args.batch_size != "auto":
        batch = int(args.batch_size)
    elif usable is None:  # no GPU to fill: the stage's own batch
        batch = 2
    else:  # the largest that the estimate fits with the plan's margin left free (0: none), as the plan grows it
        batch = JointMemory.largest_batch(shape, converted, world, args.seq_len, usable * (1 - FILL_MARGIN),
                                          most=args.max_batch, stage=PlannedStage.of(1, "kd", GivenSettings.of(step)))
    if batch == 0:
        row.update(status="does not fit", estimate_gib=round(estimate(1).total / 2**30, 1),
                   usable_gib=round(usable / 2**30, 1))
        return row
    row.update(batch_size=batch, tokens_per_step_per_gpu=batch * args.seq_len,
               estimate_gib=round(estimate(batch).total / 2**30, 1), estimate_bytes=estimate(batch).total,
               estimate_parts=estimate(batch).describe(), usable_bytes=usable)
    teacher, student = checkpoints(shape, converted, work / shape.name)
    text = work / "text.txt"
    if not text.exists():
        rng = random.Random(0)
        words = ["".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 9))) for _ in range(5000)]
        text.write_text(" ".join(rng.choices(words, k=(args.steps + 2) * batch * world * args.seq_len // 4 + 1000)))
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    out = work / f"{shape.name}-out"
    config = AdaptConfig.from_flat(checkpoint=str(student), out=str(out), teacher=str(teacher), data=str(text), objectives="kd",
                         tokens=args.steps * batch * world * args.seq_len, seq_len=args.seq_len, batch_size=batch,
                         lr=1e-4, shard="fsdp", activation_checkpointing=args.activation_checkpointing,
                         save_every=10**9, force=True, run_dir=str(work / f"{shape.name}-run"),
                         device="cuda" if cuda else "cpu", dtype=None if cuda else "float32", compile=False)
    started = time.perf_counter()
    result = adapt(config, stop_after_steps=args.steps, on_message=lambda line: print(line, flush=True))
    row["wall_s"] = round(time.perf_counter() - started, 1)
    curve = result.curve
    first = next((r for r in curve if r["step"] >= min(10, len(curve) // 2)), curve[0])
    last = curve[-1]
    seconds = last["train_s"] - first["train_s"]
    rate = (last["tokens"] - first["tokens"]) / seconds / world if seconds > 0 else None
    launch = Launch.current()
    row.update(status="ok", steps=last["step"], timed_steps=last["step"] - first["step"],
               tokens_per_s_per_gpu=round(rate, 1) if rate else None, loss_first=curve[0]["loss_kd"],
               loss_last=last["loss_kd"])
    if rate and launch.peak_flops_per_s:
        row["mfu"] = round(rate * row["model_flops_per_token"] / launch.peak_flops_per_s, 4)
        row["gpu"] = launch.gpu
    if cuda:
        row["peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
        row["peak_allocated_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        row["peak_reserved_gib"] = round(torch.cuda.max_memory_reserved() / 2**30, 2)
    shutil.rmtree(work / f"{shape.name}-run", ignore_errors=True)
    return row


def checkpoints(shape, converted: list[int], folder: Path) -> tuple[Path, Path]:
    """The dense teacher (random bf16 weights, written once) and the student: its tensors linked, its config converted."""
    import torch

    from ladderize.checkpoint.io import load_config
    from ladderize.synthetic import write_synthetic_checkpoint

    teacher, student = folder / "dense", folder / "ladder"
    if int(os.environ.get("RANK", "0")) == 0 and not (student / "config.json").is_file():
        folder.mkdir(parents=True, exist_ok=True)
        write_synthetic_checkpoint(teacher, shape, dtype=torch.bfloat16, force=True)
        shutil.rmtree(student, ignore_errors=True)
        student.mkdir()
        for file in teacher.iterdir():
            if file.name != "config.json":
                (student / file.name).symlink_to(file)
        config = load_config(teacher)
        modes = ["ladder" if index in converted else "dense" for index in range(shape.num_hidden_layers)]
        ladder = type(config)(**{**config.to_dict(), "layer_modes": modes})
        ladder.save_pretrained(student)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        while not (student / "config.json").is_file():
            time.sleep(1)
    return teacher, student


if __name__ == "__main__":
    main()
