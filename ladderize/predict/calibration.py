"""Published figures, the fits that fixed the profiles' parameters, and the validation table.

Each fitted parameter is fixed by exactly one published figure (or one pair), in this order:

1. H100 ``bandwidth_efficiency`` and ``module_overhead_s``: the Ladder authors' logged no-communication
   ("upper bound") decode latencies of Llama-3.1-70B at TP8 and TP4, batch 1 (a 2x2 linear solve: at
   batch 1 every module is memory-bound, so a step costs bytes / bandwidth + modules * overhead).
2. H100 ``flops_efficiency``: the logged upper-bound prefill latency at TP8, batch 1.
3. NVLink ``latency_s`` (per ring hop) and ``launch_s`` (per call): the 1.43x upper bound at TP8, batch 1
   (paper) and the 1.162x upper bound at TP4, batch 1 (logs), solved jointly.
4. ``overlap_slowdown``: the 1.31x Ladder speed-up at TP8, batch 1 with NVLink (paper).
5. No-P2P ``latency_s``: the 1.60x Ladder speed-up at TP8, batch 1 with peer-to-peer disabled (paper).

Everything else in the validation table is held out: predicted with the fitted constants, never used
to fit them.

Sources: Ladder Residual, Zhang et al. 2025 (arXiv:2501.06589) and its authors' blog table (Together AI
blog "Ladder-residual", mirrored at github.com/Nanami18/Nanami18.github.io
blogs/ladder_residual/together_blog.md); the authors' benchmark logs
(github.com/mayank31398/ladder-residual-inference, final-results-512/, prompt 1024, 512 new tokens,
8x H100 SXM); SPD, Kim et al., ICML 2025 (arXiv:2502.20727).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any, Callable

from ..model.layout import Layout
from .compute import RooflineCompute
from .gpus import GPU_PROFILES, GPUProfile
from .interconnect import PROFILES, InterconnectProfile
from .estimate import PredictRequest, decode_kv_len, predict
from .presets import PRESETS, ModelShape
from .work import module_work

PROMPT, GEN = 1024, 512
DECODE_STEPS = GEN - 1
LADDER_PAPER = "Ladder Residual (arXiv:2501.06589), 70B at TP8 on H100"
LADDER_BLOG = "Ladder authors' blog table (Nanami18.github.io blogs/ladder_residual/together_blog.md)"
LADDER_LOGS = "github.com/mayank31398/ladder-residual-inference final-results-512/"
SPD_PAPER = "SPD (Kim et al., ICML 2025, arXiv:2502.20727): about 20% lower latency, LLaMA2-70B on 8 GPUs, 70% of blocks"


@dataclass(frozen=True)
class LoggedRun:
    """One run from the Ladder authors' logs: Llama-3.1-70B on H100, prompt 1024, 512 new tokens."""

    model: str  # "dense" or "upper-bound" (the no-communication run)
    tp: int
    batch: int
    prefill_s: float
    decode_s: float  # the whole decode phase: 511 steps
    e2e_tokens_per_s: float  # 512 new tokens per sequence over prefill and decode (the logs' "tokens/s")
    path: str

    @property
    def decode_s_per_token(self) -> float:
        return self.decode_s / DECODE_STEPS


_DENSE = "gpt_dense:llama-3-70b"
_UB = "gpt_ensemble:llama-3-70b-upper-bound"
LOGGED_RUNS: tuple[LoggedRun, ...] = (
    LoggedRun("dense", 8, 1, 0.0812, 6.5310, 77.39, f"{_DENSE}/bs_1_tp_8.log"),
    LoggedRun("dense", 8, 4, 0.2599, 7.6558, 258.56, f"{_DENSE}/bs_4_tp_8.log"),
    LoggedRun("dense", 8, 16, 0.9951, 8.7168, 843.15, f"{_DENSE}/bs_16_tp_8.log"),
    LoggedRun("dense", 8, 64, 4.0603, 12.4776, 1980.92, f"{_DENSE}/bs_64_tp_8.log"),
    LoggedRun("dense", 4, 1, 0.1223, 8.4932, 59.41, f"{_DENSE}/bs_1_tp_4.log"),
    LoggedRun("dense", 4, 16, 1.7276, 12.2677, 585.23, f"{_DENSE}/bs_16_tp_4.log"),
    LoggedRun("upper-bound", 8, 1, 0.0564, 4.5711, 110.59, f"{_UB}/bs_1_tp_8.log"),
    LoggedRun("upper-bound", 8, 4, 0.2056, 5.5474, 355.80, f"{_UB}/bs_4_tp_8.log"),
    # This log stops after run 8 of 10: the mean of runs 1-8.
    LoggedRun("upper-bound", 8, 16, 0.8117, 6.5684, 1109.7, f"{_UB}/bs_16_tp_8.log (runs 1-8)"),
    LoggedRun("upper-bound", 8, 64, 3.3527, 9.9090, 2470.39, f"{_UB}/bs_64_tp_8.log"),
    LoggedRun("upper-bound", 4, 1, 0.1031, 7.3108, 69.04, f"{_UB}/bs_1_tp_4.log"),
    LoggedRun("upper-bound", 4, 16, 1.5343, 10.7806, 665.07, f"{_UB}/bs_16_tp_4.log"),
)


def logged(model: str, tp: int, batch: int) -> LoggedRun:
    for run in LOGGED_RUNS:
        if (run.model, run.tp, run.batch) == (model, tp, batch):
            return run
    raise KeyError((model, tp, batch))


def _logged_ratio(tp: int, batch: int) -> float:
    return logged("upper-bound", tp, batch).e2e_tokens_per_s / logged("dense", tp, batch).e2e_tokens_per_s


@dataclass(frozen=True)
class Figure:
    """A published speed-up (or latency reduction) and the setting that reproduces it."""

    key: str
    description: str
    published: float
    source: str
    schedule: str  # "upper-bound", "ladder", or "spd-latency-reduction"
    interconnect: str
    tp: int
    batch: int
    model: str = "llama-3.1-70b"
    fixes: str = ""  # the parameter this figure fixed; empty when held out


FIGURES: tuple[Figure, ...] = (
    Figure("ub-tp8-b1", "upper bound / dense, TP8, batch 1, NVLink", 1.43, LADDER_PAPER, "upper-bound",
           "h100-nvlink", 8, 1, fixes="h100-nvlink latency_s (jointly with launch_s)"),
    Figure("ub-tp4-b1", "upper bound / dense, TP4, batch 1, NVLink", round(_logged_ratio(4, 1), 3), LADDER_LOGS,
           "upper-bound", "h100-nvlink", 4, 1, fixes="h100-nvlink launch_s (jointly with latency_s)"),
    Figure("ladder-tp8-b1", "Ladder / dense, TP8, batch 1, NVLink", 1.31, LADDER_PAPER, "ladder", "h100-nvlink", 8, 1,
           fixes="overlap_slowdown"),
    Figure("ladder-nop2p-tp8-b1", "Ladder / dense, TP8, batch 1, peer-to-peer disabled", 1.60, LADDER_PAPER, "ladder",
           "h100-no-p2p", 8, 1, fixes="h100-no-p2p latency_s"),
    Figure("ladder-tp8-b16", "Ladder / dense, TP8, batch 16, NVLink", 1.19, LADDER_PAPER, "ladder", "h100-nvlink", 8, 16),
    Figure("ladder-tp8-b4", "Ladder / dense, TP8, batch 4, NVLink", 1.282, LADDER_BLOG, "ladder", "h100-nvlink", 8, 4),
    Figure("ladder-tp8-b64", "Ladder / dense, TP8, batch 64, NVLink", 1.155, LADDER_BLOG, "ladder", "h100-nvlink", 8, 64),
    Figure("ub-tp8-b4", "upper bound / dense, TP8, batch 4, NVLink", round(_logged_ratio(8, 4), 3), LADDER_LOGS,
           "upper-bound", "h100-nvlink", 8, 4),
    Figure("ub-tp8-b16", "upper bound / dense, TP8, batch 16, NVLink", round(_logged_ratio(8, 16), 3), LADDER_LOGS,
           "upper-bound", "h100-nvlink", 8, 16),
    Figure("ub-tp8-b64", "upper bound / dense, TP8, batch 64, NVLink", round(_logged_ratio(8, 64), 3), LADDER_LOGS,
           "upper-bound", "h100-nvlink", 8, 64),
    Figure("ub-tp4-b16", "upper bound / dense, TP4, batch 16, NVLink", round(_logged_ratio(4, 16), 3), LADDER_LOGS,
           "upper-bound", "h100-nvlink", 4, 16),
    Figure("spd-nvlink", "SPD latency reduction, LLaMA2-70B, TP8, 70% of blocks, batch 1, on h100-nvlink", 0.20,
           SPD_PAPER, "spd-latency-reduction", "h100-nvlink", 8, 1, model="llama-2-70b"),
    Figure("spd-nop2p", "SPD latency reduction, LLaMA2-70B, TP8, 70% of blocks, batch 1, on h100-no-p2p", 0.20,
           SPD_PAPER, "spd-latency-reduction", "h100-no-p2p", 8, 1, model="llama-2-70b"),
)


def spd_calibration_layout(model: ModelShape, tp: int = 8, fraction: float = 0.7) -> Layout:
    """SPD on the last ``fraction`` of the blocks (the paper adds SPD from the last layer backwards)."""
    count = round(model.num_hidden_layers * fraction)
    return Layout.from_ranges(model.num_hidden_layers, spd=f"-{count}:", spd_tp_size=tp)


def predict_figure(figure: Figure, gpu: GPUProfile, interconnect: InterconnectProfile) -> float:
    """The model's value for ``figure``'s setting, under the given profiles (roofline compute)."""
    model = PRESETS[figure.model]
    compute = RooflineCompute(gpu)
    if figure.schedule == "spd-latency-reduction":
        request = PredictRequest(model, (figure.tp,), (figure.batch,), PROMPT, GEN, interconnect,
                                 layout=spd_calibration_layout(model, figure.tp), schedules=("dense", "layout"))
        rows = {r.schedule: r for r in predict(request, compute).rows}
        return 1.0 - rows["dense"].e2e_tokens_per_s / rows["layout"].e2e_tokens_per_s
    request = PredictRequest(model, (figure.tp,), (figure.batch,), PROMPT, GEN, interconnect,
                             schedules=("dense", figure.schedule))
    rows = {r.schedule: r for r in predict(request, compute).rows}
    return rows[figure.schedule].e2e_speedup_vs_dense  # the published figures are end-to-end tokens/s


# ---- fitting ---------------------------------------------------------------------------------------


def _solve(f: Callable[[float], float], lo: float, hi: float, tol: float = 1e-12, iterations: int = 200) -> float:
    """A root of ``f`` in [lo, hi] (bracketing bisection with secant steps)."""
    f_lo, f_hi = f(lo), f(hi)
    if f_lo == 0:
        return lo
    if f_hi == 0:
        return hi
    if (f_lo > 0) == (f_hi > 0):
        raise ValueError(f"no sign change in [{lo}, {hi}]: f={f_lo}, {f_hi}")
    for _ in range(iterations):
        mid = hi - f_hi * (hi - lo) / (f_hi - f_lo) if f_hi != f_lo else (lo + hi) / 2
        if not lo < mid < hi or abs(mid - lo) < 0.01 * (hi - lo) or abs(hi - mid) < 0.01 * (hi - lo):
            mid = (lo + hi) / 2
        f_mid = f(mid)
        if abs(hi - lo) <= tol * max(1.0, abs(mid)) or f_mid == 0:
            return mid
        if (f_mid > 0) == (f_lo > 0):
            lo, f_lo = mid, f_mid
        else:
            hi, f_hi = mid, f_mid
    return (lo + hi) / 2


def _upper_bound_decode_bytes_and_modules(model: ModelShape, tp: int, batch: int) -> tuple[float, int]:
    kv = decode_kv_len(PROMPT, GEN)
    works = [module_work(model, kind, tp, batch, 1, kv) for kind in ("attention", "mlp")]
    layer_bytes = sum(w.bytes for w in works)
    head = module_work(model, "head", tp, batch, 1, 0)
    return model.num_hidden_layers * layer_bytes + head.bytes, 2 * model.num_hidden_layers + 1


def fit_gpu_efficiencies(base: GPUProfile | None = None) -> GPUProfile:
    """Steps 1 and 2: the H100 efficiencies from the logged upper-bound latencies."""
    gpu = base or GPU_PROFILES["h100"]
    model = PRESETS["llama-3.1-70b"]
    rows = []
    for tp in (8, 4):
        nbytes, modules = _upper_bound_decode_bytes_and_modules(model, tp, 1)
        rows.append((nbytes / gpu.hbm_bytes_per_s, modules, logged("upper-bound", tp, 1).decode_s_per_token))
    (a1, b1, y1), (a2, b2, y2) = rows
    det = a1 * b2 - a2 * b1
    inverse_efficiency = (y1 * b2 - y2 * b1) / det
    overhead = (a1 * y2 - a2 * y1) / det
    gpu = gpu.with_efficiencies(1.0 / inverse_efficiency, gpu.flops_efficiency, overhead)

    target = logged("upper-bound", 8, 1).prefill_s
    request = PredictRequest(model, (8,), (1,), PROMPT, GEN, PROFILES["h100-nvlink"], schedules=("upper-bound",))

    def prefill_error(flops_efficiency: float) -> float:
        trial = gpu.with_efficiencies(gpu.bandwidth_efficiency, flops_efficiency, gpu.module_overhead_s)
        rows = {r.schedule: r for r in predict(request, RooflineCompute(trial)).rows}
        return rows["upper-bound"].prefill_s - target

    return gpu.with_efficiencies(gpu.bandwidth_efficiency, _solve(prefill_error, 0.01, 1.5), gpu.module_overhead_s)


def _figure(key: str) -> Figure:
    return next(f for f in FIGURES if f.key == key)


def fit_interconnects(gpu: GPUProfile) -> dict[str, InterconnectProfile]:
    """Steps 3 to 5: NVLink launch and hop latency, the overlap slowdown, and the no-P2P hop latency."""
    nvlink = PROFILES["h100-nvlink"]
    ub8, ub4 = _figure("ub-tp8-b1"), _figure("ub-tp4-b1")
    launch, hop = nvlink.launch_s, nvlink.latency_s
    for _ in range(60):  # alternate the two 1-D solves; converges geometrically
        hop = _solve(lambda h: predict_figure(ub8, gpu, replace(nvlink, launch_s=launch, latency_s=h)) - ub8.published,
                     0.0, 50e-6)
        new_launch = _solve(
            lambda s: predict_figure(ub4, gpu, replace(nvlink, launch_s=s, latency_s=hop)) - ub4.published, 0.0, 100e-6
        )
        converged = abs(new_launch - launch) < 1e-12
        launch = new_launch
        if converged:
            break
    nvlink = replace(nvlink, launch_s=launch, latency_s=hop)

    ladder = _figure("ladder-tp8-b1")
    slowdown = _solve(lambda g: predict_figure(ladder, gpu, replace(nvlink, overlap_slowdown=g)) - ladder.published,
                      0.0, 2.0)
    nvlink = replace(nvlink, overlap_slowdown=slowdown)

    no_p2p = replace(PROFILES["h100-no-p2p"], launch_s=launch, overlap_slowdown=slowdown)
    target = _figure("ladder-nop2p-tp8-b1")
    hop_no_p2p = _best_fit(lambda h: predict_figure(target, gpu, replace(no_p2p, latency_s=h)), target.published,
                           0.0, 100e-6)
    return {"h100-nvlink": nvlink, "h100-no-p2p": replace(no_p2p, latency_s=hop_no_p2p)}


def _best_fit(f: Callable[[float], float], target: float, lo: float, hi: float, grid: int = 50) -> float:
    """The smallest x in [lo, hi] with f(x) = target, or the x closest to it when the model cannot reach it.

    Ladder's speed-up rises with the all-reduce time until the all-reduce outlasts the module it hides
    behind, then falls: the curve has a peak, so a target can have two solutions or none.
    """
    xs = [lo + (hi - lo) * i / grid for i in range(grid + 1)]
    values = [f(x) for x in xs]
    for i in range(grid):
        if (values[i] - target) * (values[i + 1] - target) <= 0:
            return _solve(lambda x: f(x) - target, xs[i], xs[i + 1])
    best = min(range(len(xs)), key=lambda i: abs(values[i] - target))
    a, b = xs[max(0, best - 1)], xs[min(grid, best + 1)]
    ratio = (math.sqrt(5) - 1) / 2
    for _ in range(48):  # golden-section refinement of |f - target|
        c, d = b - ratio * (b - a), a + ratio * (b - a)
        if abs(f(c) - target) < abs(f(d) - target):
            b = d
        else:
            a = c
    return (a + b) / 2


@dataclass(frozen=True)
class Calibration:
    gpu: GPUProfile
    interconnects: dict[str, InterconnectProfile]

    def parameters(self) -> dict[str, float]:
        nvlink, no_p2p = self.interconnects["h100-nvlink"], self.interconnects["h100-no-p2p"]
        return {
            "h100.bandwidth_efficiency": self.gpu.bandwidth_efficiency,
            "h100.module_overhead_s": self.gpu.module_overhead_s,
            "h100.flops_efficiency": self.gpu.flops_efficiency,
            "h100-nvlink.launch_s": nvlink.launch_s,
            "h100-nvlink.latency_s": nvlink.latency_s,
            "overlap_slowdown": nvlink.overlap_slowdown,
            "h100-no-p2p.latency_s": no_p2p.latency_s,
        }


def calibrate() -> Calibration:
    """Re-derive every fitted constant from the published figures (the shipped values are these, rounded)."""
    gpu = fit_gpu_efficiencies()
    return Calibration(gpu, fit_interconnects(gpu))


# ---- validation --------------------------------------------------------------------------------------


def validation_table(
    gpu: GPUProfile | None = None, interconnects: dict[str, InterconnectProfile] | None = None
) -> list[dict[str, Any]]:
    """Predicted against published for every figure, with the shipped profiles unless others are given."""
    gpu = gpu or GPU_PROFILES["h100"]
    table = []
    for figure in FIGURES:
        profile = (interconnects or {}).get(figure.interconnect, PROFILES[figure.interconnect])
        predicted = predict_figure(figure, gpu, profile)
        table.append({
            **{k: v for k, v in asdict(figure).items() if k != "fixes"},
            "role": f"fit: {figure.fixes}" if figure.fixes else "held out",
            "predicted": predicted,
            "error": predicted / figure.published - 1.0,
        })
    return table


def roofline_vs_logged(gpu: GPUProfile | None = None) -> list[dict[str, Any]]:
    """The roofline's upper-bound (compute-only) latencies against the authors' measured H100 runs."""
    gpu = gpu or GPU_PROFILES["h100"]
    model = PRESETS["llama-3.1-70b"]
    table = []
    for run in LOGGED_RUNS:
        if run.model != "upper-bound":
            continue
        request = PredictRequest(model, (run.tp,), (run.batch,), PROMPT, GEN, PROFILES["h100-nvlink"],
                                 schedules=("upper-bound",))
        row = next(r for r in predict(request, RooflineCompute(gpu)).rows if r.schedule == "upper-bound")
        fitted = (run.tp, run.batch) in ((8, 1), (4, 1))
        for phase, predicted, measured in (
            ("prefill", row.prefill_s, run.prefill_s),
            ("decode per token", row.decode_s_per_token, run.decode_s_per_token),
        ):
            used = fitted and (phase.startswith("decode") or run.tp == 8)
            table.append({
                "tp": run.tp, "batch": run.batch, "phase": phase, "roofline_s": predicted, "measured_s": measured,
                "error": predicted / measured - 1.0, "role": "fit" if used else "held out", "log": run.path,
            })
    return table
