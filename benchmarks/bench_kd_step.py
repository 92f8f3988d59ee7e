"""Benchmark: one kd training step with the teacher run, against the same step reading the teacher's stored states.

    python benchmarks/bench_kd_step.py CKPT --cpu 0     # CKPT: a converted checkpoint, e.g. ladder 15-29 of SmolLM2

The step is what a recipe's ``kd`` stage runs (``objectives.AdaptLoss``, as ``replicated.ReplicatedRun`` builds it: the
converted layers trained, the frozen prefix shared with the teacher): the forward, the kd loss block by block, the
backward, gradient clipping and the fused AdamW step, on ``--batch x --seq`` tokens of WikiText's held-out text at the
run's precision (bf16 autocast where the CPU multiplies bf16), on one core with one thread. ``teacher runs``: the
teacher's embedding and layers compute the student's start state and kd's target at every step (a kd stage without a
sequential stage before it). ``stored``: the step reads the teacher's states entering the first converted layer and
entering its final norm, as a sequential stage stores them (``teacher_states.py``; computed here once, untimed, and
read from files written by ``teacher_states.write``, as the stage reads them). The two alternate ``--repeats`` times
after ``--warmup`` untimed steps each; the losses of the first step are compared too, and its seconds kept
(``first_step_s``: compiled, the first kind's first step waits for Dynamo to trace every layer it trains, one by one;
``--stored-first`` puts the stored step first, as a recipe's kd stage starts). Saves results/bench_kd_step.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).parent / "results"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", help="a converted checkpoint (its teacher is read from its provenance)")
    parser.add_argument("--cpu", type=int, default=0, help="the core to run on, with one thread")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--compile", action="store_true", help="compile the decoder layers and the kd loss, as adapt does on a CPU")
    parser.add_argument("--stored-first", action="store_true",
                        help="run the stored-states step first (with --compile, the first step of the first kind waits "
                             "for every layer it runs to be traced: first_step_s)")
    parser.add_argument("--out", type=Path, default=RESULTS / "bench_kd_step.json")
    args = parser.parse_args()
    os.sched_setaffinity(0, {args.cpu})
    torch.set_num_threads(1)

    from ladderize.adapt.train.compilation import adamw, compile_layers
    from ladderize.corpus.windows import pack_tokens
    from ladderize.adapt.train.replicated import select_trainable
    from ladderize.adapt.train.lora import LoraSpec
    from ladderize.adapt.objectives.losses import AdaptLoss
    from ladderize.convert.residual_states import embed, run_layers
    from ladderize.convert.teacher import load_teacher, resolve_teacher
    from ladderize.adapt.layers.teacher_states import ENTRY_FILE, FINAL_FILE, read, teacher_id, write
    from ladderize.checkpoint.io import load_model, load_tokenizer
    from ladderize.checkpoint.placement import training_precision

    precision = training_precision(None, torch.device("cpu"))
    precision.apply()
    student = load_model(args.checkpoint, dtype=torch.float32)
    teacher_path = resolve_teacher(args.checkpoint, None)
    teacher = load_teacher(teacher_path, student)
    params = select_trainable(student, "converted", LoraSpec())
    if args.compile:
        compile_layers([*student.model.layers, *teacher.model.layers], torch.device("cpu"))
    loss = AdaptLoss(student, teacher, {"kd": 1.0}, share_prefix=True, compiled=args.compile)
    optimizer = adamw(params, fused=True, lr=1e-12)
    tokenizer = load_tokenizer(args.checkpoint, "adaptation")
    ids = pack_tokens("wikitext2-heldout", tokenizer, args.seq, max_tokens=args.batch * args.seq)[: args.batch]

    with torch.no_grad(), precision.context(torch.device("cpu")):  # what a sequential stage stores for these rows
        state, kwargs = embed(teacher, ids)
        entry = run_layers(teacher, state, kwargs, 0, loss.first)
        final = run_layers(teacher, entry, kwargs, loss.first, teacher.config.num_hidden_layers)[0]
    folder = Path(tempfile.mkdtemp(prefix="bench-kd-step-"))
    who = teacher_id(teacher_path)
    write(folder, ENTRY_FILE, ids, {"residual": entry[0], "stale": entry[1]}, who, loss.first)
    write(folder, FINAL_FILE, ids, {"final": final}, who, loss.first)
    stored, _said = read(folder, ids.shape[0], lambda n: ids[:n], who, loss.first)
    rows = list(range(ids.shape[0]))

    def step(kind: str) -> tuple[float, float]:
        start = time.perf_counter()
        with precision.context(torch.device("cpu")):
            losses = loss(ids, stored.rows(rows, "cpu") if kind == "stored" else None)
        losses["total"].backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - start, float(losses["kd"].detach())

    kinds = ("stored", "teacher runs") if args.stored_first else ("teacher runs", "stored")
    first_loss, first_step = {}, {}
    times: dict[str, list[float]] = {kind: [] for kind in kinds}
    try:
        for kind in kinds:  # the weights barely move at lr 1e-12: every step sees the same model
            first_step[kind], first_loss[kind] = step(kind)  # compiled: the first kind's traces every layer it runs
            for _ in range(args.warmup - 1):
                step(kind)
        for _ in range(args.repeats):
            for kind in kinds:
                times[kind].append(step(kind)[0])
    finally:
        shutil.rmtree(folder, ignore_errors=True)  # the stored states' files, read at every stored step until here
    median = {kind: statistics.median(values) for kind, values in times.items()}
    tokens = args.batch * args.seq
    record = {
        "checkpoint": str(args.checkpoint), "teacher": str(teacher_path), "precision": precision.name,
        "compiled": args.compile, "batch": args.batch, "seq": args.seq, "cpu": args.cpu, "repeats": args.repeats,
        "first_converted": loss.first, "layers": student.config.num_hidden_layers,
        "median_s": median, "tokens_per_s": {kind: tokens / seconds for kind, seconds in median.items()},
        "times_s": times, "kd_loss_first_step": first_loss, "first_step_s": first_step, "kinds_in_order": list(kinds),
        "speedup_stored": median["teacher runs"] / median["stored"],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    for kind in kinds:
        print(f"{kind:>13}: {median[kind] * 1e3:8.0f} ms per step ({tokens / median[kind]:,.0f} tokens/s), "
              f"first step {first_step[kind]:.1f} s, kd loss {first_loss[kind]:.6f}")
    print(f"stored states: {record['speedup_stored']:.2f}x the step with the teacher run -> {args.out}")


if __name__ == "__main__":
    main()
