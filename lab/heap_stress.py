"""Stress reproducer for a CPU rank's abort (`munmap_chunk(): invalid pointer`, and a SIGABRT of rank 2 of a 3-process
gloo launch in the parallel suite): the default recipe (sequential stage, then sharded kd) under `torchrun --standalone`
with `--processes` CPU ranks, `--parallel` launches at once, with glibc's heap checks on (MALLOC_CHECK_=3 aborts at
the first inconsistency; MALLOC_PERTURB_ fills freed memory). Every rank enables faulthandler (ladderize's entry point),
so an abort leaves each thread's Python stack in the run's log.

    python lab/heap_stress.py --runs 200 --processes 3 --parallel 2 --work /tmp/heap

Prints one line per run and a JSON summary: runs, failures, aborts (SIGABRT or a glibc heap message), and where each
abort's Python stack stood (the first ladderize frame faulthandler printed)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEAP_WORDS = ("munmap_chunk", "free(): invalid", "double free", "corrupted", "malloc(): ", "Fatal Python error")


def where_it_aborted(text: str) -> str | None:
    """The first frame of ladderize's code in faulthandler's dump, else its first frame (None without a dump)."""
    if "Fatal Python error" not in text:
        return None
    frames = [line.strip() for line in text[text.index("Fatal Python error"):].splitlines() if line.strip().startswith("File ")]
    return next((frame for frame in frames if "/ladderize/" in frame), frames[0] if frames else "no Python frame")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--parallel", type=int, default=2, help="launches at once")
    parser.add_argument("--work", type=Path, default=Path("/tmp/heap-stress"))
    parser.add_argument("--budget", default="24576", help="a token budget keeps every run the same size")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from ladderize.checkpoint.shapes import preset
    from ladderize.convert.conversion import convert_checkpoint
    from ladderize.synthetic import write_synthetic_checkpoint

    args.work.mkdir(parents=True, exist_ok=True)
    dense, ladder = args.work / "dense", args.work / "ladder"
    if not (ladder / "config.json").is_file():
        write_synthetic_checkpoint(dense, preset("tiny"), force=True)
        convert_checkpoint(str(dense), ladder, ladder="2:4", force=True)
    data = ROOT / "tests" / "data" / "wikitext-2" / "valid.txt"
    env = {**os.environ, "MALLOC_CHECK_": "3", "MALLOC_PERTURB_": "165", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}

    def one(run: int) -> dict:
        out = args.work / f"out{run % args.parallel}"
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                   str(args.processes), "-m", "ladderize.cli", "adapt", str(ladder), str(out), "--data", str(data),
                   "--budget", args.budget, "--batch-size", str(args.processes), "--dtype", "bfloat16", "--device",
                   "cpu", "--no-compile", "--force"]
        started = time.perf_counter()
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
        text = done.stdout + done.stderr
        heap = [word for word in HEAP_WORDS if word in text] or (["SIGABRT"] if "Signal 6" in text or "SIGABRT" in text else [])
        if done.returncode != 0:
            (args.work / f"run{run}.log").write_text(text)
        line = {"run": run, "exit": done.returncode, "s": round(time.perf_counter() - started, 1), "heap": heap,
                "where": where_it_aborted(text), "load": round(os.getloadavg()[0], 1)}
        print(json.dumps(line), flush=True)
        return line

    with ThreadPoolExecutor(args.parallel) as pool:
        results = list(pool.map(one, range(args.runs)))
    failures = [r["run"] for r in results if r["exit"] != 0]
    aborts = [r for r in results if r["heap"]]
    print(json.dumps({"runs": args.runs, "processes": args.processes, "parallel": args.parallel, "failures": failures,
                      "aborts": aborts, "load_mean": round(sum(r["load"] for r in results) / max(1, len(results)), 2)}))


if __name__ == "__main__":
    main()
