"""Starting the ranks: ``torch.multiprocessing`` on one machine, or whatever ``torchrun`` started.

``run_ranks(job, spec)`` runs ``job(RankContext)`` on every rank and returns rank 0's
result. Under ``torchrun`` (``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` in the environment) the
current process *is* a rank: the group is initialised from the environment and the
other ranks return ``None``. Otherwise ladderize spawns ``tp`` processes itself on
127.0.0.1 with a free port. One rank needs no process group at all.

Backends: gloo on CPU, NCCL on CUDA (``backend="auto"`` picks by device). The all-reduces of
the model go through ``comm`` (``--comm auto|shm|gloo|nccl``): ``auto`` is NCCL on CUDA, and on
CPU the shared-memory all-reduce of ``shm.py`` when every rank runs on this host (the host
names are gathered at start-up), else gloo. The gloo group stays up beside ``shm`` for
set-up and barriers. ``--comm shm`` across hosts is refused in one line.
"""

from __future__ import annotations

import os
import queue as queue_module
import socket
import traceback
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ..errors import LadderizeError
from ..checkpoint.placement import resolve_device, this_launch
from .allreduce import Communicator
from ..hardware import cpu_cores
from .host import check_cores

COMMS = ("auto", "shm", "gloo", "nccl")


@dataclass(frozen=True)
class LaunchSpec:
    """How many ranks, on what, and how strictly to check the machine."""

    tp: int = 1
    device: str = "auto"  # auto | cpu | cuda
    backend: str = "auto"  # auto | gloo | nccl: the process group
    comm: str = "auto"  # auto | shm | gloo | nccl: what carries the model's all-reduces (see shm.py)
    oversubscribe: bool = False
    timeout_s: float = 600.0
    threads_per_rank: int = 0  # 0: the machine's cores divided among the local ranks
    pin_cores: bool = False  # CPU: bind each local rank (and its gloo threads) to its own cores
    comm_nice: int | None = None  # CPU: nice value of gloo's threads (experiment; < 0 needs privileges)

    @property
    def device_type(self) -> str:
        """``cpu`` or ``cuda`` (``placement.resolve_device``: one line of error for CUDA where there is none)."""
        return resolve_device(self.device).type

    @property
    def backend_name(self) -> str:
        if self.backend == "auto":
            if self.comm in ("gloo", "shm"):
                return "gloo"
            if self.comm == "nccl":
                return "nccl"
            return "nccl" if self.device_type == "cuda" else "gloo"
        return self.backend


@dataclass
class RankContext:
    """What a job gets on its rank."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str
    comm: Communicator = field(default_factory=Communicator)
    transport: str = "none"  # what carries the all-reduces: shm, gloo, nccl (none: one rank)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier()


def check_machine(spec: LaunchSpec) -> None:
    """Refuse a rank count the machine cannot host (one line, ``LadderizeError``)."""
    if spec.tp < 1:
        raise LadderizeError(f"--tp must be at least 1, got {spec.tp}")
    if spec.backend_name not in ("gloo", "nccl"):
        raise LadderizeError(f"unknown backend {spec.backend!r}; use gloo, nccl or auto")
    if spec.comm not in COMMS:
        raise LadderizeError(f"unknown --comm {spec.comm!r}; use auto, shm, gloo or nccl")
    if spec.comm in ("shm", "gloo", "nccl") and spec.backend_name != ("nccl" if spec.comm == "nccl" else "gloo"):
        raise LadderizeError(f"--comm {spec.comm} does not go with --backend {spec.backend_name}")
    if spec.backend_name == "nccl" and spec.device_type != "cuda":
        raise LadderizeError("the nccl backend needs --device cuda; use gloo on CPU")
    if spec.comm == "shm" and spec.device_type != "cpu":
        raise LadderizeError("--comm shm reduces CPU tensors; on CUDA use --comm nccl (or auto)")
    launch = this_launch()
    if launch.by_launcher:
        if launch.world != spec.tp:
            raise LadderizeError(f"--tp {spec.tp} does not match torchrun's WORLD_SIZE={launch.world}")
        local = launch.local_world
    else:
        local = spec.tp
    if spec.device_type == "cuda":
        if spec.tp > 1 and str(spec.device).startswith("cuda:"):
            raise LadderizeError(f"--device {spec.device} names one GPU, but --tp {spec.tp} runs a rank on each local GPU "
                                 "(cuda:LOCAL_RANK); use --device cuda, and CUDA_VISIBLE_DEVICES to choose the GPUs")
        if local > torch.cuda.device_count():
            raise LadderizeError(f"{local} ranks on this node but only {torch.cuda.device_count()} CUDA devices")
    else:
        check_cores(spec.tp, local, spec.oversubscribe)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _init_rank(spec: LaunchSpec, rank: int, world: int, local_rank: int, local_world: int) -> RankContext:
    if spec.device_type == "cuda":
        # one rank: the device asked for (``cuda:N``, or cuda:LOCAL_RANK); several: each rank its own local GPU
        device = resolve_device(spec.device) if world == 1 else torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        threads = spec.threads_per_rank or max(1, cpu_cores() // max(1, local_world))
        if spec.pin_cores:  # before the process group exists, so gloo's threads inherit the mask
            cores = sorted(os.sched_getaffinity(0))
            mine = [cores[(local_rank * threads + i) % len(cores)] for i in range(threads)]
            os.sched_setaffinity(0, mine)
        torch.set_num_threads(threads)
    if world > 1:
        kwargs = {"device_id": device} if device.type == "cuda" else {}
        threads_before = _thread_ids()
        dist.init_process_group(
            spec.backend_name, rank=rank, world_size=world, timeout=timedelta(seconds=spec.timeout_s), **kwargs
        )
        if spec.comm_nice is not None and device.type == "cpu":
            # gloo's worker and transport threads appear during init. A lower nice value should let them
            # preempt this rank's compute sooner; on the 2-core test machine nice -10 measured slower.
            for tid in _thread_ids() - threads_before:
                try:
                    os.setpriority(os.PRIO_PROCESS, tid, spec.comm_nice)
                except OSError:  # not permitted (negative values need privileges): keep the default
                    pass
    comm, transport = Communicator(world), "none"
    if world > 1:
        comm, transport = _communicator(spec, rank, world, device, local_world)
    return RankContext(rank, world, local_rank, device, spec.backend_name, comm, transport)


def _communicator(
    spec: LaunchSpec, rank: int, world: int, device: torch.device, local_world: int
) -> tuple[Communicator, str]:
    """The all-reduce path of this run (``--comm``); gathers the ranks' host names on CPU."""
    if device.type != "cpu" or spec.comm in ("gloo", "nccl"):
        return Communicator(world), spec.backend_name
    from .shm import SPIN_US, SPIN_US_OVERSUBSCRIBED, ShmCommunicator, choose_comm, hostname

    hostnames: list = [None] * world
    dist.all_gather_object(hostnames, hostname())
    if choose_comm(spec.comm, device.type, hostnames) == "shm":
        spin_us = SPIN_US if local_world <= cpu_cores() else SPIN_US_OVERSUBSCRIBED
        return ShmCommunicator(world, rank, spin_us=spin_us, timeout_s=spec.timeout_s), "shm"
    return Communicator(world), spec.backend_name


def _thread_ids() -> set[int]:
    try:
        return {int(tid) for tid in os.listdir("/proc/self/task")}
    except OSError:  # pragma: no cover - not Linux
        return set()


def _finish_rank(context: RankContext | None = None) -> None:
    close = getattr(context.comm, "close", None) if context is not None else None
    if close is not None:
        close()
    if dist.is_initialized():
        dist.destroy_process_group()


def _spawned(local_rank: int, job: Callable[[RankContext], Any], spec: LaunchSpec, port: int, results) -> None:
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    if spec.device_type == "cpu":
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    from ..model.layout import LayoutError

    context = None
    try:
        context = _init_rank(spec, local_rank, spec.tp, local_rank, spec.tp)
        with torch.inference_mode():
            result = job(context)
        if local_rank == 0:
            results.put(("ok", result))
    except (LadderizeError, LayoutError) as exc:
        results.put(("error", str(exc)))
        raise SystemExit(1)
    except BaseException:
        results.put(("crash", f"rank {local_rank}: {traceback.format_exc()}"))
        raise
    finally:
        _finish_rank(context)


def run_ranks(job: Callable[[RankContext], Any], spec: LaunchSpec) -> Any:
    """Run ``job`` on every rank; return rank 0's result (``None`` on other torchrun ranks).

    ``job`` must be picklable (a module-level function or a ``functools.partial`` of one)
    when ladderize spawns the ranks.
    """
    check_machine(spec)
    launch = this_launch()
    if launch.by_launcher:
        rank = launch.rank
        try:
            context = _init_rank(spec, rank, launch.world, launch.local_rank, launch.local_world)
        except BaseException:
            _finish_rank()
            raise
        try:
            with torch.inference_mode():
                result = job(context)
        finally:
            _finish_rank(context)
        return result if rank == 0 else None
    if spec.tp == 1:  # in this process: put its thread count and CPU mask back afterwards
        threads, mask = torch.get_num_threads(), os.sched_getaffinity(0)
        try:
            context = _init_rank(spec, 0, 1, 0, 1)
            with torch.inference_mode():
                return job(context)
        finally:
            torch.set_num_threads(threads)
            os.sched_setaffinity(0, mask)
    return _spawn(job, spec)


def _stop_ranks(ranks: list, grace_s: float = 2.0) -> None:
    """End rank processes now (SIGTERM, then SIGKILL after ``grace_s``) and reap them.

    On an interrupt the parent must not wait for its ranks: ``multiprocessing`` joins live
    children at exit, so a benchmark's ranks would otherwise finish their whole run first.
    """
    import time

    for process in ranks:
        if process.is_alive():
            process.terminate()
    deadline = time.monotonic() + grace_s
    for process in ranks:
        process.join(timeout=max(0.0, deadline - time.monotonic()))
    for process in ranks:
        if process.is_alive():
            process.kill()
            process.join(timeout=1.0)


def _spawn(job: Callable[[RankContext], Any], spec: LaunchSpec) -> Any:
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    before = set(mp.active_children())
    try:
        processes = mp.start_processes(
            _spawned, args=(job, spec, free_port(), results), nprocs=spec.tp, join=False, start_method="spawn"
        )
    except BaseException:  # interrupted while starting: end the ranks already started
        _stop_ranks([p for p in mp.active_children() if p not in before])
        raise
    messages: list[tuple[str, Any]] = []
    failure: Exception | None = None
    try:
        while True:
            try:  # drain while the ranks run, so a large result never blocks a rank's exit
                messages.append(results.get(timeout=0.05))
            except queue_module.Empty:
                pass
            try:
                if processes.join(timeout=0.05):
                    break
            except Exception as exc:  # a rank failed; join() has stopped the others
                failure = exc
                break
    except BaseException:  # Interrupted (SIGINT/SIGTERM): stop the ranks instead of waiting for them
        _stop_ranks(processes.processes)
        raise
    while True:
        try:
            messages.append(results.get(timeout=0.2))
        except queue_module.Empty:
            break
    for kind, payload in messages:
        if kind == "error":
            raise LadderizeError(payload)
    for kind, payload in messages:
        if kind == "crash":
            raise RuntimeError(f"a rank crashed:\n{payload}")
    if failure is not None:
        raise RuntimeError(f"a rank failed: {failure}") from failure
    for kind, payload in messages:
        if kind == "ok":
            return payload
    raise RuntimeError("the ranks finished without a result")


__all__ = ["LaunchSpec", "RankContext", "check_machine", "free_port", "run_ranks"]
