"""Calibration and validation of ``ladderize predict`` against the published Ladder / SPD figures.

Re-fits every calibrated constant from the published figures, then prints (and saves as JSON):

1. the fitted parameters next to the shipped ones, each with the figure that fixed it;
2. predicted against published speed-ups, with the error of each (fit points and held-out points);
3. the roofline's compute-only latencies against the Ladder authors' measured H100 runs.

Usage: python benchmarks/predict_validation.py [--json benchmarks/results/predict_validation.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ladderize.predict import calibration
from ladderize.predict.gpus import GPU_PROFILES
from ladderize.predict.interconnect import PROFILES

FIXED_BY = {
    "h100.bandwidth_efficiency": "upper-bound decode latency, 70B TP8 and TP4, batch 1 (authors' logs), jointly",
    "h100.module_overhead_s": "upper-bound decode latency, 70B TP8 and TP4, batch 1 (authors' logs), jointly",
    "h100.flops_efficiency": "upper-bound prefill latency, 70B TP8, batch 1 (authors' logs)",
    "h100-nvlink.latency_s": "1.43x upper bound, TP8, batch 1 (paper), jointly with launch_s",
    "h100-nvlink.launch_s": "1.162x upper bound, TP4, batch 1 (authors' logs), jointly with latency_s",
    "overlap_slowdown": "1.31x Ladder, TP8, batch 1, NVLink (paper)",
    "h100-no-p2p.latency_s": "1.60x Ladder, TP8, batch 1, peer-to-peer disabled (paper)",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "predict_validation.json")
    args = parser.parse_args()

    fitted = calibration.calibrate()
    shipped = calibration.Calibration(GPU_PROFILES["h100"], dict(PROFILES)).parameters()
    parameters = [
        {"parameter": name, "fitted": value, "shipped": shipped[name], "fixed_by": FIXED_BY[name]}
        for name, value in fitted.parameters().items()
    ]
    print("## Calibrated parameters\n")
    print("| parameter | fitted | shipped | fixed by |")
    print("| --- | --- | --- | --- |")
    for p in parameters:
        print(f"| {p['parameter']} | {p['fitted']:.4g} | {p['shipped']:.4g} | {p['fixed_by']} |")

    validation = calibration.validation_table()
    print("\n## Predicted against published (shipped profiles, roofline H100 compute)\n")
    print("| figure | setting | published | predicted | error | role |")
    print("| --- | --- | --- | --- | --- | --- |")
    for row in validation:
        print(f"| {row['key']} | {row['description']} | {row['published']:.3f} | {row['predicted']:.3f} | "
              f"{row['error'] * 100:+.1f}% | {row['role']} |")

    roofline = calibration.roofline_vs_logged()
    print("\n## Roofline (H100) against the authors' measured H100 upper-bound runs, Llama-3.1-70B\n")
    print("| TP | batch | phase | roofline ms | measured ms | error | role |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for row in roofline:
        print(f"| {row['tp']} | {row['batch']} | {row['phase']} | {row['roofline_s'] * 1e3:.2f} | "
              f"{row['measured_s'] * 1e3:.2f} | {row['error'] * 100:+.1f}% | {row['role']} |")

    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({
        "parameters": parameters,
        "validation": validation,
        "roofline_vs_measured": roofline,
        "logged_runs": [run.__dict__ for run in calibration.LOGGED_RUNS],
        "settings": {"prompt_tokens": calibration.PROMPT, "new_tokens": calibration.GEN, "compute": "roofline H100"},
    }, indent=2) + "\n")
    print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
