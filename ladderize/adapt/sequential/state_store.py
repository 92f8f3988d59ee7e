"""Where the sequential training keeps the calibration states: in memory, or in memory-mapped files on disk.

The states (``[N, S, D]`` residual-stream tensors of the calibration set, a few per layer
boundary) are the one part of the training's memory that grows with the calibration set.
``StateStore(directory)`` hands out tensors backed by files in ``directory`` (shared
memory maps): the kernel writes their pages back and drops them under memory pressure,
where anonymous memory would have nowhere to go on a machine without swap. Each file is
unlinked as soon as it is mapped, so its disk space returns when the tensor is freed or
the process ends, even after a kill; nothing is left to clean up. ``StateStore(None)``
hands out ordinary tensors: on ``device`` (the training device, when the states fit there),
or in pinned host memory (``pin``), from which copies to a CUDA device do not block. The values
are the same either way.
"""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path

import numpy as np
import torch

from ...errors import LadderizeError


class StateStore:
    """Allocates state tensors in memory (``directory=None``; on ``device``, or pinned host memory with ``pin``)
    or as memory-mapped files in ``directory``."""

    def __init__(self, directory: Path | None = None, device: torch.device | str | None = None, pin: bool = False):
        self.directory = None if directory is None else Path(directory)
        self.device = torch.device("cpu" if device is None or directory is not None else device)
        self.pin = pin and self.device.type == "cpu" and directory is None and torch.cuda.is_available()
        self.allocated_bytes = 0  # total handed out (freed tensors included)

    @property
    def on_disk(self) -> bool:
        return self.directory is not None

    @property
    def where(self) -> str:
        """Where the states live, for messages."""
        if self.on_disk:
            return "memory-mapped files"
        if self.device.type != "cpu":
            return f"{self.device} memory"
        return "pinned host memory" if self.pin else "memory"

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """An uninitialised tensor of ``shape`` and ``dtype``."""
        nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        self.allocated_bytes += nbytes
        if self.directory is None:
            return torch.empty(shape, dtype=dtype, device=self.device, pin_memory=self.pin)
        self.directory.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=self.directory, prefix=".calibration-state-", suffix=".bin")
        try:
            os.ftruncate(fd, max(nbytes, 1))
            mapped = np.memmap(name, dtype=np.uint8, mode="r+", shape=(max(nbytes, 1),))
        except OSError as exc:
            raise LadderizeError(f"cannot map a {nbytes:,}-byte state file in {self.directory}: {exc.strerror or exc}") from None
        finally:
            os.close(fd)
            os.unlink(name)  # the map keeps the file alive until the tensor is freed
        return torch.from_numpy(mapped)[:nbytes].view(dtype).view(shape)
