"""LAMBADA (OpenAI) accuracy of adapted checkpoints against dense, on enough passages to judge a 1-point gap.

The adaptation benchmarks score 100 passages (a standard error of ~4.6 points). This scores
``--limit`` passages (default: all 5,153) for dense and each checkpoint, and reports each
accuracy, its difference to dense and the standard error of that paired difference (the
same passages for both). Per-passage hits are kept in the JSON (a string of 0/1, file
order), so that later runs can be compared passage by passage.

    python benchmarks/adapt_lambada.py --threads 1 --json adapt_lambada_full.json NAME=CKPT ...
"""

from __future__ import annotations

import argparse
import json
import time

from adapt_common import RESULTS, dense_source, lambada_hits, named_checkpoints, paired, parse_args


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("checkpoints", nargs="*", help="NAME=CKPT (dense is always scored, or read from the JSON)")
    parser.add_argument("--limit", type=int, default=None, help="first N passages (default: all)")
    parser.add_argument("--dense", default=None)
    parser.add_argument("--json", required=True, help="file name under benchmarks/results/ (extended if it exists)")
    args = parse_args(parser)

    from transformers import AutoTokenizer

    from ladderize.checkpoint.io import load_model

    dense = str(args.dense or dense_source())
    tokenizer = AutoTokenizer.from_pretrained(dense)
    out = RESULTS / args.json
    report = json.loads(out.read_text()) if out.exists() else {"limit": args.limit, "rows": {}}
    if report["limit"] != args.limit:
        raise SystemExit(f"{out.name} holds --limit {report['limit']}, not {args.limit}")
    named = ([] if "dense" in report["rows"] else [("dense", dense)]) + named_checkpoints(args.checkpoints)
    for name, path in named:
        started = time.perf_counter()
        hits = lambada_hits(load_model(path), tokenizer, args.limit)
        report["rows"][name] = {"checkpoint": path, "n": len(hits), "accuracy": sum(hits) / len(hits),
                                "hits": "".join("1" if h else "0" for h in hits), "eval_s": round(time.perf_counter() - started, 1)}
        out.write_text(json.dumps(report, indent=1) + "\n")
        print(name, report["rows"][name]["accuracy"], report["rows"][name]["eval_s"], "s", flush=True)
    base = report["rows"]["dense"]
    print(f"| checkpoint | LAMBADA accuracy (n={base['n']}) | vs dense (points) | standard error of the difference |")
    print("| --- | --- | --- | --- |")
    for name, row in report["rows"].items():
        mean, se = paired(row["hits"], base["hits"])
        row["diff_vs_dense"], row["diff_se"] = mean, se
        print(f"| {name} | {100 * row['accuracy']:.2f}% | {100 * mean:+.2f} | {100 * se:.2f} |")
    out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
