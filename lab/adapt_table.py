"""Print the adaptation benchmark results (benchmarks/results/adapt_*.json) as Markdown tables.

    python lab/adapt_table.py adapt_ladder15-30_compare adapt_ladder15-30_best
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"


def rows(report: dict) -> list[str]:
    dense = report["dense"]
    out = [
        "| recipe | phase | settings | CPU min | WikiText-2 ppl | vs dense | gap closed | LAMBADA (n) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
        f"| dense | - | - | - | {dense['wikitext2_ppl']:.2f} | - | - | {100 * dense['lambada_acc']:.0f}% ({dense['lambada_n']}) |",
    ]
    for result in report["results"]:
        zero = result["points"][0]["wikitext2_ppl"]
        phases = iter(result["phases"])
        for point in result["points"]:
            if point["phase"] != "zero-shot" and point.get("cpu_s") is None:
                continue  # an evaluation inside a phase: wall time only
            phase = {} if point["phase"] == "zero-shot" else next(phases)
            settings = ", ".join(f"{k}={phase[k]}" for k in ("local_schedule", "local_inputs", "tokens", "epochs", "lr", "batch_size") if k in phase)
            gap = (zero - point["wikitext2_ppl"]) / (zero - dense["wikitext2_ppl"])
            lam = f"{100 * point['lambada_acc']:.0f}% ({point['lambada_n']})" if "lambada_acc" in point else "-"
            cpu = f"{point['cpu_s'] / 60:.1f}" if point.get("cpu_s") else "0"
            out.append(f"| {result['recipe']} | {point['phase']} | {settings or '-'} | {cpu} | {point['wikitext2_ppl']:.2f} | "
                       f"{100 * (point['wikitext2_ppl'] / dense['wikitext2_ppl'] - 1):+.1f}% | {100 * gap:.1f}% | {lam} |")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="result files in benchmarks/results/ (with or without .json)")
    for name in parser.parse_args().names:
        report = json.loads((RESULTS / f"{name.removesuffix('.json')}.json").read_text())
        print(f"\n{name}\n")
        print("\n".join(rows(report)))


if __name__ == "__main__":
    main()
