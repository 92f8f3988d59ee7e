"""Run by tests/adapt/test_sharded.py under torchrun (2 CPU processes, gloo): a kd stage of 6 steps whose deadline is
already past on the main process and an hour away on the other; prints one JSON line per rank: the steps it trained."""

import json
import sys
import time

import torch.distributed as dist

from ladderize.adapt.config import AdaptConfig
from ladderize.adapt.train import adapt
from ladderize.checkpoint.placement import process_rank

ladder, text, out, shard = sys.argv[1:5]
rank = process_rank()
deadline = time.perf_counter() + (0.0 if rank == 0 else 3600.0)
config = AdaptConfig(checkpoint=ladder, out=out, data=text, objectives="kd", tokens=6 * 2 * 32, seq_len=32, batch_size=2,
                     lr=1e-2, dtype="float32", device="cpu", compile=False, shard=shard)
result = adapt(config, deadline=deadline, on_message=print)
sys.stdout.write(json.dumps({"rank": rank, "steps": result.steps}) + "\n")  # one write: the ranks share the pipe
sys.stdout.flush()
dist.destroy_process_group()
