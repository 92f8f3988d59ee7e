"""The hardware figures several packages read: each GPU's datasheet peaks, and this host's CPU cores.

``GPU_PEAKS`` holds what NVIDIA's datasheets give (dense BF16 tensor-core FLOP/s, i.e. without the 2:4-sparsity
doubling; HBM bandwidth; memory). predict's GPU profiles put their fitted compute models on them
(``predict/gpus.py``); adapt prices a launch (``adapt/plan/cost.py``) and reports MFU (``adapt/plan/throughput.py``) from
them. ``cpu_cores`` sizes the runtime's ranks and threads and the tokenizer's worker processes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Mapping


@dataclass(frozen=True)
class GPUPeaks:
    """One GPU model's datasheet figures, with where each comes from."""

    name: str
    peak_flops_per_s: float  # dense BF16 tensor-core FLOP/s
    hbm_bytes_per_s: float
    memory_bytes: float
    sources: Mapping[str, str] = field(default_factory=dict)


GPU_PEAKS: dict[str, GPUPeaks] = {
    "h100": GPUPeaks(
        name="H100-SXM5-80GB", peak_flops_per_s=989e12, hbm_bytes_per_s=3.35e12, memory_bytes=80e9,
        sources={
            "hbm_bytes_per_s": "NVIDIA H100 Tensor Core GPU datasheet: H100 SXM GPU memory bandwidth 3.35 TB/s, 80 GB",
            "peak_flops_per_s": "NVIDIA H100 datasheet: BF16 Tensor Core 1,979 TFLOPS with sparsity, so 989 dense",
        },
    ),
    "h200": GPUPeaks(
        name="H200-SXM-141GB", peak_flops_per_s=989e12, hbm_bytes_per_s=4.8e12, memory_bytes=141e9,
        sources={
            "hbm_bytes_per_s": "NVIDIA H200 Tensor Core GPU datasheet: H200 SXM GPU memory bandwidth 4.8 TB/s, 141 GB",
            "peak_flops_per_s": "NVIDIA H200 datasheet: BF16 Tensor Core 1,979 TFLOPS with sparsity, so 989 dense",
        },
    ),
    "a100": GPUPeaks(
        name="A100-SXM4-80GB", peak_flops_per_s=312e12, hbm_bytes_per_s=2.039e12, memory_bytes=80e9,
        sources={
            "hbm_bytes_per_s": "NVIDIA A100 Tensor Core GPU datasheet: A100 80GB SXM GPU memory bandwidth 2,039 GB/s, 80 GB",
            "peak_flops_per_s": "NVIDIA A100 datasheet: BF16 Tensor Core 312 TFLOPS (624 with sparsity)",
        },
    ),
}


def gpu_named(device_name: str) -> str | None:
    """The ``GPU_PEAKS`` key of a device name as CUDA reports it (``NVIDIA H100 80GB HBM3`` -> ``h100``), else None."""
    name = device_name.upper()
    return next((key for key in ("h200", "h100", "a100") if key.upper() in name), None)


def cpu_cores() -> int:
    """The CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


__all__ = ["GPU_PEAKS", "GPUPeaks", "cpu_cores", "gpu_named"]
