"""The one process group of an adapt run: started once, on the process's own device, with ladderize's timeout.

Every part of adapt that needs the launcher's process group (the budget's agreement on one plan, the sequential
stage's data parallelism, the sharded joint training, and Accelerate, which takes a group that is already there)
calls ``start``, so that:

- the process's CUDA device is set before anything touches CUDA (``cuda:$LOCAL_RANK``): no process creates a context
  on another's GPU;
- the group's collective timeout is ladderize's (``$LADDERIZE_COLLECTIVE_TIMEOUT`` minutes, default 120), not NCCL's
  10 minutes, so that ranks waiting at a barrier while the main process writes a large output are not killed;
- NCCL runs on CUDA, gloo on a CPU.
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch

ENV_TIMEOUT = "LADDERIZE_COLLECTIVE_TIMEOUT"
DEFAULT_TIMEOUT_MINUTES = 120.0


def collective_timeout() -> timedelta:
    """``$LADDERIZE_COLLECTIVE_TIMEOUT`` minutes (a positive number), else 120."""
    from ..errors import LadderizeError

    raw = os.environ.get(ENV_TIMEOUT, "").strip()
    if not raw:
        return timedelta(minutes=DEFAULT_TIMEOUT_MINUTES)
    try:
        minutes = float(raw)
    except ValueError:
        minutes = -1.0
    if minutes <= 0:
        raise LadderizeError(f"{ENV_TIMEOUT}={raw!r}: give the collective timeout in minutes, a positive number")
    return timedelta(minutes=minutes)


def start(device: torch.device) -> torch.device:
    """The job's process group on ``device`` (set first where it is a CUDA device), started unless it is running;
    ``device`` returned. Not under a launcher, one process makes a group of one over a free local port, so that the
    same code shards (trivially) there."""
    import torch.distributed as dist

    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.set_device(device)
    if dist.is_initialized():
        return device
    owned = "RANK" not in os.environ
    if owned:  # one process, not launched: a group of one over a free local port
        import socket

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
    try:
        dist.init_process_group("nccl" if cuda else "gloo", timeout=collective_timeout(), device_id=device if cuda else None)
    finally:
        if owned:
            for key in ("RANK", "WORLD_SIZE"):
                os.environ.pop(key, None)
    return device


def running() -> bool:
    """Whether this process is in a started process group (a group of one included)."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def launched() -> bool:
    """Whether this process is one of several in a started process group."""
    import torch.distributed as dist

    return running() and dist.get_world_size() > 1


def is_main() -> bool:
    """Whether this process is the main one (rank 0, or the only process)."""
    import torch.distributed as dist

    return not running() or dist.get_rank() == 0


def barrier() -> None:
    """Wait for every process of the group (nothing without one)."""
    import torch.distributed as dist

    if running():
        dist.barrier()


def main_says(values: tuple[int, ...], device: torch.device | str) -> tuple[int, ...]:
    """The main process's ``values`` on every process of a launched job (one broadcast; its own outside one), so that
    a decision read from one process's clock or signals is every process's."""
    import torch.distributed as dist

    if not launched():
        return values
    tensor = torch.tensor(list(values), device=device)
    dist.broadcast(tensor, src=0)
    return tuple(int(value) for value in tensor.tolist())
