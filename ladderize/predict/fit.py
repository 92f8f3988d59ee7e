"""The fitted compute model (``ComputeFit``) and the fits that produce it from measured module timings.

A module of one rank costs

    max(memory_s, flops_s) + overhead_s[kind]
    memory_s = (weight bytes + activation bytes) / weight_bytes_per_s + KV-cache bytes / kv_bytes_per_s
    flops_s  = flops / (peak FLOP/s * flops_efficiency(kind, width))

* decode (one new token) is memory-bound: the weights stream at a fitted share of HBM bandwidth, the
  KV-cache read grows with batch x context at its own fitted rate (attention kernels reach a different
  share than GEMV/GEMM weight reads), and every module pays a fixed cost (launches, norms, rotary,
  small kernels) that does not scale;
* prefill is compute-bound: FLOPs at a fitted efficiency per shape class, the class being the module
  kind and the rank's GEMM width (``heads * head_dim`` for attention, the MLP slice for the MLP, the
  vocabulary for the head). The efficiency is interpolated in log2(width) between the fitted anchors
  (a TP8 shard is narrow, a TP1 layer wide) and held constant outside them.

``fit_compute`` fits every constant from rows of measured module timings (``ModuleTiming``) by least
squares on relative error; ``H100_TABLE_SPLIT`` says which rows of the bundled H100 table fit and which
are held out. The same function fits a user's own timings (``ladderize predict --calibrate``).

The bundled H100 data (``ladderize/predict/data/``, copied from the measurement's README): one rank's
attention and MLP modules of Llama-3.1-70B timed with the runtime's own ``RankModel`` kernels in a CUDA
graph (bf16) on one H100 80GB HBM3 (torch 2.11+cu130, 2026-11-23), TP 1 and 8,
batch 1 / 16 / 64, prefill (prompt 1024) and decode (KV length 1280); and ``ladderize bench`` of a
synthetic llama-8b at TP1 on the same GPU (CUDA graphs + compile).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from ..errors import LadderizeError
from ..checkpoint.shapes import ModelShape
from .work import ModuleKind, ModuleWork, module_work

KINDS: tuple[ModuleKind, ...] = ("attention", "mlp", "head")
H100_MODULES_FILE = "h100_modules_llama-3.1-70b.json"
H100_BENCH_FILE = "h100_bench_llama-8b_tp1.json"
H100_TABLE_SOURCE = (
    "ladderize/predict/data/h100_modules_llama-3.1-70b.json: Llama-3.1-70B attention/MLP modules of one rank, "
    "ladderize RankModel kernels in a CUDA graph, bf16, one H100 80GB HBM3 (torch 2.11+cu130, 2026-11-23)"
)


def width_of(work: ModuleWork) -> int:
    """The rank's GEMM width that names a module's prefill shape class."""
    if work.kind == "attention":
        return work.heads * work.head_dim
    if work.kind == "mlp":
        return work.intermediate_size
    return work.vocab_size


MAX_EFFICIENCY = 1.5  # of the datasheet (or measured) peak FLOP/s: above it a fitted efficiency is noise


@dataclass(frozen=True)
class ComputeFit:
    """Fitted constants of the compute model for one GPU and runtime; ``sources`` says what fixed each."""

    weight_bytes_per_s: float
    kv_bytes_per_s: float
    overhead_s: Mapping[str, float]  # per module kind: attention, mlp, head
    flops_efficiency: Mapping[str, tuple[tuple[int, float], ...]]  # kind -> ((width, efficiency), ...) sorted
    sources: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.weight_bytes_per_s <= 0 or self.kv_bytes_per_s <= 0:
            raise LadderizeError("compute fit: bandwidths must be positive")
        if any(self.overhead_s.get(kind, -1) < 0 for kind in KINDS):
            raise LadderizeError("compute fit: overhead_s needs a non-negative value for attention, mlp and head")
        for kind in KINDS:
            anchors = self.flops_efficiency.get(kind)
            if not anchors or any(not 0 < eff <= MAX_EFFICIENCY or width < 1 for width, eff in anchors):
                raise LadderizeError(f"compute fit: flops_efficiency[{kind!r}] needs (width, efficiency in (0, {MAX_EFFICIENCY}])")

    def efficiency(self, kind: str, width: int) -> float:
        """The FLOP efficiency of a ``kind`` module of this width: log2-linear between anchors, flat outside."""
        anchors = sorted(self.flops_efficiency[kind])
        if width <= anchors[0][0]:
            return anchors[0][1]
        if width >= anchors[-1][0]:
            return anchors[-1][1]
        for (w0, e0), (w1, e1) in zip(anchors, anchors[1:]):
            if w0 <= width <= w1:
                x = (math.log2(width) - math.log2(w0)) / (math.log2(w1) - math.log2(w0))
                return e0 + x * (e1 - e0)
        return anchors[-1][1]  # unreachable

    def terms(self, work: ModuleWork, peak_flops_per_s: float) -> tuple[float, float, float]:
        """(memory seconds, FLOP seconds, fixed seconds) of one module."""
        kv = work.kv_bytes
        memory_s = (work.bytes - kv) / self.weight_bytes_per_s + kv / self.kv_bytes_per_s
        flops_s = work.flops / (peak_flops_per_s * self.efficiency(work.kind, width_of(work)))
        return memory_s, flops_s, self.overhead_s[work.kind]

    def module_s(self, work: ModuleWork, peak_flops_per_s: float) -> float:
        memory_s, flops_s, fixed_s = self.terms(work, peak_flops_per_s)
        return max(memory_s, flops_s) + fixed_s

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["overhead_s"] = dict(self.overhead_s)
        data["flops_efficiency"] = {k: [list(a) for a in v] for k, v in self.flops_efficiency.items()}
        data["sources"] = dict(self.sources)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ComputeFit":
        try:
            return cls(
                weight_bytes_per_s=float(data["weight_bytes_per_s"]), kv_bytes_per_s=float(data["kv_bytes_per_s"]),
                overhead_s={k: float(v) for k, v in data["overhead_s"].items()},
                flops_efficiency={k: tuple((int(w), float(e)) for w, e in v) for k, v in data["flops_efficiency"].items()},
                sources=dict(data.get("sources", {})),
            )  # fmt: skip
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise LadderizeError(f"compute fit: missing or malformed field ({type(exc).__name__}: {exc})") from None


# ---- measured rows --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModuleTiming:
    """One measured module: its work (per-rank shape) and seconds; ``label`` names the row."""

    work: ModuleWork
    seconds: float
    phase: str  # "prefill" or "decode"
    label: str

    @property
    def memory_bound(self) -> bool:
        return self.phase == "decode"


def _data_text(name: str) -> str:
    return resources.files("ladderize.predict").joinpath("data", name).read_text()


def table_shape(data: Mapping[str, Any]) -> ModelShape:
    m = data["model"]
    return ModelShape(m["name"], hidden_size=m["hidden_size"], intermediate_size=m["intermediate_size"],
                      num_hidden_layers=m["num_hidden_layers"], num_attention_heads=m["num_attention_heads"],
                      num_key_value_heads=m["num_key_value_heads"], head_dim=m["head_dim"],
                      vocab_size=m["vocab_size"], dtype_bytes=m.get("dtype_bytes", 2))  # fmt: skip


def h100_table(path: Path | str | None = None) -> dict[str, Any]:
    """The H100 module table (the bundled copy unless ``path`` is given)."""
    return json.loads(Path(path).read_text() if path else _data_text(H100_MODULES_FILE))


def table_timings(data: Mapping[str, Any], prompt: int = 1024, kv_len: int = 1280) -> list[ModuleTiming]:
    """The table's rows as ``ModuleTiming``: prefill at ``q_len = kv_len = prompt``, decode at ``kv_len``."""
    shape = table_shape(data)
    out = []
    for row in data["rows"]:
        q, kv = (prompt, prompt) if row["phase"] == "prefill" else (1, kv_len)
        work = module_work(shape, row["module"], row["tp"], row["batch"], q, kv)
        label = f"tp{row['tp']} b{row['batch']} {row['phase']} {row['module']}"
        out.append(ModuleTiming(work, float(row["measured_s"]), row["phase"], label))
    return out


#: Which rows of the H100 table fit which parameters; the rest are held out (tests/predict/test_fit.py checks).
H100_TABLE_SPLIT = {
    "fit": "batch 1 and 64 rows (TP 1 and 8): decode rows fix weight_bytes_per_s, kv_bytes_per_s, "
           "overhead_s[attention], overhead_s[mlp]; prefill rows fix flops_efficiency[kind] at the TP1 and TP8 widths",
    "held_out": "batch 16 rows (TP 1 and 8, prefill and decode, attention and MLP): never used to fit",
}


def is_fit_row(timing: ModuleTiming) -> bool:
    """The H100 table split: batch 1 and 64 fit, batch 16 is held out."""
    return timing.work.batch in (1, 64)


# ---- the fit ---------------------------------------------------------------------------------------

#: The weight bandwidth is told apart from the per-kind fixed costs only when some kind's decode rows read weights
#: of different sizes (TP 1 and TP 8 shards): batches alone change the activations, not the weights.
WEIGHT_SPREAD = 1.5


def weight_sizes_spread(decode: Sequence[ModuleTiming]) -> float:
    """The largest ratio, within one module kind, of the non-KV bytes its decode rows read."""
    spread = 1.0
    for kind in {t.work.kind for t in decode}:
        sizes = [t.work.bytes - t.work.kv_bytes for t in decode if t.work.kind == kind]
        spread = max(spread, max(sizes) / min(sizes))
    return spread



def _solve_nonnegative_overheads(matrix: np.ndarray, rhs: np.ndarray, first: int = 2) -> np.ndarray:
    """Least squares with the columns from ``first`` on (the per-kind fixed costs) held at or above zero.

    An active set: a fixed cost the free solve puts below zero is pinned at zero and the rest re-solved, until none
    is. Clamping after the solve instead leaves the other constants fitted to a negative cost: a kind whose rows read
    far more bytes than the others (the LM head beside TP-sharded layers) streams faster than the small modules'
    slope, its free fixed cost comes out negative, and at zero the module is then predicted too slow (+20-30% on
    an H200's own Llama-3.1-8B TP 4 and 8 timings)."""
    pinned: set[int] = set()
    while True:
        free = [i for i in range(matrix.shape[1]) if i not in pinned]
        values, *_ = np.linalg.lstsq(matrix[:, free], rhs, rcond=None)
        solution = np.zeros(matrix.shape[1])
        solution[free] = values
        negative = [i for i in free if i >= first and solution[i] < 0]
        if not negative:
            return solution
        pinned.add(min(negative, key=lambda i: solution[i]))


def fit_compute(
    timings: Sequence[ModuleTiming], peak_flops_per_s: float, source: str, head_overhead_from: str = "mlp",
    fallback_bytes_per_s: float | None = None,
) -> ComputeFit:
    """Least-squares fit (relative error) of every ``ComputeFit`` constant from measured module timings.

    Decode rows fix the two bandwidths and the per-kind fixed costs (one linear solve in
    ``1/weight_bytes_per_s``, ``1/kv_bytes_per_s`` and one overhead per kind present, the overheads held at or
    above zero within the solve); prefill rows
    then fix one FLOP efficiency per (kind, width) after removing the fixed cost. A kind without rows
    (the LM head in the H100 table) takes ``head_overhead_from``'s overhead and the efficiency of the
    nearest kind present, and its source says so. When the rows cannot fix a positive weight bandwidth
    (noisy timings of tiny shapes), ``fallback_bytes_per_s`` (a measured stream rate) stands in for it
    and the rest is re-solved.
    """
    decode = [t for t in timings if t.memory_bound]
    prefill = [t for t in timings if not t.memory_bound]
    kinds = sorted({t.work.kind for t in decode})
    if len(decode) < 2 + len(kinds) or not prefill:
        raise LadderizeError(
            f"compute fit: need at least {2 + len(kinds)} decode rows and one prefill row, got {len(decode)} and {len(prefill)}"
        )
    rows, target = [], []
    for t in decode:
        kv = t.work.kv_bytes
        rows.append([(t.work.bytes - kv) / t.seconds, kv / t.seconds] + [float(t.work.kind == k) / t.seconds for k in kinds])
        target.append(1.0)
    matrix, rhs = np.array(rows), np.array(target)
    solution = _solve_nonnegative_overheads(matrix, rhs)
    inv_w, inv_kv = float(solution[0]), float(solution[1])
    fixed_bandwidth = False
    one_size = weight_sizes_spread(decode) < WEIGHT_SPREAD
    if one_size and not fallback_bytes_per_s:
        raise LadderizeError("compute fit: every module kind was timed at one weight size, so the weight bandwidth "
                             "cannot be told from the fixed costs; time two TP degrees (e.g. --tp 1,8)")
    if (inv_w <= 0 or one_size) and fallback_bytes_per_s:
        inv_w, fixed_bandwidth = 1.0 / fallback_bytes_per_s, True
        rest = _solve_nonnegative_overheads(matrix[:, 1:], rhs - matrix[:, 0] * inv_w, first=1)
        solution = np.concatenate([[inv_w], rest])
        inv_kv = float(solution[1])
    if inv_w <= 0:
        raise LadderizeError("compute fit: the decode rows do not fix a positive weight bandwidth")
    if inv_kv <= 0 or not 0.05 < inv_w / inv_kv < 20:
        # The KV read is too small (or too collinear with the attention's fixed cost) to resolve: charge it at
        # the weight rate and re-solve the fixed costs.
        inv_kv = inv_w
        rest = _solve_nonnegative_overheads(matrix[:, 2:], rhs - (matrix[:, 0] + matrix[:, 1]) * inv_w, first=0)
        solution = np.concatenate([[inv_w, inv_kv], rest])
        fixed_kv = True
    else:
        fixed_kv = False
    overhead = {k: max(0.0, float(c)) for k, c in zip(kinds, solution[2:])}
    for kind in KINDS:
        overhead.setdefault(kind, overhead.get(head_overhead_from, min(overhead.values())))

    efficiency: dict[str, dict[int, list[float]]] = {}
    for t in prefill:
        compute_s = t.seconds - overhead[t.work.kind]
        if compute_s <= 0:
            continue
        efficiency.setdefault(t.work.kind, {}).setdefault(width_of(t.work), []).append(
            t.work.flops / (peak_flops_per_s * compute_s)
        )
    if not efficiency:
        raise LadderizeError("compute fit: no prefill row is longer than its module's fixed cost")
    anchors: dict[str, tuple[tuple[int, float], ...]] = {}
    clamped = []
    for kind, by_width in efficiency.items():
        # Least squares on relative time error for t = flops / (peak * e): 1/e is the mean of the rows' 1/e.
        fitted = sorted((w, 1.0 / float(np.mean([1.0 / e for e in effs]))) for w, effs in by_width.items())
        # Noisy timings of tiny shapes (a loaded CPU) can leave a prefill row barely above its fixed cost, and so an
        # efficiency far above the peak: such an anchor is held at MAX_EFFICIENCY, and the sources say so.
        clamped += [f"{kind}@{w}" for w, e in fitted if e > MAX_EFFICIENCY]
        anchors[kind] = tuple((w, min(e, MAX_EFFICIENCY)) for w, e in fitted)
    present = sorted(anchors)
    sources = {
        **({"weight_bytes_per_s_fallback": ("every module kind was timed at one weight size (one TP degree): "
                                            "the measured stream rate" if one_size else
                                            "the rows gave no positive bandwidth: the measured stream rate")}
           if fixed_bandwidth else {}),
        **({"kv_bytes_per_s_fallback": "the rows did not resolve the KV read (outside 1/20..20x the weight rate): "
                                       "the weight rate"} if fixed_kv else {}),
        "weight_bytes_per_s": f"fitted (decode rows) on {source}",
        "kv_bytes_per_s": f"fitted (decode rows) on {source}",
        "overhead_s": f"fitted per kind (decode rows) on {source}",
        "flops_efficiency": f"fitted per kind and width (prefill rows) on {source}",
        **({"flops_efficiency_clamped": f"{', '.join(clamped)}: fitted above {MAX_EFFICIENCY} of the peak (noise), "
                                        f"held at {MAX_EFFICIENCY}"} if clamped else {}),
    }
    for kind in KINDS:
        if kind not in anchors:
            nearest = "mlp" if "mlp" in anchors else present[0]
            anchors[kind] = anchors[nearest]
            sources[f"{kind}"] = (f"no {kind} rows: overhead from {head_overhead_from}, FLOP efficiency from {nearest} "
                                  "(an assumption)")
    return ComputeFit(1.0 / inv_w, 1.0 / inv_kv, overhead, anchors, sources)


def fit_h100_table(path: Path | str | None = None, peak_flops_per_s: float = 989e12) -> ComputeFit:
    """The shipped H100 fit: ``fit_compute`` on the fit rows of the H100 table (``H100_TABLE_SPLIT``)."""
    rows = [t for t in table_timings(h100_table(path)) if is_fit_row(t)]
    return fit_compute(rows, peak_flops_per_s, H100_TABLE_SOURCE + " (batch 1 and 64 rows)")


def errors(fit: ComputeFit, timings: Iterable[ModuleTiming], peak_flops_per_s: float) -> list[dict[str, Any]]:
    """Predicted against measured for each row: ``error = predicted / measured - 1``."""
    out = []
    for t in timings:
        predicted = fit.module_s(t.work, peak_flops_per_s)
        out.append({"row": t.label, "measured_s": t.seconds, "predicted_s": predicted,
                    "error": predicted / t.seconds - 1.0})  # fmt: skip
    return out


def rounded(fit: ComputeFit, digits: int = 4) -> ComputeFit:
    """The fit with every constant at ``digits`` significant digits (what the package ships)."""

    def r(x: float) -> float:
        return float(f"{x:.{digits}g}")

    return replace(
        fit, weight_bytes_per_s=r(fit.weight_bytes_per_s), kv_bytes_per_s=r(fit.kv_bytes_per_s),
        overhead_s={k: r(v) for k, v in fit.overhead_s.items()},
        flops_efficiency={k: tuple((w, r(e)) for w, e in v) for k, v in fit.flops_efficiency.items()},
    )  # fmt: skip


class TableCompute:
    """A ``ComputeModel`` that replays measured module timings (the bundled H100 table by default).

    A module whose per-rank shape is in the table takes its measured time (``source`` "measured on ...");
    any other module falls back to ``fallback`` (a roofline), and its source says so. This is what
    ``--compute measured`` gave on that H100, usable without the GPU.
    """

    is_gpu = False

    def __init__(self, fallback: Any, timings: Sequence[ModuleTiming] | None = None, device_name: str | None = None):
        data = h100_table()
        self.fallback = fallback
        self.device_name = device_name or data.get("device", "H100")
        self.memory_bytes = fallback.memory_bytes
        self.one_wave_gemms = fallback.one_wave_gemms  # the GPU the table was measured on is the roofline's
        self.label = f"measured on {self.device_name} (bundled table), {fallback.device_name} roofline elsewhere"
        rows = timings if timings is not None else table_timings(data)
        self._table = {t.work.key(): t.seconds for t in rows}
        self.hits = 0
        self.misses = 0

    def module_s(self, work: ModuleWork) -> float:
        seconds = self._table.get(work.key())
        if seconds is None:
            self.misses += 1
            return self.fallback.module_s(work)
        self.hits += 1
        return seconds

    def source(self, work: ModuleWork) -> str:
        if work.key() in self._table:
            return f"measured on {self.device_name}"
        return self.fallback.source(work)
