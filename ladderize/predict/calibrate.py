"""``ladderize predict --calibrate``: fit the compute model (and the all-reduce) on the user's own hardware.

It times the modules ``predict`` needs (one rank's attention, MLP and LM head, prefill and decode, at
every requested TP degree and batch) on the local device with ``MeasuredCompute`` (the runtime's own
kernels; CUDA graphs on a GPU), fits ``ComputeFit`` with ``fit.fit_compute`` (the same function that
fits the bundled H100 table), and, where more than one GPU is visible, times NCCL all-reduces at the
message sizes those steps send and fits the two-protocol all-reduce curve. The result is a profile
JSON (``CalibrationProfile``) that ``ladderize predict --profile FILE`` reads: its ``gpu`` becomes the
roofline's profile, its ``interconnect`` (when measured) the all-reduce model.

The device's "peaks" are what it measures (a square matmul's FLOP/s and a GEMV's streaming bytes/s),
so the fitted efficiencies are shares of those, and the profile's sources say so.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from ..errors import LadderizeError
from ..checkpoint.atomic import write_file_atomic
from ..model.layout import check_tp_divides
from ..checkpoint.shapes import ModelShape
from .estimate import decode_kv_len
from .fit import ComputeFit, ModuleTiming, errors, fit_compute
from .gpus import GPUProfile
from .interconnect import InterconnectProfile, ring_volume
from .work import module_work

PROFILE_RECORD = "ladderize-predict-profile"
PROFILE_VERSION = 1
#: A fit that misses any timed module by more than this (relative) does not describe the device: a loaded CPU's
#: timings of tiny shapes, for instance (one such fit missed by +40,275%). The shipped h100 fit misses its worst H100 row by
#: 15.6%.
FIT_ERROR_LIMIT = 0.5


def worst_fit_row(rows: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The timed module the fit misses most (rows carry ``error`` = fitted / measured - 1)."""
    return max((r for r in rows if "error" in r), key=lambda r: abs(r["error"]), default=None)


def check_fit(rows: Sequence[dict[str, Any]], where: str) -> None:
    """Refuse (one line) a fit whose worst row is off by more than ``FIT_ERROR_LIMIT``."""
    worst = worst_fit_row(rows)
    if worst is not None and abs(worst["error"]) > FIT_ERROR_LIMIT:
        raise LadderizeError(
            f"{where}: the fit misses {worst['phase']} {worst['kind']} (batch {worst['batch']}) by "
            f"{worst['error'] * 100:+,.1f}% (limit ±{FIT_ERROR_LIMIT * 100:.0f}%): the timings are noise, not this "
            "device's speed; calibrate on an idle machine or a GPU"
        )


@dataclass
class CalibrationProfile:
    """What ``--calibrate`` writes: the fitted GPU profile, the measured all-reduce (or none), and the raw rows."""

    gpu: GPUProfile
    interconnect: InterconnectProfile | None
    timings: list[dict[str, Any]] = field(default_factory=list)
    allreduce: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "record": PROFILE_RECORD, "version": PROFILE_VERSION, "gpu": self.gpu.to_dict(),
            "interconnect": self.interconnect.to_dict() if self.interconnect else None,
            "timings": self.timings, "allreduce": self.allreduce, "notes": self.notes,
        }  # fmt: skip


def _module_rows(model: ModelShape, tps: Sequence[int], batches: Sequence[int], prompt: int, gen: int) -> list:
    kv = decode_kv_len(prompt, gen)
    rows = []
    for tp in tps:
        for batch in batches:
            for kind in ("attention", "mlp", "head"):
                rows.append(("decode", module_work(model, kind, tp, batch, 1, kv)))
            for kind in ("attention", "mlp"):
                rows.append(("prefill", module_work(model, kind, tp, batch, prompt, prompt)))
    return rows


def calibrate_compute(
    model: ModelShape, tps: Sequence[int], batches: Sequence[int], prompt: int, gen: int, compute: Any
) -> tuple[GPUProfile, list[dict[str, Any]]]:
    """Time every module ``predict`` needs with ``compute`` (a ``MeasuredCompute``) and fit a GPU profile."""
    for tp in tps:
        check_tp_divides(tp, model.num_attention_heads, model.num_key_value_heads, model.intermediate_size,
                         replicate_kv=True)  # fmt: skip
    if len(tps) * len(batches) < 2:
        raise LadderizeError("--calibrate needs at least two (TP, batch) settings to separate bandwidth from fixed cost: "
                             "give two --tp degrees or two --batch sizes")
    flops_per_s, bytes_per_s = compute.device_rates()
    timings: list[ModuleTiming] = []
    rows: list[dict[str, Any]] = []
    for phase, work in _module_rows(model, tps, batches, prompt, gen):
        seconds = compute.module_s(work)
        label = f"tp{model.num_attention_heads // max(1, work.heads)} b{work.batch} {phase} {work.kind}"
        timings.append(ModuleTiming(work, seconds, phase, label))
        rows.append({"phase": phase, "kind": work.kind, "batch": work.batch, "q_len": work.q_len,
                     "kv_len": work.kv_len, "heads": work.heads, "intermediate_size": work.intermediate_size,
                     "seconds": seconds, "source": compute.source(work)})  # fmt: skip
    where = f"{compute.device_name} ({model.name}, TP {','.join(map(str, tps))}, batch {','.join(map(str, batches))})"
    fit = fit_compute(timings, flops_per_s, f"modules timed by ladderize predict --calibrate on {where}",
                      fallback_bytes_per_s=bytes_per_s)
    for row, err in zip(rows, errors(fit, timings, flops_per_s)):
        row["fitted_s"], row["error"] = err["predicted_s"], err["error"]
    gpu = GPUProfile(
        name=compute.device_name, hbm_bytes_per_s=bytes_per_s, peak_flops_per_s=flops_per_s, fit=fit,
        memory_bytes=compute.memory_bytes,
        sources={"hbm_bytes_per_s": "measured on this device: a GEMV's streaming bytes/s",
                 "peak_flops_per_s": "measured on this device: a square matmul's FLOP/s (the efficiencies are shares of it)",
                 "fit": f"ladderize predict --calibrate, {time.strftime('%Y-%m-%dT%H:%M:%S')}, {compute.label}"},
    )  # fmt: skip
    return gpu, rows


# ---- all-reduce across local GPUs ------------------------------------------------------------------


def _allreduce_worker(rank: int, world: int, port: int, sizes: list[int], repeats: int, out: str) -> None:
    """One rank: NCCL all-reduces of each size, timed with CUDA events (median); rank 0 writes the results."""
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        results = []
        for nbytes in sizes:
            x = torch.ones(max(1, nbytes // 2), dtype=torch.bfloat16, device=f"cuda:{rank}")
            for _ in range(5):
                dist.all_reduce(x)
            torch.cuda.synchronize()
            inner = 20 if nbytes < 2**24 else 3
            samples = []
            for _ in range(repeats):
                dist.barrier()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(inner):
                    dist.all_reduce(x)
                end.record()
                end.synchronize()
                samples.append(start.elapsed_time(end) / 1e3 / inner)
            results.append({"bytes": int(x.numel() * 2), "seconds": statistics.median(samples)})
            del x
        if rank == 0:
            Path(out).write_text(json.dumps(results))
    finally:
        dist.destroy_process_group()


def time_allreduce(world: int, sizes: Sequence[int], repeats: int = 5) -> list[dict[str, Any]]:
    """NCCL all-reduce times over ``world`` local GPUs at each size (bytes), one process per GPU."""
    import torch.multiprocessing as mp

    from ..runtime.launch import free_port

    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "allreduce.json")
        mp.spawn(_allreduce_worker, args=(world, free_port(), sorted(set(int(s) for s in sizes)), repeats, out),
                 nprocs=world, join=True)  # fmt: skip
        return json.loads(Path(out).read_text())


def fit_allreduce(points: Sequence[dict[str, Any]], ranks: int, name: str) -> InterconnectProfile:
    """The two-protocol curve through measured (bytes, seconds) at ``ranks`` ranks: the sizes split where two
    lines (least squares, relative error) fit best; the smaller sizes fix the latency protocol, the larger
    ones the bandwidth protocol."""
    import numpy as np

    if len(points) < 4:
        raise LadderizeError("all-reduce calibration needs at least 4 message sizes")
    ordered = sorted(points, key=lambda p: p["bytes"])
    steps = 2 * (ranks - 1)

    def line(part: Sequence[dict[str, Any]]) -> tuple[float, float, float]:
        y = np.array([p["seconds"] for p in part])
        x = np.array([[1.0, ring_volume(p["bytes"], ranks)] for p in part]) / y[:, None]
        (alpha, beta), *_ = np.linalg.lstsq(x, np.ones(len(part)), rcond=None)
        alpha, beta = max(0.0, float(alpha)), max(float(beta), 1e-15)
        residual = float(np.sum((x @ np.array([alpha, beta]) - 1.0) ** 2))
        return alpha, beta, residual

    best = min(range(2, len(ordered) - 1), key=lambda k: line(ordered[:k])[2] + line(ordered[k:])[2])
    (small_alpha, small_beta, _), (large_alpha, large_beta, _) = line(ordered[:best]), line(ordered[best:])
    measured = f"measured by ladderize predict --calibrate on {ranks} local GPUs (NCCL, bf16)"
    from .interconnect import PROFILES

    nvlink = PROFILES["h100-nvlink"]
    return InterconnectProfile(
        name=name, description=f"{ranks} local GPUs, NCCL all-reduce as measured", algorithm="ring", launch_s=0.0,
        latency_s=small_alpha / steps, bus_bytes_per_s=1.0 / large_beta, overlap_slowdown=nvlink.overlap_slowdown,
        hbm_traffic=nvlink.hbm_traffic,
        large_latency_s=large_alpha / steps, small_bus_bytes_per_s=1.0 / small_beta,
        sources={"latency_s": f"{measured}: the intercept over the small sizes, per ring hop",
                 "small_bus_bytes_per_s": f"{measured}: the slope over the small sizes",
                 "large_latency_s": f"{measured}: the intercept over the large sizes, per ring hop",
                 "bus_bytes_per_s": f"{measured}: the slope over the large sizes",
                 "launch_s": "folded into the per-hop latencies (one rank count measured)",
                 "overlap_slowdown": "not measured: h100-nvlink's (24 NCCL channels of 132 SMs; edit this file to change it)",
                 "hbm_traffic": "not measured: h100-nvlink's (a ring step reads two chunks, writes one)"},
    )  # fmt: skip


def allreduce_sizes(model: ModelShape, batches: Sequence[int], prompt: int) -> list[int]:
    """The message sizes a step sends: decode ``batch * hidden``, prefill ``batch * prompt * hidden`` (bf16)."""
    sizes = {b * model.hidden_size * 2 for b in batches} | {b * prompt * model.hidden_size * 2 for b in batches}
    return sorted(sizes | {4096, 2**20, 2**26})  # and a spread, so both protocols have points


def run_calibration(
    model: ModelShape, tps: Sequence[int], batches: Sequence[int], prompt: int, gen: int, out: Path | str,
    force: bool = False, cache_dir: Path | str | None = None, device: str | None = None, repeats: int = 5,
    max_call_s: float | None = None, max_bytes: float | None = None,
) -> CalibrationProfile:
    """Time, fit, and write the profile JSON to ``out`` atomically (``force`` to replace an existing file)."""
    from .measured import MeasuredCompute

    out = Path(out).expanduser()
    if out.exists() and not force:
        raise LadderizeError(f"output {out} already exists; pass --force to replace it")
    if out.exists() and out.is_dir():
        raise LadderizeError(f"output {out} is a directory; give a file name for the profile")
    compute = MeasuredCompute(cache_dir=cache_dir, device=device, repeats=repeats, max_call_s=max_call_s,
                              max_bytes=max_bytes)  # fmt: skip
    gpu, rows = calibrate_compute(model, tps, batches, prompt, gen, compute)
    check_fit(rows, f"calibration not written to {out}")  # before anything is written
    profile = CalibrationProfile(gpu, None, timings=rows)
    gpus = 0
    if compute.is_gpu:
        import torch

        gpus = torch.cuda.device_count()
    if gpus > 1:
        points = time_allreduce(gpus, allreduce_sizes(model, batches, prompt), repeats)
        profile.allreduce = points
        profile.interconnect = fit_allreduce(points, gpus, f"measured-{gpus}gpu")
    else:
        profile.notes.append("one device here: no all-reduce timed; predict takes --interconnect for communication")
    write_file_atomic(out, json.dumps(profile.to_json(), indent=2) + "\n")
    return profile


def load_profile(path: Path | str) -> tuple[GPUProfile, InterconnectProfile | None]:
    """A ``--calibrate`` profile JSON: its GPU profile and its measured interconnect (None if none)."""
    from .gpus import load_gpu_profile

    path = Path(path).expanduser()
    gpu = load_gpu_profile(path)  # checks the file and reads its "gpu"
    data = json.loads(path.read_text())
    if isinstance(data, dict) and isinstance(data.get("timings"), list):
        check_fit(data["timings"], f"profile {path} refused")  # profiles written before the check, too
    section = data.get("interconnect") if isinstance(data, dict) else None
    if not section:
        return gpu, None
    try:
        return gpu, InterconnectProfile(**section)
    except TypeError as exc:
        raise LadderizeError(f"profile {path}: bad interconnect section ({exc})") from None


def fit_summary(profile: CalibrationProfile) -> list[str]:
    """Lines for the terminal: the fitted constants and the worst row."""
    fit: ComputeFit = profile.gpu.fit
    worst = worst_fit_row(profile.timings)
    lines = [
        f"device: {profile.gpu.name}; measured matmul {profile.gpu.peak_flops_per_s / 1e12:.3g} TFLOP/s, "
        f"stream {profile.gpu.hbm_bytes_per_s / 1e9:.3g} GB/s",
        f"fit: weights {fit.weight_bytes_per_s / 1e9:.3g} GB/s, KV {fit.kv_bytes_per_s / 1e9:.3g} GB/s, fixed cost "
        + ", ".join(f"{k} {v * 1e6:.1f} us" for k, v in fit.overhead_s.items()),
        f"{len(profile.timings)} modules timed"
        + (f"; worst fit {worst['phase']} {worst['kind']} batch {worst['batch']}: {worst['error'] * 100:+.1f}% "
           f"(limit ±{FIT_ERROR_LIMIT * 100:.0f}%)" if worst else ""),
    ]
    if profile.interconnect is not None:
        ic = profile.interconnect
        lines.append(f"all-reduce: {len(profile.allreduce)} sizes; large-message busbw {ic.bus_bytes_per_s / 1e9:.3g} GB/s")
    return lines + profile.notes
