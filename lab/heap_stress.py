"""Stress reproducer for the rank abort `munmap_chunk(): invalid pointer` (issue 73 item 6): the default recipe
(sequential stage, then sharded kd) under torchrun with 2 CPU processes, bf16, a 4 s wall budget, run N times with
glibc's heap checks on (MALLOC_CHECK_=3 aborts at the first inconsistency; MALLOC_PERTURB_ fills freed memory).

    python lab/heap_stress.py --runs 50 --work /tmp/heap

Prints one line per run and a JSON summary: runs, failures, aborts (SIGABRT or a glibc heap message)."""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEAP_WORDS = ("munmap_chunk", "free(): invalid", "double free", "corrupted", "malloc(): ")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--work", type=Path, default=Path("/tmp/heap-stress"))
    parser.add_argument("--budget", default="4s")
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
    failures, aborts = [], []
    for run in range(args.runs):
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
                   "--master_port", str(free_port()), "-m", "ladderize.cli", "adapt", str(ladder), str(args.work / "out"),
                   "--data", str(data), "--budget", args.budget, "--dtype", "bfloat16", "--device", "cpu", "--no-compile",
                   "--force"]
        started = time.perf_counter()
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
        text = done.stdout + done.stderr
        heap = [word for word in HEAP_WORDS if word in text] or (["SIGABRT"] if "Signal 6" in text or "SIGABRT" in text else [])
        if done.returncode != 0:
            failures.append(run)
            (args.work / f"run{run}.log").write_text(text)
        if heap:
            aborts.append({"run": run, "found": heap})
        sharded = "sharded over 2 processes" in text
        print(f"run {run}: exit {done.returncode}, {time.perf_counter() - started:.1f} s, sharded kd {sharded}, heap {heap}",
              flush=True)
    print(json.dumps({"runs": args.runs, "failures": failures, "aborts": aborts}))


if __name__ == "__main__":
    main()
