"""Run by tests/adapt/test_interrupt_save.py under torchrun (2 CPU processes, gloo): a kd stage of 8 steps, losses
logged every 10 steps (or, with ``sequential`` after the paths, a sequential stage of 8 steps a layer), where rank 1
alone gets a SIGINT inside step 3; prints one JSON line per rank: the signal it stopped with and the step of the state
saved."""

import json
import os
import signal
import sys

import torch.distributed as dist

from ladderize.adapt.plan import lr_curve
from ladderize.adapt.train import trainer
from ladderize.adapt.plan.config import AdaptConfig
from ladderize.adapt.stage_run import adapt
from ladderize.checkpoint.placement import this_launch
from ladderize.errors import Interrupted, install_interrupt_handlers

ladder, text, out = sys.argv[1:4]
sequential = sys.argv[4:] == ["sequential"]
rank = this_launch().rank
schedule = lr_curve.warmup_cosine


def wrapped(*args, **kwargs):
    inner = schedule(*args, **kwargs)

    def factor(index: int) -> float:
        if index == 3 and rank == 1:
            os.kill(os.getpid(), signal.SIGINT)
        return inner(index)
    return factor


trainer.warmup_cosine = lr_curve.warmup_cosine = wrapped  # the joint loop's, and the sequential stage's layers'
trainer.log_interval = lambda _device: 10
install_interrupt_handlers()
stage = (dict(objectives="local", local_schedule="sequential", epochs=1.0, tokens=8 * 2 * 32) if sequential else
         dict(objectives="kd", tokens=8 * 2 * 32, shard="ddp"))
config = AdaptConfig.from_flat(checkpoint=ladder, out=out, data=text, seq_len=32, batch_size=2, lr=1e-3, dtype="float32",
                               device="cpu", compile=False, **stage)
try:
    adapt(config)
    stopped = None
except Interrupted as exc:
    stopped = exc.signum
state = json.loads((config.resolved_run_dir() / "state" / "trainer_state.json").read_text())
sys.stdout.write(json.dumps({"rank": rank, "signum": stopped, "step": state["step"]}) + "\n")  # one write: the ranks share the pipe
sys.stdout.flush()
dist.destroy_process_group()
