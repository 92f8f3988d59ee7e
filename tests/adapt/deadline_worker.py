"""Run by tests/adapt/test_sharded.py under torchrun (2 CPU processes, gloo): a kd stage of 6 steps (or a sequential
stage, ``seq``) whose deadline is already past on the main process and an hour away on the other; prints one JSON line
per rank: the steps it trained."""

import json
import sys
import time

import torch.distributed as dist

from ladderize.adapt.plan.config import AdaptConfig
from ladderize.adapt.stage_run import adapt
from ladderize.checkpoint.placement import this_launch

ladder, text, out, shard = sys.argv[1:5]
rank = this_launch().rank
deadline = time.perf_counter() + (0.0 if rank == 0 else 3600.0)
stage = dict(objectives="local", local_schedule="sequential", epochs=3.0) if shard == "seq" else \
    dict(objectives="kd", shard=shard)
config = AdaptConfig.from_flat(checkpoint=ladder, out=out, data=text, tokens=6 * 2 * 32, seq_len=32, batch_size=2,
                               lr=1e-2, dtype="float32", device="cpu", compile=False, **stage)
result = adapt(config, deadline=deadline, on_message=print)
sys.stdout.write(json.dumps({"rank": rank, "steps": result.steps}) + "\n")  # one write: the ranks share the pipe
sys.stdout.flush()
dist.destroy_process_group()
