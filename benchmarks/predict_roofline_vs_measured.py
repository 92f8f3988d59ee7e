"""Module by module: the roofline estimate against what this machine's GPU measures.

Run it on a machine with an H100, H200 or A100: it times one rank's attention and MLP shards (prefill
and decode) with ``--compute measured``'s timer and prints them beside the roofline of the matching GPU
profile, with the error of each. Without a GPU there is nothing to compare and it says so.

Usage: python benchmarks/predict_roofline_vs_measured.py [--model llama-3.1-70b] [--tp 1,2,4,8]
       [--batch 1,4,16,64] [--json benchmarks/results/predict_roofline_vs_measured.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from ladderize.predict import MeasuredCompute, RooflineCompute, load_model_shape, module_work
from ladderize.predict.gpus import GPU_PROFILES
from ladderize.parsing import parse_int_list
from ladderize.predict.estimate import decode_kv_len


def matching_profile(device_name: str):
    name = device_name.lower()
    for key in ("h200", "h100", "a100"):
        if key in name:
            return GPU_PROFILES[key]
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-3.1-70b")
    parser.add_argument("--tp", default="1,2,4,8")
    parser.add_argument("--batch", default="1,4,16,64")
    parser.add_argument("--prompt", type=int, default=1024)
    parser.add_argument("--gen", type=int, default=512)
    parser.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "predict_roofline_vs_measured.json")
    args = parser.parse_args()

    if not torch.cuda.is_available():
        print("no GPU on this machine: no measured GPU timings to compare the roofline with")
        return 1
    measured = MeasuredCompute()
    profile = matching_profile(measured.device_name)
    if profile is None:
        print(f"{measured.device_name} has no roofline profile (h100, h200, a100): nothing to compare")
        return 1
    roofline = RooflineCompute(profile)
    shape = load_model_shape(args.model)
    rows = []
    print(f"device: {measured.device_name}; roofline profile: {profile.name}; model: {shape.name}")
    print("| TP | batch | phase | module | measured ms | roofline ms | error | measured how |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for tp in parse_int_list(args.tp, "--tp"):
        for batch in parse_int_list(args.batch, "--batch"):
            for phase, q_len, kv_len in (("prefill", args.prompt, args.prompt),
                                         ("decode", 1, decode_kv_len(args.prompt, args.gen))):
                for kind in ("attention", "mlp"):
                    work = module_work(shape, kind, tp, batch, q_len, kv_len)
                    got, estimate = measured.module_s(work), roofline.module_s(work)
                    row = {"tp": tp, "batch": batch, "phase": phase, "module": kind, "measured_s": got,
                           "roofline_s": estimate, "error": estimate / got - 1.0, "source": measured.source(work)}
                    rows.append(row)
                    print(f"| {tp} | {batch} | {phase} | {kind} | {got * 1e3:.4f} | {estimate * 1e3:.4f} | "
                          f"{row['error'] * 100:+.1f}% | {row['source']} |")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"device": measured.device_name, "profile": profile.to_dict(),
                                     "model": shape.to_dict(), "rows": rows}, indent=2) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
