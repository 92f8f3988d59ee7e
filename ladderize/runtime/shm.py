"""Shared-memory all-reduce for ranks on one host, behind the ``Communicator`` interface.

On one host, gloo all-reduces over TCP loopback: about 0.5-1 ms per call on the 2-core
test machine, more than a decode module's compute. Here the ranks instead share one POSIX
shared-memory segment (``shm.c``, compiled on first use with the helper in ``gemv.py``):
each rank copies its partial into its own slot and bumps a counter; a rank that needs the
sum waits for its peers' counters and adds all slots in rank order 0..N-1. Every rank adds
the same numbers in the same order, so all ranks hold bit-identical sums:

- float32: ``((x_0 + x_1) + x_2) + ...``. At TP=2 this equals gloo's sum bit for bit
  (IEEE addition of two numbers is commutative); at TP >= 3 gloo's ring order may differ
  in the last bits.
- bfloat16: summed in float32 in the same order, rounded once to bfloat16 (nearest even).
  At TP=2 that equals gloo's bfloat16 sum (which also adds in float32 and rounds once).

Two forms, as gloo offers them: blocking (``async_op=False``: issue and reduce at once),
and issue-now-wait-later (``async_op=True``): the issue only copies the partial in and
posts it (a few microseconds), and ``wait()`` waits for the peers and sums. So while a
ladder module computes, the slower peer's partial arrives, and the wait that dense would
spend blocked is hidden. No helper thread: on a 2-core machine with one compute thread per
rank, a thread that reduces in the background would take the core from compute.

Tensors above the chunk size (512 KiB per rank, prefill-sized) run as a sequence of
chunks, blocking. Other dtypes (float16, ...) fall back to the gloo process group.

Hygiene: rank 0 creates the segment with a name unique to the run (``ladderize-shm-<pid>-<random>``,
exclusive create), the others open it, and once every rank has mapped it (a gloo barrier)
rank 0 unlinks the name. From then on nothing is left in ``/dev/shm`` whatever happens:
the kernel frees the memory when the last rank exits, be it normally, on Ctrl-C or when
killed. A rank whose peer died while it waits raises instead of hanging.
"""

from __future__ import annotations

import collections
import ctypes
import functools
import os
import platform
import secrets
import subprocess
import time
from pathlib import Path

import torch
import torch.distributed as dist

from ..errors import LadderizeError
from .allreduce import Communicator, InFlight

SOURCE = Path(__file__).with_name("shm.c")
FLAGS = ("-O3", "-shared", "-fPIC")
LIBS = ("-lrt",)
PREFIX = "ladderize-shm-"
DTYPES = {torch.float32: 0, torch.bfloat16: 1}
OK, TIMEOUT, PEER_DEAD = 0, 1, 2
SLICE_MS = 100.0  # a wait returns to Python this often (signals, time limit, dead peers)
SPIN_US = 200.0  # a waiting rank spins this long before it sleeps on a futex (its own core)
SPIN_US_OVERSUBSCRIBED = 2.0  # more ranks than cores: hand the core to the rank we wait for at once

_reason: str | None = None


@functools.lru_cache(maxsize=None)
def library() -> ctypes.CDLL | None:
    """The compiled ``shm.c`` (built on first use), or None; ``unavailable_reason()`` says why."""
    global _reason
    from .gemv import compile_library, find_compiler

    if platform.system() != "Linux":
        _reason = f"the shared-memory all-reduce needs Linux, not {platform.system()}"
        return None
    compiler = find_compiler()
    if compiler is None:
        _reason = "no C compiler found to build shm.c (set CC)"
        return None
    try:
        lib = ctypes.CDLL(str(compile_library(SOURCE, FLAGS, compiler, LIBS)), use_errno=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        detail = (getattr(exc, "stderr", None) or str(exc)).strip()
        _reason = f"building shm.c failed: {detail.splitlines()[-1] if detail else exc}"
        return None
    p, i64, u64 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_uint64
    signatures = {
        "lz_chunk_bytes": ([], i64), "lz_nslots": ([], i64), "lz_max_ranks": ([], i64),
        "lz_segment_bytes": ([i64], i64),
        "lz_map": ([ctypes.c_char_p, i64, ctypes.c_int], p),
        "lz_check": ([p, i64], ctypes.c_int),
        "lz_register": ([p, i64, i64], None),
        "lz_unmap": ([p, i64], ctypes.c_int),
        "lz_unlink": ([ctypes.c_char_p], ctypes.c_int),
        "lz_issue": ([p, i64, i64, u64, p, i64, ctypes.c_double, ctypes.c_double], ctypes.c_int),
        "lz_reduce": ([p, i64, i64, u64, p, i64, ctypes.c_int, ctypes.c_double, ctypes.c_double], ctypes.c_int),
    }
    for name, (args, res) in signatures.items():
        getattr(lib, name).argtypes, getattr(lib, name).restype = args, res
    return lib


def unavailable_reason() -> str | None:
    return _reason


def hostname() -> str:
    """This rank's host name for the same-host check (``$LADDERIZE_HOSTNAME`` overrides it, for tests)."""
    import socket

    return os.environ.get("LADDERIZE_HOSTNAME") or socket.gethostname()


def _sweep_stale() -> None:
    """Remove segments of earlier runs whose creator is gone (only a kill inside set-up's few ms leaves one)."""
    try:
        names = [n for n in os.listdir("/dev/shm") if n.startswith(PREFIX)]
    except OSError:
        return
    for name in names:
        try:
            pid = int(name[len(PREFIX):].split("-")[0])
            os.kill(pid, 0)
        except ProcessLookupError:
            try:
                os.unlink(f"/dev/shm/{name}")
            except OSError:
                pass
        except (ValueError, PermissionError):
            pass


class ShmSegment:
    """This rank's mapping of the run's segment; the name is unlinked as soon as all ranks hold it."""

    def __init__(self, rank: int, world: int, group=None):
        lib = library()
        if lib is None:
            raise LadderizeError(f"--comm shm is unavailable here: {unavailable_reason()}")
        if world > lib.lz_max_ranks():
            raise LadderizeError(f"--comm shm supports at most {lib.lz_max_ranks()} ranks, got {world}")
        self.lib, self.rank, self.world = lib, rank, world
        self.base: int | None = None
        name = [None]
        if rank == 0:
            _sweep_stale()
            name[0] = f"/{PREFIX}{os.getpid()}-{secrets.token_hex(6)}"
            self.base = lib.lz_map(name[0].encode(), world, 1)
            if not self.base:
                raise LadderizeError(f"cannot create shared memory {name[0]}: {os.strerror(ctypes.get_errno() or 12)}")
        try:
            dist.broadcast_object_list(name, src=0, group=group)
            self.name = name[0]
            if rank != 0:
                self.base = lib.lz_map(self.name.encode(), world, 0)
                if not self.base or lib.lz_check(self.base, world) != 0:
                    raise LadderizeError(f"rank {rank} cannot open shared memory {self.name}")
            lib.lz_register(self.base, rank, os.getpid())
            dist.barrier(group=group)  # every rank has mapped it and registered its pid
        finally:
            if rank == 0:
                lib.lz_unlink(self.name.encode())  # nothing persists from here on, even on SIGKILL
        self.chunk_bytes = lib.lz_chunk_bytes()
        self.nslots = lib.lz_nslots()

    def close(self) -> None:
        if self.base:
            self.lib.lz_unmap(self.base, self.world)
            self.base = None


class _ShmWork:
    """A posted round; ``wait()`` waits for the peers and sums into the tensor (in place)."""

    __slots__ = ("comm", "round", "tensor", "out", "done")

    def __init__(self, comm: "ShmCommunicator", round_: int, tensor: torch.Tensor, out: torch.Tensor):
        self.comm, self.round, self.tensor, self.out, self.done = comm, round_, tensor, out, False

    def wait(self) -> None:
        self.comm._complete_through(self)


class ShmCommunicator(Communicator):
    """``Communicator`` whose all-reduces of float32/bfloat16 CPU tensors go through shared memory."""

    def __init__(self, world_size: int, rank: int, group=None, spin_us: float = SPIN_US, timeout_s: float = 600.0):
        super().__init__(world_size=world_size, group=group)
        self.rank, self.spin_us, self.timeout_s = rank, spin_us, timeout_s
        self.segment = ShmSegment(rank, world_size, group)
        self.round = 0
        self.pending: collections.deque[_ShmWork] = collections.deque()

    @property
    def transport(self) -> str:
        return "shm"

    def all_reduce(self, partial: torch.Tensor, async_op: bool, communicate: bool = True) -> InFlight:
        if not (communicate and self.active):
            return InFlight(partial, None, None)
        if partial.dtype not in DTYPES or partial.device.type != "cpu":
            self._drain()  # keep the order of rounds simple: nothing of ours in flight beside gloo's
            return super().all_reduce(partial, async_op, communicate)
        self.stats.allreduce_count += 1
        nbytes = partial.numel() * partial.element_size()
        self.stats.bytes_reduced += nbytes
        start = time.perf_counter()
        flat = partial.reshape(-1) if partial.is_contiguous() else partial.contiguous().reshape(-1)
        if nbytes > self.segment.chunk_bytes:
            self._drain()
            step = self.segment.chunk_bytes // partial.element_size()
            for lo in range(0, flat.numel(), step):
                piece = flat[lo : lo + step]
                self._complete_through(self._issue(piece, piece))
            work = None
        else:
            work = self._issue(flat, flat)
            if not async_op:
                self._complete_through(work)
                work = None
        if flat.data_ptr() != partial.data_ptr():
            if work is not None:  # a non-contiguous partial: finish now so the copy back has the sum
                self._complete_through(work)
                work = None
            partial.copy_(flat.view_as(partial))
        self.stats.issue_s += time.perf_counter() - start
        return InFlight(partial, work, self.stats)

    def _issue(self, source: torch.Tensor, out: torch.Tensor) -> _ShmWork:
        while len(self.pending) >= self.segment.nslots - 1:  # a slot is reused NSLOTS rounds later
            self._complete_through(self.pending[0])
        self.round += 1
        seg = self.segment
        nbytes = source.numel() * source.element_size()
        self._call(seg.lib.lz_issue, seg.base, seg.world, seg.rank, self.round, source.data_ptr(), nbytes,
                   self.spin_us, SLICE_MS)
        work = _ShmWork(self, self.round, source, out)
        self.pending.append(work)
        return work

    def _complete_through(self, work: _ShmWork) -> None:
        """Reduce every pending round up to and including ``work``'s, oldest first."""
        seg = self.segment
        while not work.done:
            head = self.pending.popleft()
            self._call(seg.lib.lz_reduce, seg.base, seg.world, seg.rank, head.round, head.out.data_ptr(),
                       head.out.numel(), DTYPES[head.out.dtype], self.spin_us, SLICE_MS)
            head.done = True

    def _drain(self) -> None:
        if self.pending:
            self._complete_through(self.pending[-1])

    def _call(self, fn, *args) -> None:
        deadline = time.monotonic() + self.timeout_s
        while True:
            status = fn(*args)  # returns every SLICE_MS: Python gets to run signal handlers (Ctrl-C)
            if status == OK:
                return
            if status == PEER_DEAD:
                raise RuntimeError(f"rank {self.rank}: a peer rank died during a shared-memory all-reduce")
            if time.monotonic() > deadline:
                raise RuntimeError(f"rank {self.rank}: shared-memory all-reduce timed out after {self.timeout_s:.0f} s")

    def close(self) -> None:
        self.pending.clear()
        self.segment.close()


def choose_comm(comm: str, device_type: str, hostnames: list[str] | None) -> str:
    """The all-reduce transport for ``--comm`` (auto|shm|gloo|nccl) given every rank's host name.

    ``auto``: NCCL on CUDA; on CPU shared memory when every rank is on this host, else gloo.
    ``shm`` across hosts is refused (one line).
    """
    same_host = hostnames is not None and len(set(hostnames)) == 1
    if comm == "auto":
        if device_type == "cuda":
            return "nccl"
        return "shm" if same_host and library() is not None else "gloo"
    if comm == "shm" and not same_host:
        hosts = ", ".join(sorted(set(hostnames or [])))
        raise LadderizeError(f"--comm shm needs every rank on one host, but the ranks run on {hosts}; use --comm gloo")
    return comm


__all__ = ["ShmCommunicator", "ShmSegment", "choose_comm", "hostname", "library", "unavailable_reason"]
