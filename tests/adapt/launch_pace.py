"""Paces stated for a launch, and a worker run by ``tests/adapt/test_launch.py`` under torchrun (3 CPU processes,
gloo): it plans a kd stage under the launch with ``pace.measure`` stated (each process's timing recorded as rank, start
and end), for a wall budget (rank r's pieces ``1 + r / 10`` times the stated ones) and for a token budget (the pieces at
one H100's assumed rate); the main process prints one JSON line: each plan's record, expected seconds and lines."""

from __future__ import annotations

import json
import os
import sys
import time

from ladderize.adapt.plan.stage_clock import Pace
from ladderize.adapt.plan.config import GivenSettings

RATES = {"layer_forward": 0.01 / 32, "layer_train": 0.03 / 32, "head_step": 0.02 / 32}  # seconds per token
SHARED = {"seq_len": 32, "batch_size": 3, "device": "cpu", "dtype": "float32", "compile": False}
KD = ["kd:tokens=960"]
TOKEN_BUDGET = "300G"  # minutes of kd at an H100's assumed rate on the tiny model: a printed time to compare


def stated_pace(checkpoint: str, seq_len: int, batch_size: int, slower: float = 1.0) -> Pace:
    """A pace of ``RATES`` per token (``slower`` times them) for ``batch_size`` rows of ``seq_len``, no weight reads."""
    from ladderize.checkpoint.io import load_config

    config = load_config(checkpoint)
    converted = sorted(config.layout.converted_layers)
    rows = seq_len * batch_size
    return Pace(device="cpu", precision="float32", tokens_per_call=rows, layer_read=0.0,
                **{piece: slower * rate * rows for piece, rate in RATES.items()}, layers=config.num_hidden_layers,
                first_converted=converted[0], last_converted=converted[-1], converted=len(converted), measured_s=0.5)


def h100_pace(checkpoint: str, seq_len: int, batch_size: int) -> Pace:
    """A pace whose pieces take what their FLOPs take at one H100's assumed rate (a layer's forward 2 x its parameters
    a token, its training step 6 x, the kd head 6 x the head's), for ``batch_size`` rows of ``seq_len``."""
    from dataclasses import replace

    from ladderize.adapt.plan.cost import Launch, PricedDevice, head_parameters, layer_parameters
    from ladderize.checkpoint.io import load_config

    config = load_config(checkpoint)
    priced = PricedDevice.of(config, sorted(config.layout.converted_layers), Launch(1, "h100"))
    rate, rows = priced.flops_per_s(sequential=False), seq_len * batch_size
    layer, head = layer_parameters(config), head_parameters(config)
    return replace(stated_pace(checkpoint, seq_len, batch_size), layer_forward=2 * layer * rows / rate,
                   layer_train=6 * layer * rows / rate, head_step=6 * head * rows / rate)


def main() -> None:
    import torch.distributed as dist

    from ladderize.adapt.train import pace as pacing
    from ladderize.adapt.entrance import with_timed_pace
    from ladderize.adapt.plan.adapt_plan import build_plan
    from ladderize.adapt.plan.budget import parse_budget
    from ladderize.checkpoint.placement import this_launch

    ladder, text, home = sys.argv[1:4]
    rank, timings = this_launch().rank, []
    stated = {"phase": "wall"}

    def measure(checkpoint, *, seq_len, batch_size, **_settings):
        start = time.time()
        time.sleep(0.5)
        timings.append({"rank": rank, "start": start, "end": time.time(), "rows": batch_size})
        if stated["phase"] == "wall":
            return stated_pace(checkpoint, seq_len, batch_size, slower=1 + rank / 10)
        return h100_pace(checkpoint, seq_len, batch_size)

    pacing.measure = measure
    import torch

    from ladderize.adapt import process_group

    process_group.start(torch.device("cpu"))  # as adapt's entrance does: the launch's group, before the plan
    out = {}
    for phase, budget in (("wall", "600s"), ("tokens", TOKEN_BUDGET)):
        stated["phase"] = phase
        os.environ["LADDERIZE_HOME"] = os.path.join(home, phase)  # a cache of its own: each phase times its pace
        plan = with_timed_pace(lambda pace, heard: build_plan(ladder, shared=GivenSettings.of({**SHARED, "data": text}), stages=KD,
                                                              budget=parse_budget(budget), say=heard, pace=pace))
        out[phase] = {"budget": plan.budget.record(), "expected_s": plan.expected_s, "lines": plan.lines()}
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, timings)
    if rank == 0:
        print(json.dumps({**out, "timings": [entry for part in every for entry in part]}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
