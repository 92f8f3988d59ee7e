"""The losses of a joint training's latest steps, kept on the device and read together when they are logged.

Reading a loss on the host (``.item()``, ``.tolist()``) waits for the device to finish every step queued before it;
a step that reads nothing is queued behind the last one and the device never idles. ``PendingLosses`` keeps each
step's losses as tensors beside the step's record and reads them into the curve at once: one wait and, under a
launcher, one all-reduce for all of them. ``log_every`` says how often: every 10 steps on CUDA, every step on a
CPU (where the host is the device and a read costs nothing).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

LOG_EVERY_CUDA = 10  # steps between reads of the losses on a GPU (each read waits for the device)
LOG_EVERY_CPU = 1


def log_every(device: torch.device) -> int:
    """Optimizer steps between two reads of the losses on ``device``."""
    return LOG_EVERY_CUDA if device.type == "cuda" else LOG_EVERY_CPU


class PendingLosses:
    """The steps trained since the losses were last read: each one's record and its losses, still on the device.

    ``mean_across``: the mean of a tensor over the launched processes (all of them call it at once), or None for
    one process."""

    def __init__(self, mean_across: Callable[[torch.Tensor], torch.Tensor] | None = None):
        self.mean_across = mean_across
        self._steps: list[tuple[dict, dict[str, torch.Tensor]]] = []

    def __len__(self) -> int:
        return len(self._steps)

    def add(self, record: dict, losses: dict[str, torch.Tensor]) -> None:
        """One step's ``record`` (step, tokens, times, lr) and its losses by name (scalar tensors, not read)."""
        self._steps.append((record, losses))

    def flush(self, curve: list[dict]) -> None:
        """Append every pending step to ``curve``, its losses read (and averaged over the processes) as
        ``loss_<name>`` floats."""
        if not self._steps:
            return
        names = list(self._steps[0][1])
        stacked = torch.stack([torch.stack([losses[n].detach().float() for n in names]) for _, losses in self._steps])
        if self.mean_across is not None:
            stacked = self.mean_across(stacked)
        for (record, _), values in zip(self._steps, stacked.tolist()):
            curve.append({**record, **{f"loss_{n}": v for n, v in zip(names, values)}})
        self._steps.clear()


class TrainingLog:
    """A joint training's record as its steps end: each step's losses kept pending (``PendingLosses``) and, at a
    logged step, read into ``curve``, with that window's rate, the projected time once ``PROJECT_AFTER_STEPS`` steps
    past the first window (its one-time costs) have run, and the progress report (``report``, the main process's).
    Both joint trainings (``replicated.py``, ``sharded.py``) keep their record through it."""

    def __init__(self, pending: PendingLosses, curve: list[dict], *, train_s: float, total_steps: int,
                 tokens_per_step: int, pace: Any, say: Callable[[str], None],
                 report: Callable[[Any], None] | None):
        self.pending, self.curve = pending, curve
        self.total_steps, self.tokens_per_step, self.pace, self.say, self.report = (total_steps, tokens_per_step, pace,
                                                                                   say, report)
        self.logged_s = train_s
        self.first_window: tuple[int, float] | None = None  # (step, train_s) after the first logged window
        self.projected = False

    def step_ended(self, step: int, tokens: int, train_s: float, cpu_s: float, lr: float,
                   losses: dict[str, torch.Tensor], logged: bool) -> None:
        """Keep step ``step``'s record and losses; at a ``logged`` step, read the window into the curve and report."""
        from ..plan.config import StepInfo
        from ..plan.throughput import PROJECT_AFTER_STEPS, projection_line

        self.pending.add({"step": step, "tokens": tokens, "train_s": round(train_s, 3), "cpu_s": round(cpu_s, 3),
                          "lr": lr}, losses)
        if not logged:
            return
        rate = len(self.pending) * self.tokens_per_step / max(train_s - self.logged_s, 1e-9)
        self.logged_s = train_s
        self.pending.flush(self.curve)
        if self.first_window is None:
            self.first_window = (step, train_s)
        elif not self.projected and step - self.first_window[0] >= PROJECT_AFTER_STEPS and step < self.total_steps:
            self.projected = True
            self.say(projection_line(step - self.first_window[0], train_s - self.first_window[1],
                                     self.total_steps - step, self.total_steps, self.tokens_per_step, self.pace))
        if self.report is not None:
            now = {k.removeprefix("loss_"): v for k, v in self.curve[-1].items() if k.startswith("loss_")}
            self.report(StepInfo(step, self.total_steps, tokens, self.total_steps * self.tokens_per_step, now, lr,
                                 train_s, rate, pace=self.pace.per_process(rate) or None))
