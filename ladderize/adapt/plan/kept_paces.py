"""The paces this machine has timed (``pace.measure``), kept per machine load for the next run, and how a plan names them.

A pace is kept per machine load (``load_band``: the 1-minute load average per CPU this process may use, in bands that
double, ``LOAD_BANDS``), with the load and the time it was timed at: a run at another load times its own, and a kept
pace that would refuse a budget is timed again where it was timed at a higher load than the machine's now
(``budget.size_recipe``), so a pace from a busier time never refuses what a timing now fits.

No torch at import and nothing of the training: the plan (``budget.size_recipe``) reads and keeps paces here; one timed
just now (``pace.measure_launch``, by the entrance, where the plan asked for it) is handed to it as data.
"""

from __future__ import annotations

import os

from .stage_clock import Pace

BUSY_CPUS = 0.5  # other processes' CPUs' worth of work while the pace was timed, from which the plan line says so
PACE_CACHE = "pace"  # paths.cache_path's folder of the paces timed on this machine (``cached_pace``)
TIMED_PIECES = ("layer_forward", "layer_train", "head_step", "layer_read")  # what a kept pace keeps the fastest of
LOAD_BANDS = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0)  # load per CPU: band 0 below 0.5, band 1 from 0.5 to 1, ..., band 6 from 16


def machine_load() -> float | None:
    """The 1-minute load average per CPU this process may run on (``os.getloadavg``; None where there is none)."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return None
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return load / max(1, cpus)


def load_band(load: float | None) -> int:
    """The band of ``load`` (``LOAD_BANDS``; 0 where it is not known): the paces kept for one band are timed at loads
    at most twice apart."""
    return 0 if load is None else sum(load >= edge for edge in LOAD_BANDS)


def describe_load(load: float | None) -> str:
    """``load 3.2 per CPU`` (``load not known``)."""
    return "load not known" if load is None else f"load {load:.1f} per CPU"


def describe(pace: Pace) -> str:
    busy = "" if pace.other_cpus is None or pace.other_cpus < BUSY_CPUS else \
        (f"; other processes kept {pace.other_cpus:.1f} CPUs busy meanwhile, so the plan is sized for a machine that "
         f"busy (a quieter one fits more, a budget in tokens fits the same)")
    compiled = (f", compiled layers, {pace.compile_s:.0f} s to compile, {pace.retrace_train_s:.1f} s more for each "
                f"other kind of layer trained" if pace.compiled else "")
    return (f"on {pace.device} ({pace.precision}{compiled}): timed in {pace.measured_s:.0f} s (a converted layer "
            f"{pace.layer_train * 1e3:.0f} ms forward + backward, {pace.layer_forward * 1e3:.0f} ms forward per "
            f"{pace.tokens_per_call:,} tokens{busy})")


def pace_key(checkpoint: str, *, seq_len: int, batch_size: int, device: str, dtype: str | None,
             mixed_precision: str | None, compile: bool | None, processes: int = 1, grad_accum: int = 1) -> str:
    """The name of the pace ``measure_launch`` would time for these arguments on this machine: what the pace depends
    on, the model's shape and layout (its ``config.json``'s settings, not its path: another conversion of the same shape
    shares it), the step's shape and its split over the launch's ``processes``, the device and precision, compilation,
    the CPUs this process may use and the torch build."""
    import hashlib
    import json
    from pathlib import Path

    import torch

    config = Path(checkpoint).expanduser().absolute() / "config.json"
    try:
        shape = json.loads(config.read_text())
        shape = {name: value for name, value in shape.items() if name not in CONFIG_NOT_PACE}
    except (OSError, ValueError):
        shape = {"checkpoint": str(config.parent)}
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    facts = {"model": shape, "seq_len": seq_len, "batch_size": batch_size, "device": device, "dtype": dtype,
             "mixed_precision": mixed_precision, "compile": compile, "cpus": cpus, "torch": torch.__version__}
    if processes > 1:  # (one process: the name its pace has always had)
        facts.update(processes=processes, grad_accum=grad_accum)
    return hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()[:20]


# config.json entries that name the checkpoint or its tools, not its shape: they leave the pace alone
CONFIG_NOT_PACE = {"_name_or_path", "transformers_version", "auto_map", "architectures", "name_or_path"}


def pace_file(key: str, band: int = 0):
    """Where the pace of ``key`` timed at a load of band ``band`` (``load_band``) is kept (``store_pace``)."""
    from ...paths import cache_path

    return cache_path(PACE_CACHE) / f"{key}-load{band}.json"


def cached_pace(key: str, band: int = 0) -> Pace | None:
    """The pace stored under ``key`` for load band ``band`` (``store_pace``) by an earlier run on this machine, None
    where there is none."""
    import json

    file = pace_file(key, band)
    try:
        values = json.loads(file.read_text())
        return Pace(**{name: tuple(value) if isinstance(value, list) else value for name, value in values.items()})
    except (OSError, ValueError, TypeError):
        return None


def store_pace(key: str, pace: Pace) -> None:
    """Keep under ``key``, for the next run at the load band ``pace`` was timed at, the fastest of ``pace`` and the pace
    kept for that band, piece by piece, with the lower of their loads and the later time (written whole, then
    renamed)."""
    import json
    from dataclasses import replace

    from ...checkpoint.atomic import atomic_file
    from ...paths import cache_path

    band = load_band(pace.load)
    kept = cached_pace(key, band)
    if kept is not None:
        loads = [load for load in (pace.load, kept.load) if load is not None]
        pace = replace(pace, **{piece: min(getattr(pace, piece), getattr(kept, piece)) for piece in TIMED_PIECES},
                       load=min(loads) if loads else None)
    folder = cache_path(PACE_CACHE)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with atomic_file(pace_file(key, band)) as tmp:
            tmp.write_text(json.dumps(pace.record()))
    except OSError:  # a read-only cache costs the next run a timing, not this run its result
        pass
