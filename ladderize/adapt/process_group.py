"""The one process group of an adapt run: started once, on the process's own device, with ladderize's timeout.

Under a launcher, adapt's entrance (``entrance.adapt_checkpoint``) starts the group before anything else, and every part
that needs it (the run lock's and the budget's agreement on one verdict and one plan, the sequential stage's data
parallelism, the joint training's runs: DDP and FSDP2) calls ``start``,
which returns the running group's device, so that:

- the process's CUDA device is set before anything touches CUDA (``cuda:$LOCAL_RANK``): no process creates a context
  on another's GPU;
- the group's collective timeout is ladderize's (``$LADDERIZE_COLLECTIVE_TIMEOUT`` minutes, default 120), not NCCL's
  10 minutes, so that ranks waiting at a barrier while the main process writes a large output are not killed;
- NCCL runs on CUDA, gloo on a CPU;
- a long write by the main process (a stage's output, OUT) is waited for on the file system (``written_by_main``),
  not in a collective.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from ..checkpoint.placement import this_launch

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
    owned = not this_launch().by_launcher
    kept = {key: os.environ.get(key) for key in ("RANK", "WORLD_SIZE")}
    if owned:  # one process, not launched: a group of one over a free local port
        import socket

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
    try:
        dist.init_process_group("nccl" if cuda else "gloo", timeout=collective_timeout(), device_id=device if cuda else None)
    finally:
        if owned:  # the environment as it was: the group of one's variables go, a caller's stay
            for key in kept:
                if kept[key] is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = kept[key]
    return device


def running() -> bool:
    """Whether this process is in a started process group (a group of one included)."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def is_main() -> bool:
    """Whether this process is the main one (rank 0, or the only process: ``this_launch().main``)."""
    return this_launch().main


def barrier() -> None:
    """Wait for every process of the group (nothing without one)."""
    import torch.distributed as dist

    if running():
        dist.barrier()


def main_says(values: tuple[int, ...], device: torch.device | str) -> tuple[int, ...]:
    """The main process's ``values`` on every process of a launched job (one broadcast; its own outside one), so that
    a decision read from one process's clock or signals is every process's."""
    import torch.distributed as dist

    if not this_launch().several:
        return values
    tensor = torch.tensor(list(values), device=device)
    dist.broadcast(tensor, src=0)
    return tuple(int(value) for value in tensor.tolist())


def agreed(value: Any) -> Any:
    """``value`` as the main process has it, on every process of a launch (``value`` itself in one process): a verdict
    or a plan read from one process's files, clock or pace is every process's."""
    import torch.distributed as dist

    if not this_launch().several:
        return value
    holder = [value]
    dist.broadcast_object_list(holder, src=0)
    return holder[0]


def on_every_process(flag: bool, device: torch.device | str = "cpu") -> bool:
    """Whether ``flag`` holds on every process of a launch (one all-reduce; ``flag`` itself in one process)."""
    import torch.distributed as dist

    if not this_launch().several:
        return flag
    held = torch.tensor([1 if flag else 0], device=device)
    dist.all_reduce(held, op=dist.ReduceOp.MIN)
    return bool(held.item())


def sum_over_processes(tensors: list[torch.Tensor]) -> None:
    """Sum each tensor over the launched processes, in place (nothing in one process)."""
    import torch.distributed as dist

    if this_launch().several:
        for tensor in tensors:
            dist.all_reduce(tensor)


WRITE_WAIT_S = 12 * 3600.0  # how long the other processes wait on the file system for the main one's write
POLL_S = 0.2


def written_by_main(marker: Path, write: Callable[[], None], timeout_s: float = WRITE_WAIT_S) -> None:
    """``write()`` on the main process while the others wait on the file system, not in a collective: the main process
    writes ``marker`` once ``write`` has returned (or failed), and the others poll for it (every ``POLL_S``, up to
    ``timeout_s``), so that no collective timeout bounds a long write. Without a launch, ``write()`` alone."""
    from ..errors import LadderizeError

    if not this_launch().several:
        write()
        return
    if is_main():
        marker.unlink(missing_ok=True)  # a marker an earlier run left
    barrier()  # every process is here, before the main one writes
    if is_main():
        try:
            write()
        except BaseException as exc:
            marker.write_text(f"failed: {type(exc).__name__}")
            raise
        marker.write_text("done")
    else:
        waited = time.monotonic()
        while not marker.is_file():
            if time.monotonic() - waited > timeout_s:
                raise LadderizeError(f"the main process has not finished writing after {timeout_s:,.0f} s ({marker})")
            time.sleep(POLL_S)
        if marker.read_text().startswith("failed"):
            raise LadderizeError(f"the main process's write failed ({marker.read_text().strip()})")
    barrier()  # every process has seen the marker (each arrives within a poll of the main one)
    if is_main():
        marker.unlink(missing_ok=True)
