"""GPU profiles for the roofline compute estimate: published peaks plus calibrated efficiencies.

A module's roofline time on one rank is

    max(flops / (peak_flops_per_s * flops_efficiency), bytes / (hbm_bytes_per_s * bandwidth_efficiency))
    + module_overhead_s

The peaks come from NVIDIA's datasheets (dense BF16 tensor-core FLOP/s, i.e. without the 2:4-sparsity
doubling). The three efficiencies were fitted once, on H100, to the Ladder authors' published
no-communication ("upper bound") runs of Llama-3.1-70B; see ``ladderize.predict.calibration`` and
docs/predict.md for which logged latency fixed which number. H200 and A100 reuse the H100 fits: an
assumption, stated in their ``sources``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any, Mapping

from ..errors import LadderizeError

# Fitted by ladderize.predict.calibration.fit_gpu_efficiencies() on the authors' H100 logs
# (re-run it to check: tests/predict/test_calibration.py does).
H100_BANDWIDTH_EFFICIENCY = 0.9559
H100_FLOPS_EFFICIENCY = 0.3388
H100_MODULE_OVERHEAD_S = 18.17e-6

_CALIBRATED = (
    "fitted on H100 (ladderize.predict.calibration): bandwidth_efficiency and module_overhead_s from the "
    "upper-bound decode latencies of Llama-3.1-70B at TP8 and TP4, batch 1; flops_efficiency from the "
    "upper-bound prefill latency at TP8, batch 1 (logs in github.com/mayank31398/ladder-residual-inference, "
    "final-results-512/)"
)


@dataclass(frozen=True)
class GPUProfile:
    """One GPU model's published peaks and the achievable fractions the roofline applies to them."""

    name: str
    hbm_bytes_per_s: float
    peak_flops_per_s: float
    bandwidth_efficiency: float
    flops_efficiency: float
    module_overhead_s: float
    memory_bytes: float = 0.0
    sources: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.hbm_bytes_per_s <= 0 or self.peak_flops_per_s <= 0:
            raise LadderizeError(f"GPU profile {self.name!r}: peaks must be positive")
        if not (0 < self.bandwidth_efficiency <= 1.5 and 0 < self.flops_efficiency <= 1.5):
            raise LadderizeError(f"GPU profile {self.name!r}: efficiencies must lie in (0, 1.5]")
        if self.module_overhead_s < 0:
            raise LadderizeError(f"GPU profile {self.name!r}: module_overhead_s must be >= 0")

    def with_efficiencies(self, bandwidth: float, flops: float, module_overhead_s: float) -> "GPUProfile":
        return replace(self, bandwidth_efficiency=bandwidth, flops_efficiency=flops, module_overhead_s=module_overhead_s)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["sources"] = dict(self.sources)
        return data


GPU_PROFILES: dict[str, GPUProfile] = {
    "h100": GPUProfile(
        name="H100-SXM5-80GB",
        hbm_bytes_per_s=3.35e12,
        peak_flops_per_s=989e12,
        bandwidth_efficiency=H100_BANDWIDTH_EFFICIENCY,
        flops_efficiency=H100_FLOPS_EFFICIENCY,
        module_overhead_s=H100_MODULE_OVERHEAD_S,
        memory_bytes=80e9,
        sources={
            "hbm_bytes_per_s": "NVIDIA H100 Tensor Core GPU datasheet: H100 SXM GPU memory bandwidth 3.35 TB/s, 80 GB",
            "peak_flops_per_s": "NVIDIA H100 datasheet: BF16 Tensor Core 1,979 TFLOPS with sparsity, so 989 dense",
            "efficiencies": _CALIBRATED,
        },
    ),
    "h200": GPUProfile(
        name="H200-SXM-141GB",
        hbm_bytes_per_s=4.8e12,
        peak_flops_per_s=989e12,
        bandwidth_efficiency=H100_BANDWIDTH_EFFICIENCY,
        flops_efficiency=H100_FLOPS_EFFICIENCY,
        module_overhead_s=H100_MODULE_OVERHEAD_S,
        memory_bytes=141e9,
        sources={
            "hbm_bytes_per_s": "NVIDIA H200 Tensor Core GPU datasheet: H200 SXM GPU memory bandwidth 4.8 TB/s, 141 GB",
            "peak_flops_per_s": "NVIDIA H200 datasheet: BF16 Tensor Core 1,979 TFLOPS with sparsity, so 989 dense",
            "efficiencies": "assumed equal to the H100 fit (same Hopper SM and kernels); not calibrated on an H200",
        },
    ),
    "a100": GPUProfile(
        name="A100-SXM4-80GB",
        hbm_bytes_per_s=2.039e12,
        peak_flops_per_s=312e12,
        bandwidth_efficiency=H100_BANDWIDTH_EFFICIENCY,
        flops_efficiency=H100_FLOPS_EFFICIENCY,
        module_overhead_s=H100_MODULE_OVERHEAD_S,
        memory_bytes=80e9,
        sources={
            "hbm_bytes_per_s": "NVIDIA A100 Tensor Core GPU datasheet: A100 80GB SXM GPU memory bandwidth 2,039 GB/s, 80 GB",
            "peak_flops_per_s": "NVIDIA A100 datasheet: BF16 Tensor Core 312 TFLOPS (624 with sparsity)",
            "efficiencies": "assumed equal to the H100 fit; not calibrated on an A100",
        },
    ),
}


def load_gpu_profile(name: str) -> GPUProfile:
    key = name.strip().lower().replace("_", "-")
    key = {"h100-sxm": "h100", "h100-sxm5": "h100", "h200-sxm": "h200", "a100-sxm": "a100", "a100-80gb": "a100"}.get(key, key)
    if key not in GPU_PROFILES:
        raise LadderizeError(f"unknown GPU profile {name!r}: choose one of {', '.join(GPU_PROFILES)}")
    return GPU_PROFILES[key]
