"""The machine the ranks start on, read without torch: whether CUDA can be used, and the rule that more ranks than
cores (``hardware.cpu_cores``) needs ``--oversubscribe`` (``launch.check_machine`` applies it; the command line checks
it before torch loads). Whether a launcher started this process is ``checkpoint.placement.this_launch``'s."""

from __future__ import annotations

import os

from ..errors import LadderizeError
from ..hardware import cpu_cores


def check_cores(tp: int, local: int, oversubscribe: bool) -> None:
    """Refuse ``local`` CPU ranks (of ``--tp tp``) on fewer cores unless ``oversubscribe``: one line."""
    if local > cpu_cores() and not oversubscribe:
        raise LadderizeError(
            f"--tp {tp} starts {local} processes on this machine but it has only {cpu_cores()} CPU cores; "
            "pass --oversubscribe to run anyway (timings will not mean much)"
        )


def no_cuda_here() -> bool:
    """Whether CUDA surely cannot be used, known without torch: no NVIDIA driver, or no visible device. (False means
    only that torch must be asked.)"""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return True
    return not os.path.exists("/proc/driver/nvidia") and not os.path.exists("/dev/nvidia0")


__all__ = ["check_cores", "no_cuda_here"]
