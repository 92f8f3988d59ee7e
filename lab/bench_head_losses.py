"""Benchmark: the kd loss over whole logits against ``blockwise_head_losses``, side by side in one process.

    taskset -c 0 python lab/bench_head_losses.py --threads 1

Both paths compute the same kd loss and its gradient for a batch of ``--batch x --seq``
tokens at SmolLM2's shapes (hidden 576, vocabulary 49,152) with a small random model standing
in for the student and the teacher (only the final norm and LM head matter here; both
frozen, as in the default ``--train converted``, so the gradient goes to the residual stream). They run
alternately, ``--repeats`` times each; the JSON records each path's median seconds per step,
the minor page faults per step (fresh memory mapped from the kernel), and their ratio.
Saves lab/results/bench_head_losses.json.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"  # lab/results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--hidden", type=int, default=576)
    parser.add_argument("--vocab", type=int, default=49_152)
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from ladderize.adapt.objectives.losses import blockwise_head_losses, kd_loss, teacher_kd_block_loss
    from ladderize.adapt.objectives.registry import logit_block_rows
    from ladderize.convert.residual_states import logits_from
    from ladderize.model import LadderLlamaConfig, LadderLlamaForCausalLM

    def model(seed: int) -> LadderLlamaForCausalLM:
        torch.manual_seed(seed)
        config = LadderLlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=1, num_key_value_heads=1, tie_word_embeddings=False)
        return LadderLlamaForCausalLM(config).eval()

    student, teacher = model(0), model(1)
    teacher.requires_grad_(False)
    student.requires_grad_(False)  # --train converted: the head is frozen, the gradient flows to the residual stream
    gen = torch.Generator().manual_seed(2)
    final = torch.randn(args.batch, args.seq, args.hidden, generator=gen)
    teacher_final = final + 0.1 * torch.randn(final.shape, generator=gen)

    def whole() -> torch.Tensor:
        with torch.no_grad():
            teacher_logits = logits_from(teacher, teacher_final)
        return kd_loss(logits_from(student, hidden), teacher_logits)

    def blockwise() -> torch.Tensor:
        heads = {"kd": lambda: (teacher_kd_block_loss(teacher, teacher_final, 1.0, "forward", 0, False, "cpu"),
                                args.batch * args.seq)}
        return blockwise_head_losses(student, hidden, heads, (teacher,))["kd"]

    paths = {"whole_logits": whole, "blockwise": blockwise}
    seconds: dict[str, list[float]] = {name: [] for name in paths}
    faults: dict[str, list[int]] = {name: [] for name in paths}
    losses, grads = {}, {}
    for repeat in range(args.repeats + 1):  # the first round warms up and is not counted
        for name, path in paths.items():
            hidden = final.clone().requires_grad_(True)
            before, started = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
            loss = path()
            loss.backward()
            elapsed = time.perf_counter() - started
            if repeat:
                seconds[name].append(elapsed)
                faults[name].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
            losses[name], grads[name] = loss.item(), hidden.grad
    result = {
        "shape": {"batch": args.batch, "seq": args.seq, "hidden": args.hidden, "vocab": args.vocab},
        "block_rows": logit_block_rows(args.vocab), "torch_threads": torch.get_num_threads(), "repeats": args.repeats,
        "loss": losses, "max_abs_grad_difference": (grads["whole_logits"] - grads["blockwise"]).abs().max().item(),
        "median_s_per_step": {name: statistics.median(values) for name, values in seconds.items()},
        "median_minor_faults_per_step": {name: statistics.median(values) for name, values in faults.items()},
    }
    result["speedup_blockwise_vs_whole"] = result["median_s_per_step"]["whole_logits"] / result["median_s_per_step"]["blockwise"]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bench_head_losses.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
