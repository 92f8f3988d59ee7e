"""Evaluate a further adaptation phase run with the CLI and add it to a benchmark JSON as a new recipe.

    python lab/adapt_eval.py --results benchmarks/results/adapt_ladder15-30.json --base-recipe local_student \
        --name local_student_then_kd --checkpoint /tmp/adapt_bench/ladder-kd --phase kd
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # adapt_common, beside the benchmarks
from adapt_common import evaluate, plot  # noqa: E402

from ladderize.eval.perplexity import wikitext2_ids


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--results", required=True)
    parser.add_argument("--base-recipe", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--phase", required=True)
    parser.add_argument("--command", default="")
    parser.add_argument("--settings", default="", help="the phase's settings for the tables, k=v,k=v (e.g. lr=2e-4,batch_size=2)")
    parser.add_argument("--lambada", type=int, default=100)
    parser.add_argument("--from-zero-shot", action="store_true", help="the phase started from the zero-shot checkpoint, not from the base recipe's end")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    from ladderize.checkpoint.io import load_model

    path = Path(args.results)
    report = json.loads(path.read_text())
    base = next(r for r in report["results"] if r["recipe"] == args.base_recipe)
    curve = json.loads((Path(args.checkpoint) / "adapt_curve.json").read_text())
    if args.from_zero_shot:
        base = {**base, "points": base["points"][:1], "phases": []}
    last = base["points"][-1]
    tokenizer = AutoTokenizer.from_pretrained(args.checkpoint)
    point = {"phase": args.phase, "tokens": last["tokens"] + curve[-1]["tokens"], "train_s": last["train_s"] + curve[-1]["train_s"],
             "cpu_s": (last.get("cpu_s") or 0) + curve[-1]["cpu_s"], "loss": curve[-1]["loss_total"],
             **evaluate(load_model(args.checkpoint), tokenizer, args.lambada, wikitext2_ids(tokenizer))}
    zero, dense = base["points"][0]["wikitext2_ppl"], report["dense"]["wikitext2_ppl"]
    point["gap_closed"] = (zero - point["wikitext2_ppl"]) / (zero - dense)
    result = copy.deepcopy(base)
    result.update({"recipe": args.name, "final_checkpoint": args.checkpoint, "extra_phase_command": args.command})
    result["points"].append(point)
    settings = dict(item.split("=", 1) for item in args.settings.split(",") if item)
    result["phases"] = result["phases"] + [{"objectives": args.phase, "tokens": curve[-1]["tokens"], **settings}]
    report["results"] = [r for r in report["results"] if r["recipe"] != args.name] + [result]
    path.write_text(json.dumps(report, indent=1) + "\n")
    plot(report["results"], report["dense"], zero, path.with_suffix(".png"), f"SmolLM2-135M, {path.stem.removeprefix('adapt_')}: adaptation on 2 CPU cores")
    print(json.dumps(point))


if __name__ == "__main__":
    main()
