"""The communication plan: which modules run, what residual each reads, and how each all-reduce is issued.

This is the runtime's one place that turns a ``Layout`` and a benchmark *schedule* into
steps. It reads the layout's mode program (``Layout.program()``, one ``ModuleOp`` per
module), and re-derives nothing:

- an attention module without an all-reduce (SPD) is fused with its MLP into one SPD block
  step with a single all-reduce; every other module is a step of its own;
- a step reads ``r_{k-2}`` when its module reads the stale residual;
- a step carries its ``ModuleOp``s, which the rank model runs through ``model/residual.py``'s
  ``ResidualStream`` (the interpreter the HF and vLLM models use too);
- a step's all-reduce is issued with ``async_op=True`` and waited on one step later exactly
  when the program says it overlaps the next module (``ModuleOp.overlaps_next``); every other
  all-reduce is blocking. So ``inspect``'s overlappable count is this plan's by construction.

Schedules (applicable to any checkpoint):

- ``native``: the checkpoint's own layout.
- ``dense``: the same weights, every layer dense (blocking all-reduces).
- ``upper-bound``: dense math with no communication at all. Wrong outputs; the speed ceiling.
- ``domino``: dense math, the batch split into ``chunks`` micro-batches; every all-reduce
  is asynchronous and waited on only when the same chunk needs it, so chunk i's all-reduce
  overlaps chunk i+1's compute. With one chunk (a batch of 1 cannot be split) it is the
  dense plan, and the bench reports the dense row's timings for it (speed-up exactly 1).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from ..errors import LadderizeError, parse_choice
from ..model.layout import Layout, ModuleKind, ModuleOp


class Schedule(str, enum.Enum):
    NATIVE = "native"
    DENSE = "dense"
    UPPER_BOUND = "upper-bound"
    DOMINO = "domino"

    @classmethod
    def parse(cls, text: str) -> "Schedule":
        return parse_choice(cls, text, "schedule")


class StepKind(str, enum.Enum):
    ATTENTION = "attention"
    MLP = "mlp"
    SPD_BLOCK = "spd_block"  # attention and MLP with one all-reduce (Sync-Point Drop)


@dataclass(frozen=True)
class Step:
    """One module (or fused SPD block) of the forward pass: the ``ModuleOp``s it runs, and how its all-reduce is issued.

    ``layer``, ``kind`` and ``reads_stale`` describe ``ops`` (derived from them); the runtime runs
    ``ops`` through ``model/residual.ResidualStream``, with ``overlapped`` as the all-reduce's ``async_op``.
    """

    layer: int
    kind: StepKind
    reads_stale: bool  # reads r_{k-2} (ladder) instead of r_{k-1}
    overlapped: bool  # its all-reduce is issued async and waited on one step later
    ops: tuple[ModuleOp, ...] = ()  # the program's modules of this step: one, or an SPD block's two


@dataclass(frozen=True)
class CommPlan:
    """Steps of one forward pass plus how the ranks communicate."""

    schedule: Schedule
    layout: Layout  # the layout whose math is run (native, or all dense)
    steps: tuple[Step, ...]
    communicate: bool  # False: upper-bound, every all-reduce is skipped
    chunks: int = 1  # domino micro-batches (1 when the batch cannot be split)

    @property
    def allreduces_per_forward(self) -> int:
        """All-reduces one forward pass issues on each rank (per chunk count included)."""
        return len(self.steps) * self.chunks if self.communicate else 0

    @property
    def overlapped_allreduces(self) -> int:
        if not self.communicate:
            return 0
        if self.schedule is Schedule.DOMINO:  # every all-reduce but the last chunk's final one has compute behind it
            return len(self.steps) * self.chunks - 1 if self.chunks > 1 else 0
        return sum(step.overlapped for step in self.steps)

    def describe(self) -> str:
        extra = f", {self.chunks} chunks" if self.chunks > 1 else ""
        return f"{self.schedule.value} ({self.layout.describe()}{extra})"


def layer_steps(layout: Layout) -> list[tuple[int, StepKind, bool, bool, tuple[ModuleOp, ...]]]:
    """``(layer, kind, reads_stale, overlaps_next, ops)`` of every step, in order; SPD layers give one fused
    block (its attention op, which has no all-reduce, and its MLP op)."""
    steps = []
    held: tuple[ModuleOp, ...] = ()
    for op in layout.program():
        if op.kind is ModuleKind.ATTENTION and not op.allreduce:
            held = (op,)  # fused into the SPD block step that its MLP ends
            continue
        kind = StepKind.SPD_BLOCK if op.reads_local_partial else StepKind(op.kind.value)
        steps.append((op.layer, kind, op.reads_stale, op.overlaps_next, held + (op,)))
        held = ()
    return steps


def build_plan(layout: Layout, schedule: Schedule | str = Schedule.NATIVE, chunks: int = 1) -> CommPlan:
    """The communication plan of ``layout`` under ``schedule`` (``chunks`` applies to domino only)."""
    schedule = Schedule.parse(schedule) if isinstance(schedule, str) else schedule
    math_layout = layout if schedule is Schedule.NATIVE else Layout.dense(layout.num_layers)
    domino = schedule is Schedule.DOMINO
    if chunks < 1:
        raise LadderizeError(f"domino needs at least 1 chunk, got {chunks}")
    chunks = chunks if domino else 1
    split = domino and chunks > 1  # domino with one chunk (a batch of 1) is the dense path, step for step
    steps = tuple(
        # domino: every all-reduce is async; a chunk waits for its own result when it next needs it
        Step(layer, kind, stale, overlapped=split or overlaps, ops=ops)
        for layer, kind, stale, overlaps, ops in layer_steps(math_layout)
    )
    return CommPlan(schedule, math_layout, steps, communicate=schedule is not Schedule.UPPER_BOUND, chunks=chunks)


def domino_chunks_for(batch: int, chunks: int) -> int:
    """Micro-batches domino can use at this batch size (a batch of 1 cannot be split)."""
    return max(1, min(chunks, batch))


__all__ = ["CommPlan", "Schedule", "Step", "StepKind", "build_plan", "domino_chunks_for", "layer_steps"]
