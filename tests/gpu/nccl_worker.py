"""One torchrun "node" of the TP=2 NCCL test: score and generate on the runtime, rank 0 saves the results.

    NCCL_HOSTID=fakehostR torchrun --nnodes 2 --nproc_per_node 1 --node_rank R ... tests/gpu/nccl_worker.py CKPT IDS OUT MODE
"""

from __future__ import annotations

import json
import sys

import numpy as np

from ladderize.runtime.generate import Request, RuntimeOptions, run_requests
from ladderize.runtime.launch import LaunchSpec


def main() -> None:
    checkpoint, ids_file, out, mode = sys.argv[1:5]
    rows = tuple(tuple(r) for r in json.loads(open(ids_file).read()))
    pieces = (7,) + (1,) * (len(rows[0]) - 7)
    options = RuntimeOptions(dtype="float32", cuda_graphs=mode == "graphs")
    requests = [Request(checkpoint, rows, score_pieces=pieces), Request(checkpoint, tuple(r[:7] for r in rows), max_new_tokens=10)]
    # a short collective timeout: a rank whose peer died fails in two minutes instead of ten
    responses = run_requests(requests, LaunchSpec(tp=2, device="cuda", comm="nccl", timeout_s=120), options)
    if responses is not None:  # rank 0
        np.save(out + ".npy", responses[0].logits)
        with open(out + ".json", "w") as handle:
            json.dump({"tokens": responses[1].tokens, "plan": responses[0].plan}, handle)


if __name__ == "__main__":
    main()
