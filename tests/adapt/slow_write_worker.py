"""``ladderize adapt`` under torchrun with a slow OUT writer (every ``write_checkpoint`` sleeps ``SLOW_WRITE_S``) and
each collective that can wait on another process timed: each rank writes the longest one to ``$WAIT_LOG/rank-N.json``
(``tests/adapt/test_write_out.py``)."""

from __future__ import annotations

import json
import os
import runpy
import sys
import time
from pathlib import Path

import torch.distributed as dist

import ladderize.checkpoint.io as checkpoint_io

longest = {"s": 0.0, "name": None}


def _timed(name: str, call):
    def wrapper(*args, **kwargs):
        started = time.perf_counter()
        try:
            return call(*args, **kwargs)
        finally:
            spent = time.perf_counter() - started
            if spent > longest["s"]:
                longest.update(s=spent, name=name)
    return wrapper


for _name in ("barrier", "all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor"):
    setattr(dist, _name, _timed(_name, getattr(dist, _name)))

_write = checkpoint_io.write_checkpoint


def _slow_write(*args, **kwargs):
    time.sleep(float(os.environ["SLOW_WRITE_S"]))
    return _write(*args, **kwargs)


checkpoint_io.write_checkpoint = _slow_write
sys.argv = ["ladderize", *sys.argv[1:]]
try:
    runpy.run_module("ladderize.cli", run_name="__main__")
except SystemExit as exit_:
    code = exit_.code
else:
    code = 0
finally:
    log = Path(os.environ["WAIT_LOG"]) / f"rank-{os.environ['RANK']}.json"
    log.write_text(json.dumps(longest))
sys.exit(code)
