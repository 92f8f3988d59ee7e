"""The losses of a joint training's latest steps, kept on the device and read together when they are logged.

Reading a loss on the host (``.item()``, ``.tolist()``) waits for the device to finish every step queued before it;
a step that reads nothing is queued behind the last one and the device never idles. ``PendingLosses`` keeps each
step's losses as tensors beside the step's record and reads them into the curve at once: one wait and, under a
launcher, one all-reduce for all of them. ``log_every`` says how often: every 10 steps on CUDA, every step on a
CPU (where the host is the device and a read costs nothing).
"""

from __future__ import annotations

from collections.abc import Callable

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
