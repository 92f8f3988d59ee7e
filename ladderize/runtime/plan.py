"""The communication plan: which modules run, what residual each reads, and how each all-reduce is issued.

This is the runtime's one place that turns a ``Layout`` (per-layer ``LayerMode``) and a
benchmark *schedule* into steps. It branches only on the mode's properties:

- ``LayerMode.syncs_attention``: ``False`` fuses attention and MLP into one SPD block step
  with a single all-reduce; ``True`` gives two steps (attention, MLP), one all-reduce each.
- ``LayerMode.reads_stale_residual``: the step reads ``r_{k-2}`` instead of ``r_{k-1}``.

From those the rule for overlap follows: the all-reduce of step k may still be in flight
while step k+1 computes exactly when step k+1 reads the stale residual. So it is issued
with ``async_op=True`` and waited on one step later; every other all-reduce is blocking.
In a ladder layer both all-reduces but the very last one overlap; the MLP all-reduce of
the last dense layer before a ladder layer overlaps too (the first ladder attention reads
that layer's post-attention state), and so does the SPD block's all-reduce before a
ladder layer (the ladder attention reads the SPD block's input).

Schedules (applicable to any checkpoint):

- ``native``: the checkpoint's own layout.
- ``dense``: the same weights, every layer dense (blocking all-reduces).
- ``upper-bound``: dense math with no communication at all. Wrong outputs; the speed ceiling.
- ``domino``: dense math, the batch split into ``chunks`` micro-batches; every all-reduce
  is asynchronous and waited on only when the same chunk needs it, so chunk i's all-reduce
  overlaps chunk i+1's compute.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from ..errors import LadderizeError, parse_choice
from ..model.layout import Layout


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
    """One module (or fused SPD block) of the forward pass."""

    layer: int
    kind: StepKind
    reads_stale: bool  # reads r_{k-2} (ladder) instead of r_{k-1}
    overlapped: bool  # its all-reduce is issued async and waited on one step later


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


def layer_steps(layout: Layout) -> list[tuple[int, StepKind, bool]]:
    """``(layer, kind, reads_stale)`` of every module, in order; SPD layers give one fused block."""
    steps = []
    for layer, mode in enumerate(layout.modes):
        stale = mode.reads_stale_residual
        if mode.syncs_attention:
            steps.append((layer, StepKind.ATTENTION, stale))
            steps.append((layer, StepKind.MLP, stale))
        else:
            steps.append((layer, StepKind.SPD_BLOCK, stale))
    return steps


def build_plan(layout: Layout, schedule: Schedule | str = Schedule.NATIVE, chunks: int = 1) -> CommPlan:
    """The communication plan of ``layout`` under ``schedule`` (``chunks`` applies to domino only)."""
    schedule = Schedule.parse(schedule) if isinstance(schedule, str) else schedule
    math_layout = layout if schedule is Schedule.NATIVE else Layout.dense(layout.num_layers)
    raw = layer_steps(math_layout)
    domino = schedule is Schedule.DOMINO
    steps = tuple(
        # domino: every all-reduce is async; a chunk waits for its own result when it next needs it
        Step(layer, kind, stale, overlapped=domino or (index + 1 < len(raw) and raw[index + 1][2]))
        for index, (layer, kind, stale) in enumerate(raw)
    )
    if chunks < 1:
        raise LadderizeError(f"domino needs at least 1 chunk, got {chunks}")
    chunks = chunks if domino else 1
    return CommPlan(schedule, math_layout, steps, communicate=schedule is not Schedule.UPPER_BOUND, chunks=chunks)


def domino_chunks_for(batch: int, chunks: int) -> int:
    """Micro-batches domino can use at this batch size (a batch of 1 cannot be split)."""
    return max(1, min(chunks, batch))


__all__ = ["CommPlan", "Schedule", "Step", "StepKind", "build_plan", "domino_chunks_for", "layer_steps"]
