"""GPU profiles for the roofline compute estimate: published peaks plus a fitted compute model.

A module's time on one rank is ``ComputeFit.module_s`` (``ladderize.predict.fit``):

    max((weight + activation bytes) / weight_bytes_per_s + KV bytes / kv_bytes_per_s,
        flops / (peak_flops_per_s * flops_efficiency(kind, width))) + overhead_s[kind]

The peaks are the datasheets' (``ladderize.hardware.GPU_PEAKS``: dense BF16 tensor-core FLOP/s, HBM
bandwidth, memory). The fitted constants depend on the runtime as much as on the GPU, so there are two H100 fits:

* ``h100``: ladderize's own runtime modules, fitted on the bundled H100 module table
  (``fit.fit_h100_table``; batch 1 and 64 rows fit, batch 16 held out);
* ``h100-gpt-fast``: the Ladder authors' gpt-fast runtime (torch.compile), fitted on their logged
  no-communication runs (``calibration.fit_gpt_fast``); the published figures were measured on it.

H200 and A100 reuse the ``h100`` fit with its bandwidths scaled by the datasheet HBM ratio: an
assumption, stated in their ``sources``. ``load_gpu_profile`` also reads a profile JSON written by
``ladderize predict --calibrate`` (``ladderize.predict.calibrate``).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from ..errors import LadderizeError
from ..hardware import GPU_PEAKS
from .fit import ComputeFit

# Fitted by ladderize.predict.fit.fit_h100_table() on the bundled H100 table (4 significant digits;
# tests/predict/test_fit.py re-runs the fit and compares).
H100_FIT = ComputeFit(
    weight_bytes_per_s=2.395e12,  # 71.5% of the 3.35 TB/s datasheet, 79.5% of the 3013 GB/s measured stream
    kv_bytes_per_s=2.324e12,
    overhead_s={"attention": 44.13e-6, "mlp": 23.43e-6, "head": 23.43e-6},
    flops_efficiency={"attention": ((1024, 0.2501), (8192, 0.5108)), "mlp": ((3584, 0.5305), (28672, 0.7183)),
                      "head": ((3584, 0.5305), (28672, 0.7183))},
    sources={
        "all": "fitted by ladderize.predict.fit.fit_h100_table on ladderize/predict/data/h100_modules_llama-3.1-70b.json "
               "(Llama-3.1-70B modules, ladderize RankModel in CUDA graphs, bf16, H100 80GB HBM3): decode rows at batch "
               "1 and 64 fix the bandwidths and per-kind overheads, prefill rows at batch 1 and 64 the FLOP "
               "efficiencies at the TP8 and TP1 widths; batch 16 held out",
        "head": "no LM-head rows in the table: overhead and FLOP efficiency taken from the MLP (assumption)",
    },
)

GPT_FAST_PREFILL_SCALE = 0.7708  # fitted with the bandwidths below (calibration.fit_gpt_fast)

# Fitted by fit_gpt_fast() of benchmarks/published_figures.py on the Ladder authors' logged upper-bound runs.
GPT_FAST_FIT = ComputeFit(
    weight_bytes_per_s=3.293e12,
    kv_bytes_per_s=321.9e9,
    overhead_s={"attention": 18.28e-6, "mlp": 18.28e-6, "head": 18.28e-6},
    flops_efficiency={k: tuple((w, round(e * GPT_FAST_PREFILL_SCALE, 4)) for w, e in v)
                      for k, v in H100_FIT.flops_efficiency.items()},
    sources={
        "all": "fitted by benchmarks/published_figures.py (fit_gpt_fast) on the Ladder authors' upper-bound (no "
               "communication) logs, Llama-3.1-70B on H100 (github.com/mayank31398/ladder-residual-inference, "
               "final-results-512/): decode per token at TP8 batch 1, TP4 batch 1 and TP8 batch 64 fix the two "
               "bandwidths and one overhead for every kind; the prefill at TP8 batch 1 fixes one factor on the h100 "
               "fit's FLOP efficiencies; every other logged run is held out",
    },
)


@dataclass(frozen=True)
class GPUProfile:
    """One GPU model's published peaks and the fitted compute model the roofline applies to them."""

    name: str
    hbm_bytes_per_s: float
    peak_flops_per_s: float
    fit: ComputeFit
    memory_bytes: float = 0.0
    sources: Mapping[str, str] = field(default_factory=dict)
    # Compute-bound GEMMs run as one wave of persistent CTAs (grid = SM count): an overlapped collective's CTAs push
    # part of the wave into a second one (``interconnect.one_wave_slowdown``). False: the SM-share slowdown.
    persistent_gemm_grid: bool = False

    def __post_init__(self) -> None:
        if self.hbm_bytes_per_s <= 0 or self.peak_flops_per_s <= 0:
            raise LadderizeError(f"GPU profile {self.name!r}: peaks must be positive")

    def with_fit(self, fit: ComputeFit) -> "GPUProfile":
        return replace(self, fit=fit)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["fit"] = self.fit.to_dict()
        data["sources"] = dict(self.sources)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], label: str = "profile") -> "GPUProfile":
        try:
            return cls(name=str(data["name"]), hbm_bytes_per_s=float(data["hbm_bytes_per_s"]),
                       peak_flops_per_s=float(data["peak_flops_per_s"]), fit=ComputeFit.from_dict(data["fit"]),
                       memory_bytes=float(data.get("memory_bytes", 0.0)), sources=dict(data.get("sources", {})),
                       persistent_gemm_grid=bool(data.get("persistent_gemm_grid", False)))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise LadderizeError(f"{label}: not a GPU profile ({type(exc).__name__}: {exc})") from None


def scaled_bandwidth(fit: ComputeFit, ratio: float, note: str) -> ComputeFit:
    """``fit`` with both bandwidths multiplied by ``ratio`` (another GPU's HBM against the H100's)."""
    return replace(fit, weight_bytes_per_s=fit.weight_bytes_per_s * ratio, kv_bytes_per_s=fit.kv_bytes_per_s * ratio,
                   sources={**fit.sources, "scaled": note})


_PERSISTENT = ("Hopper cuBLAS/CUTLASS 3.x GEMMs are persistent: the grid is one CTA per SM and a tile scheduler hands "
               "each CTA its tiles (CUTLASS docs, efficient_gemm.md, 'persistent' kernel schedules; NVIDIA developer "
               "forum, 'Compute-Communication Overlap Causes Severe GEMM Performance Degradation because of Tail "
               "Effect', forums.developer.nvidia.com/t/337991: on an H100 a library GEMM of exactly 132 CTAs overlapped "
               "with a 24-CTA NCCL kernel runs part of its CTAs as a second wave and takes nearly twice as long, MFU "
               "80% to 47%). Applies to compute-bound (prefill) modules; decode GEMVs are not modelled so")

def _profile(key: str, fit: ComputeFit, notes: Mapping[str, str], name: str | None = None,
             persistent_gemm_grid: bool = False) -> GPUProfile:
    """``hardware.GPU_PEAKS[key]`` with ``fit`` on it; ``notes`` join the peaks' sources."""
    peaks = GPU_PEAKS[key]
    return GPUProfile(name=name or peaks.name, hbm_bytes_per_s=peaks.hbm_bytes_per_s,
                      peak_flops_per_s=peaks.peak_flops_per_s, fit=fit, memory_bytes=peaks.memory_bytes,
                      sources={**peaks.sources, **notes}, persistent_gemm_grid=persistent_gemm_grid)


GPU_PROFILES: dict[str, GPUProfile] = {
    "h100": _profile("h100", H100_FIT, {"fit": "ladderize runtime modules measured on an H100 (ladderize.predict.fit)",
                                        "persistent_gemm_grid": _PERSISTENT}, persistent_gemm_grid=True),
    "h100-gpt-fast": _profile("h100", GPT_FAST_FIT, {
        "fit": "the Ladder authors' gpt-fast runtime, from their logs (benchmarks/published_figures.py)",
        "persistent_gemm_grid": _PERSISTENT}, name=f"{GPU_PEAKS['h100'].name} (gpt-fast)", persistent_gemm_grid=True),
    "h200": _profile("h200", scaled_bandwidth(H100_FIT, 4.8 / 3.35, "bandwidths scaled by 4.8/3.35 (datasheet HBM); "
                                                                    "not measured on an H200"), {
        "fit": "the h100 fit with bandwidths scaled by the HBM ratio (same Hopper SM and kernels); not measured on an H200",
        "persistent_gemm_grid": _PERSISTENT}, persistent_gemm_grid=True),
    "a100": _profile("a100", scaled_bandwidth(H100_FIT, 2.039 / 3.35, "bandwidths scaled by 2.039/3.35 (datasheet HBM); "
                                                                      "not measured on an A100"), {
        "fit": "the h100 fit with bandwidths scaled by the HBM ratio and FLOP efficiencies kept; not measured on an A100",
        "persistent_gemm_grid": "False (assumption): Ampere GEMMs (CUTLASS 2.x style) launch one CTA per output tile "
                                "in several waves, so an overlapped collective costs them its SM share"}),
}


def load_gpu_profile(name: str | Path) -> GPUProfile:
    """A built-in profile name, or a profile JSON (``ladderize predict --calibrate`` writes one)."""
    text = str(name).strip()
    key = text.lower().replace("_", "-")
    key = {"h100-sxm": "h100", "h100-sxm5": "h100", "h200-sxm": "h200", "a100-sxm": "a100", "a100-80gb": "a100",
           "gpt-fast": "h100-gpt-fast"}.get(key, key)
    if key in GPU_PROFILES:
        return GPU_PROFILES[key]
    path = Path(text).expanduser()
    if path.suffix == ".json" or path.is_file():
        if not path.is_file():
            raise LadderizeError(f"GPU profile {path}: no such file")
        try:
            data = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise LadderizeError(f"cannot read GPU profile {path}: {type(exc).__name__}: {exc}") from None
        if isinstance(data, dict) and "gpu" in data and isinstance(data["gpu"], dict):
            data = data["gpu"]  # a calibration record: the profile is under "gpu"
        if not isinstance(data, dict):
            raise LadderizeError(f"GPU profile {path}: expected a JSON object")
        return GPUProfile.from_dict(data, label=f"GPU profile {path}")
    raise LadderizeError(f"unknown GPU profile {text!r}: choose one of {', '.join(GPU_PROFILES)} or give a profile JSON")
