"""The schedule simulator: one forward step of a TP model as two streams, compute and communication.

Pure functions, no torch. Inputs are per-module compute times and per-all-reduce times; the output is
the step's latency. The layout's mode program (``module_program``, the same one the model, the runtime and ``inspect``
read) decides the dependencies:

* a module waits for the all-reduces up to the state it reads (``ModuleOp.reads``: one module back
  for dense and spd, two for ladder);
* a module ends in an all-reduce when the program says so (``ModuleOp.allreduce``: spd's attention
  does not).

Streams are in-order queues, like a CUDA compute stream and an NCCL stream: a module starts when the
compute stream is free and the all-reduces it depends on have finished; an all-reduce starts when its
module has finished and the previous all-reduce is done. The final norm and LM head read the complete
residual, so they wait for every all-reduce.

While an all-reduce is in flight, compute runs at ``1 / (1 + overlap_slowdown)`` of its rate (the
collective's kernels hold SMs and memory bandwidth). Blocking schedules never overlap, so the slowdown
only touches schedules that overlap (ladder, domino).

Named schedules:

* ``dense``: every layer dense, blocking; the sum of compute and communication.
* ``ladder``: module k's all-reduce runs behind module k+1's compute; only the excess is exposed.
* ``spd``: the layout's SPD layers have no attention all-reduce.
* ``domino``: a dense model whose batch (or sequence) is split into chunks; chunk i's all-reduce runs
  behind chunk i+1's compute.
* ``upper-bound``: no communication at all.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Sequence

from ..model.layout import LayerMode, ModuleKind, module_program


@dataclass(frozen=True)
class ModuleCost:
    """One module (attention or MLP) of one rank: its compute time and the all-reduce that would end it."""

    compute_s: float
    allreduce_s: float


@dataclass(frozen=True)
class PlannedModule:
    """A module in program order. ``waits_for``: index of the last module whose all-reduce must be done first."""

    compute_s: float
    allreduce_s: float
    waits_for: int | None
    chunk: int = 0


@dataclass(frozen=True)
class StepTiming:
    """The simulated latency of one step and how it splits."""

    total_s: float
    compute_s: float
    allreduce_s: float
    num_allreduces: int

    @property
    def exposed_comm_s(self) -> float:
        """Time the step spends beyond pure compute: waiting for all-reduces, or slowed by them."""
        return max(0.0, self.total_s - self.compute_s)


def plan_modules(
    modes: Sequence[LayerMode],
    attention: ModuleCost,
    mlp: ModuleCost,
    chunks: int = 1,
    communicate: bool = True,
) -> list[PlannedModule]:
    """Lay out 2 * len(modes) modules per chunk in issue order (module-major, chunk-minor).

    Within a chunk, module k waits for the all-reduces up to the state the mode program says it reads
    (``r_{k-2}`` for ladder, ``r_{k-1}`` otherwise). Chunks are independent slices of
    the batch or the sequence, each with its own residual stream.
    """
    if chunks < 1:
        raise ValueError(f"chunks must be >= 1, got {chunks}")
    program = module_program(modes)
    has_allreduce = [communicate and op.allreduce for op in program]
    # Index (0-based) of the latest module at or before k that ends in an all-reduce.
    last_sync: list[int | None] = []
    latest: int | None = None
    for k, syncs in enumerate(has_allreduce):
        if syncs:
            latest = k
        last_sync.append(latest)

    planned: list[PlannedModule] = []
    for k, op in enumerate(program):
        cost = attention if op.kind is ModuleKind.ATTENTION else mlp
        waits_for = last_sync[op.reads - 1] if op.reads >= 1 else None  # r_j is complete after module j's all-reduce
        for chunk in range(chunks):
            planned.append(
                PlannedModule(cost.compute_s, cost.allreduce_s if has_allreduce[k] else 0.0, waits_for, chunk)
            )
    return planned


def _finish_compute(
    start_s: float, work_s: float, busy: Sequence[tuple[float, float]], busy_ends: Sequence[float], slowdown: float
) -> float:
    """End time of ``work_s`` of compute started at ``start_s``, slowed inside the comm-busy intervals.

    ``busy`` holds the all-reduce intervals in time order (the comm stream is in-order, so they do not
    overlap); ``busy_ends`` their end times, for a binary search.
    """
    if slowdown <= 0 or work_s <= 0:
        return start_s + work_s
    t, remaining = start_s, work_s
    for begin, end in busy[bisect.bisect_right(busy_ends, start_s):]:
        if begin > t:  # full-rate stretch before this interval
            gap = begin - t
            if remaining <= gap:
                return t + remaining
            remaining -= gap
            t = begin
        slow_work = (end - t) / (1.0 + slowdown)
        if remaining <= slow_work:
            return t + remaining * (1.0 + slowdown)
        remaining -= slow_work
        t = end
    return t + remaining


def simulate(planned: Sequence[PlannedModule], head_s: float = 0.0, overlap_slowdown: float = 0.0) -> StepTiming:
    """Run the planned modules on a compute stream and an in-order all-reduce stream."""
    compute_free = 0.0
    comm_free = 0.0
    busy: list[tuple[float, float]] = []  # all-reduce intervals, in order, non-overlapping
    busy_ends: list[float] = []
    # allreduce_done[(chunk, k)] is when the all-reduces of that chunk up to module k have finished.
    done_by_chunk: dict[int, dict[int, float]] = {}
    module_index: dict[int, int] = {}
    total_compute = total_comm = 0.0
    count = 0
    for module in planned:
        k = module_index.get(module.chunk, 0)
        module_index[module.chunk] = k + 1
        done = done_by_chunk.setdefault(module.chunk, {})
        ready = done.get(module.waits_for, 0.0) if module.waits_for is not None else 0.0
        start = max(compute_free, ready)
        end = _finish_compute(start, module.compute_s, busy, busy_ends, overlap_slowdown)
        compute_free = end
        total_compute += module.compute_s
        if module.allreduce_s > 0:
            ar_start = max(end, comm_free)
            comm_free = ar_start + module.allreduce_s
            busy.append((ar_start, comm_free))
            busy_ends.append(comm_free)
            done[k] = comm_free
            total_comm += module.allreduce_s
            count += 1
    head_start = max(compute_free, comm_free)
    total = head_start + head_s
    return StepTiming(total_s=total, compute_s=total_compute + head_s, allreduce_s=total_comm, num_allreduces=count)


def simulate_step(
    modes: Sequence[LayerMode],
    attention: ModuleCost,
    mlp: ModuleCost,
    head_s: float = 0.0,
    overlap_slowdown: float = 0.0,
    chunks: int = 1,
    communicate: bool = True,
) -> StepTiming:
    """Plan and simulate one step: ``attention``/``mlp`` are the per-chunk costs of every layer."""
    return simulate(plan_modules(modes, attention, mlp, chunks, communicate), head_s, overlap_slowdown)
