"""A wall budget's deadline for one stage, kept by the main process's clock so that every process stops together.

The recipe gives each stage of a wall budget the time its plan expects (``recipe_run.run_recipe``), on
``time.perf_counter()``'s clock. Both trainings read it here: the joint training stops at the first step that ends past
it (``past``); the sequential training also shortens the windows it has not trained yet to the time left, at the pace
its steps ran so far (``fitted``, the time model's ``stage_clock.fit_steps``). Under a launcher the main process's
clock decides for every process (one broadcast, which every process calls at the same step), so the processes never
disagree on a step count.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ..process_group import main_says
from ..plan.stage_clock import fit_steps


@dataclass(frozen=True)
class Deadline:
    """When a stage should end (``at``, ``time.perf_counter()``'s clock on the main process; None: no deadline), read
    on ``device`` (where the broadcast of a launch runs)."""

    at: float | None
    device: torch.device | str = "cpu"

    def past(self) -> bool:
        """Whether the main process's clock is past the deadline, on every process (collective under a launcher)."""
        if self.at is None:
            return False
        return bool(main_says((1 if time.perf_counter() >= self.at else 0,), self.device)[0])

    def fitted(self, planned: dict[int, int], spent_s: float, steps_done: int) -> dict[int, int]:
        """``planned`` steps (per window) that fit the time left at the pace ``steps_done`` steps took ``spent_s``, as
        the main process reckons them (collective under a launcher); ``planned`` without a deadline."""
        if self.at is None:
            return dict(planned)
        mine = fit_steps(planned, self.at - time.perf_counter(), spent_s, steps_done)
        keys = sorted(planned)
        return dict(zip(keys, main_says(tuple(mine[key] for key in keys), self.device)))
