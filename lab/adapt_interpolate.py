"""Weight interpolation between two adapted checkpoints of one layout (WiSE-FT's question for a recipe's stages).

    python lab/adapt_interpolate.py START END --alphas 0.25,0.5,0.75 --name ladder15-29@30m --cpu 0

``START`` and ``END`` are checkpoints of the same converted layout, e.g. the sequential stage's output
(``OUT.adapt-run/stage1-seq-local`` of a run with ``--keep-state``) and the finished run. Each alpha scores
``(1 - alpha) * START + alpha * END`` in memory (``ladderize.adapt.train.interpolation``, what a joint stage's
``interpolate=ALPHA`` writes) with ``adapt_curve``'s scorer (WikiText-2 window perplexity and
the gap closed, LAMBADA accuracy with the paired difference to dense, lm-eval's LAMBADA perplexity, KL and
top-1 agreement with dense), one core and one thread. It asks whether the last stage's gain on the window
and its cost on text outside the calibration domain move together along the line between the two. One JSON
in ``lab/results/adapt_interpolate/NAME.json``, rewritten by rename after each alpha.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # adapt_common, adapt_curve, beside the benchmarks
from adapt_common import dense_source  # noqa: E402
from adapt_curve import ZERO_SHOT, Scorer, compare, read_json, point_file, score
from ladderize.checkpoint.atomic import write_json
from ladderize.adapt.train.interpolation import interpolate_weights
from ladderize.checkpoint.io import load_model

OUT = Path(__file__).resolve().parent / "results" / "adapt_interpolate"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("start", type=Path, help="checkpoint at alpha 0 (e.g. the sequential stage's output)")
    parser.add_argument("end", type=Path, help="checkpoint at alpha 1 (e.g. the finished run)")
    parser.add_argument("--alphas", default="0,0.25,0.5,0.75,1", help="comma-separated weights of END")
    parser.add_argument("--name", required=True, help="the result's name (lab/results/adapt_interpolate/NAME.json)")
    parser.add_argument("--layout", default="ladder15-29", help="the adapt_curve layout whose zero-shot record gives the gap")
    parser.add_argument("--cpu", type=int, default=0)
    parser.add_argument("--lambada", type=int, default=1000)
    args = parser.parse_args()
    os.sched_setaffinity(0, {args.cpu})
    torch.set_num_threads(1)
    alphas = [float(a) for a in args.alphas.split(",")]
    scorer = Scorer(dense_source(), args.lambada, set())
    dense = scorer.dense()
    zero_shot = read_json(point_file(args.layout + ZERO_SHOT))
    start, end = load_model(args.start), load_model(args.end)
    path = OUT / f"{args.name.replace(':', '+')}.json"
    result = read_json(path) or {"name": args.name, "start": str(args.start), "end": str(args.end), "points": []}
    done = {p["alpha"] for p in result["points"]}
    model = load_model(args.start)
    for alpha in alphas:
        if alpha in done:
            continue
        model.load_state_dict(interpolate_weights(start.state_dict(), end.state_dict(), alpha))
        record = compare({"alpha": alpha, **score(model, scorer.tokenizer, scorer.dense_model, scorer.ids, args.lambada)},
                         dense, zero_shot)
        result["points"] = sorted([*result["points"], record], key=lambda p: p["alpha"])
        write_json(path, result)
        slim = {k: v for k, v in record.items() if k not in ("lambada_hits", "teacher", "score_s")}
        print(json.dumps({**slim, "kl": record["teacher"]["kl"], "top1": record["teacher"]["top1"]}), flush=True)


if __name__ == "__main__":
    main()
