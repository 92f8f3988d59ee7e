"""How ``ladderize predict`` prices a module: the ``ComputeModel`` protocol, the roofline estimate, the choice.

* ``RooflineCompute``: ``max(flops / achievable FLOP/s, bytes / achievable bytes/s) + module overhead``
  with a ``GPUProfile`` (published peaks, calibrated efficiencies).
* ``MeasuredCompute`` (``ladderize.predict.measured``): the runtime's own modules timed on the local device.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from ..errors import LadderizeError
from .gpus import GPUProfile
from .work import ModuleWork, roofline_s


class ComputeModel(Protocol):
    """Anything that prices a module: ``label`` names the method and device for the output."""

    label: str
    device_name: str
    is_gpu: bool
    memory_bytes: float  # one device's memory; 0 when unknown (CPU)

    def module_s(self, work: ModuleWork) -> float: ...

    def source(self, work: ModuleWork) -> str: ...


class RooflineCompute:
    """Estimate modules from a GPU profile's peaks and calibrated efficiencies."""

    def __init__(self, gpu: GPUProfile):
        self.gpu = gpu
        self.device_name = gpu.name
        self.is_gpu = False  # nothing ran on a GPU
        self.memory_bytes = gpu.memory_bytes
        self.label = f"roofline estimate for {gpu.name} (efficiencies fitted on H100)"

    def module_s(self, work: ModuleWork) -> float:
        g = self.gpu
        return roofline_s(
            work, g.peak_flops_per_s * g.flops_efficiency, g.hbm_bytes_per_s * g.bandwidth_efficiency, g.module_overhead_s
        )

    def source(self, work: ModuleWork) -> str:
        return f"roofline {self.gpu.name}"


def make_compute(
    mode: str, gpu: GPUProfile | None = None, cache_dir: Path | str | None = None, device: str | None = None
) -> ComputeModel:
    """``measured`` (on ``device``, ``auto`` by default) or ``roofline`` (needs a GPU profile)."""
    if mode == "roofline":
        if gpu is None:
            raise LadderizeError("--compute roofline needs a GPU profile (--gpu h100|h200|a100)")
        return RooflineCompute(gpu)
    if mode == "measured":
        from .measured import MeasuredCompute

        return MeasuredCompute(cache_dir=cache_dir, device=device)
    raise LadderizeError(f"unknown compute mode {mode!r}: choose 'measured' or 'roofline'")
