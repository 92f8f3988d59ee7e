"""Where a converted model's residual-stream error sits: over tokens, at position 0, over dimensions.

    python lab/adapt_error_structure.py /tmp/adapt_bench/curve/ladder15-29 --layers 15,20,25,29

Runs the dense teacher and the converted student (zero-shot or adapted) on 4 x 512 WikiText-2 valid tokens past the
evaluation window (characters 40,000-120,000 of the file), and for the residual stream after each named layer prints
and saves (``lab/results/adapt_error_structure.json``) the share of the squared error that the 1% of tokens with the
largest error hold, the share at position 0 (where the massive activations sit), the per-token relative error, and
the share the 5 largest dimensions hold. Evenly spread error (the top 1% of tokens near 1%) means that reweighting
the local loss per token cannot be a lever.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # adapt_common, beside the benchmarks
from adapt_common import dense_source, shared_data_dir  # noqa: E402
from ladderize.checkpoint.atomic import write_json
from ladderize.checkpoint.io import load_model, load_tokenizer


def error_structure(teacher_state: torch.Tensor, student_state: torch.Tensor) -> dict:
    """Shares of the squared error ``||student - teacher||^2`` of one layer's residual stream ``[B, S, D]``."""
    error = (student_state - teacher_state).pow(2)
    per_token = error.sum(-1).flatten()
    relative = error.sum(-1) / teacher_state.pow(2).sum(-1)
    per_dim = error.sum((0, 1))
    return {"top1pct_tokens_share": float(per_token.topk(max(1, per_token.numel() // 100)).values.sum() / per_token.sum()),
            "position0_share": float(error[:, 0].sum() / per_token.sum()),
            "relative_error_mean": float(relative.mean()), "relative_error_median": float(relative.median()),
            "top5_dims_share": float(per_dim.topk(5).values.sum() / per_dim.sum())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("student", help="the converted checkpoint")
    parser.add_argument("--layers", default="15,20,25,29", help="comma-separated layers whose output is compared")
    parser.add_argument("--dense", default=None, help="dense checkpoint (default: ladderize pull smollm2-135m)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    dense = args.dense or str(dense_source())
    teacher, student = load_model(dense).eval(), load_model(args.student).eval()
    text = (shared_data_dir() / "wikitext-2" / "valid.txt").read_text()[40_000:120_000]
    ids = load_tokenizer(dense)(text, return_tensors="pt").input_ids[:, :2048].reshape(4, 512)
    with torch.no_grad():
        teacher_states = teacher(ids, output_hidden_states=True).hidden_states
        student_states = student(ids, output_hidden_states=True).hidden_states
    rows = {}
    for layer in (int(v) for v in args.layers.split(",")):
        rows[layer] = error_structure(teacher_states[layer + 1], student_states[layer + 1])
        print(f"layer {layer}: " + ", ".join(f"{k} {v:.4f}" for k, v in rows[layer].items()))
    out = Path(__file__).resolve().parent / "results" / "adapt_error_structure.json"
    write_json(out, {"student": args.student, "dense": dense, "layers": rows})
    print(f"-> {out}")


if __name__ == "__main__":
    main()
