"""How ``ladderize predict`` prices a module: the ``ComputeModel`` protocol, the roofline estimate, the choice.

* ``RooflineCompute``: a ``GPUProfile``'s published peaks and fitted ``ComputeFit`` (``ladderize.predict.fit``):
  ``max(memory seconds, FLOP seconds) + per-kind fixed cost``.
* ``MeasuredCompute`` (``ladderize.predict.measured``): the runtime's own modules timed on the local device.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from ..errors import LadderizeError
from .gpus import GPUProfile
from .work import ModuleWork


class ComputeModel(Protocol):
    """Anything that prices a module: ``label`` names the method and device for the output."""

    label: str
    device_name: str
    is_gpu: bool
    memory_bytes: float  # one device's memory; 0 when unknown (CPU)
    # compute-bound GEMMs run as one wave of persistent CTAs (``GPUProfile.persistent_gemm_grid``): an overlapped
    # all-reduce costs them a second wave (``InterconnectProfile.overlap_slowdown_for``)
    one_wave_gemms: bool

    def module_s(self, work: ModuleWork) -> float: ...

    def source(self, work: ModuleWork) -> str: ...


class RooflineCompute:
    """Estimate modules from a GPU profile's peaks and calibrated efficiencies."""

    def __init__(self, gpu: GPUProfile):
        self.gpu = gpu
        self.device_name = gpu.name
        self.is_gpu = False  # nothing ran on a GPU
        self.memory_bytes = gpu.memory_bytes
        self.one_wave_gemms = gpu.persistent_gemm_grid
        self.label = f"roofline estimate for {gpu.name} (fitted compute model)"

    def module_s(self, work: ModuleWork) -> float:
        return self.gpu.fit.module_s(work, self.gpu.peak_flops_per_s)

    def source(self, work: ModuleWork) -> str:
        return f"roofline {self.gpu.name}"


def make_compute(
    mode: str, gpu: GPUProfile | None = None, cache_dir: Path | str | None = None, device: str | None = None
) -> ComputeModel:
    """``measured`` (on ``device``, ``auto`` by default) or ``roofline`` (needs a GPU profile)."""
    if mode == "roofline":
        if gpu is None:
            raise LadderizeError("--compute roofline needs a GPU profile (--gpu h100|h100-gpt-fast|h200|a100|FILE)")
        return RooflineCompute(gpu)
    if mode == "measured":
        from .measured import MeasuredCompute

        return MeasuredCompute(cache_dir=cache_dir, device=device)
    raise LadderizeError(f"unknown compute mode {mode!r}: choose 'measured' or 'roofline'")
