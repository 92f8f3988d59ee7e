"""How fast this device adapts a checkpoint: the timings that turn ``adapt --budget 30m`` into tokens.

``measure`` times, on the device and at the precision the run will use, the pieces every stage is
made of, on random states of one step's shape: a converted layer's forward alone (``layer_forward``)
and forward + backward + AdamW step (``layer_train``), the LM head with the kd loss forward + backward beside the
teacher's head forward, block by block as kd computes it (``head_step``: ``objectives.blockwise_kd``), and
reading one layer's weights (``layer_read``). With compiled layers (``compilation.py``, the run's own setting), the
pieces are timed compiled, with what the first calls waited for the compiler (``compile_s``), and what a layer of
another kind than the first converted one waits more (``retrace_forward_s`` for a forward without gradient,
``retrace_train_s`` for a training step). A stage's seconds follow from the pieces by the one time model
(``stage_clock.py``: ``Pace`` is a ``StageClock``).

The measurement takes seconds to a minute (a CPU is slower per call than a GPU, not in how many calls).
It also counts the CPU time every other process used meanwhile on the CPUs it may run on (``other_cpus``,
from ``/proc/stat`` on Linux): a pace timed beside other work is the pace of a busy machine, and the plan line says so
(``BUSY_CPUS`` or more), since a run on a quieter machine would have fit more tokens, and one on a busier
machine fewer.

Under a launcher every process times its own share of a step (``StepSplit``'s rows a process computes) at the same
moment (``measure_launch``: after a barrier), so the launch's contention for the CPUs, memory bandwidth or the
interconnect is in the timing, and the processes agree on each piece as the slowest process timed it (a data-parallel
step waits for its slowest process); the pace records the processes (``Pace.processes``), and the time model splits each
step over them (``stage_clock.py``).

A pace is kept per machine load (``load_band``: the 1-minute load average per CPU this process may use, in bands that
double, ``LOAD_BANDS``), with the load and the time it was timed at: a run at another load times its own, and a kept
pace that would refuse a budget is timed again where it was timed at a higher load than the machine's now
(``budget.size_recipe``), so a pace from a busier time never refuses what a timing now fits.
"""

from __future__ import annotations

import os
import statistics
import time

import torch

from .stage_clock import Pace

REPEATS = 3  # timed calls per piece (after one untimed), the median kept
BUSY_CPUS = 0.5  # other processes' CPUs' worth of work while the pace was timed, from which the plan line says so
HEAD_PART, HEAD_TIMED_ROWS = 4, 256  # the kd head is timed on a quarter of a step's rows (at least 256) and scaled up
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


def busy_cpu_seconds() -> float | None:
    """CPU seconds all processes have used since boot on the CPUs this process may run on (``/proc/stat``'s lines
    of those CPUs: all but idle and iowait), None where there is no ``/proc/stat``. A run pinned to one core
    (``taskset``) counts that core only; a container's host CPUs outside its affinity do not count."""
    allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    total = 0
    try:
        with open("/proc/stat") as stat:
            for line in stat:
                name, *fields = line.split()
                if not name.startswith("cpu") or name == "cpu":
                    continue
                if allowed is not None and int(name[3:]) not in allowed:
                    continue
                user, nice, system, _idle, _iowait, irq, softirq, steal = (int(value) for value in fields[:8])
                total += user + nice + system + irq + softirq + steal
    except (OSError, ValueError):
        return None
    return total / os.sysconf("SC_CLK_TCK")


def _once(fn) -> float:
    """The seconds of one call of ``fn``."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _timed(fn) -> tuple[float, float]:
    """The median seconds of ``fn`` after one untimed call, and what that first call took beyond it."""
    first = _once(fn)
    median = statistics.median([_once(fn) for _ in range(REPEATS)])
    return median, max(0.0, first - median)


def measure(checkpoint: str, *, seq_len: int, batch_size: int, device: str = "auto", dtype: str | None = None,
            mixed_precision: str | None = None, compile: bool | None = None) -> Pace:
    """Time the pieces of an adapt run of ``checkpoint`` on ``device`` (module docstring)."""
    from .compilation import adamw, compile_layers, graph_kinds, resolve_compile
    from ..checkpoint.io import load_config
    from ..checkpoint.placement import resolve_device, training_precision
    from ..model.layout import LayerMode
    from .layer_source import StreamedLayers
    from .objectives import blockwise_kd, frozen_head
    from ..convert.residual_states import attention_kwargs

    began, own_began, machine_began = time.perf_counter(), time.process_time(), busy_cpu_seconds()
    load, timed_at = machine_load(), time.time()
    target = resolve_device(device)
    precision = training_precision(dtype, target, mixed_precision)
    layout = load_config(checkpoint).layout
    converted = sorted(layout.converted_layers)
    first, last = converted[0], converted[-1]
    dense = LayerMode.with_traits(converted=False)
    teacher_kinds, student_kinds = graph_kinds([dense] * len(layout.modes), layout.modes)
    source = StreamedLayers(checkpoint, torch.float32, target)
    config = source.model.config
    hidden, rows = config.hidden_size, batch_size * seq_len
    generator = torch.Generator(device="cpu").manual_seed(0)
    states = tuple(torch.randn(batch_size, seq_len, hidden, generator=generator).to(target) for _ in range(2))
    kwargs = attention_kwargs(source.model, batch_size, seq_len, torch.float32, target)

    def sync() -> None:
        if target.type == "cuda":
            torch.cuda.synchronize(target)

    compiled = resolve_compile(compile, target)
    if compiled:
        compile_layers([source.model.model.layers[first]], target)
    start = time.perf_counter()
    with source.layer(first) as layer:
        layer_read = time.perf_counter() - start
        with torch.no_grad():
            def forward() -> None:
                with precision.context(target):
                    layer(*states, **kwargs)
                sync()

            layer_forward, forward_compile = _timed(forward)
        layer.requires_grad_(True)
        params = list(layer.parameters())
        optimizer = adamw(params, lr=1e-12)

        def train() -> None:
            with precision.context(target):
                out = layer(*states, **kwargs)
                loss = sum(tensor.float().square().mean() for tensor in out)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            sync()

        layer_train, train_compile = _timed(train)
        layer.requires_grad_(False)
        del optimizer
    retrace_forward = retrace_train = 0.0
    other = next((index for index in (first - 1, first + 1, *range(config.num_hidden_layers))
                  if 0 <= index < config.num_hidden_layers and student_kinds[index] != student_kinds[first]), None)
    if compiled and other is not None:  # what each further kind of layer of a stage waits for (module docstring)
        compile_layers([source.model.model.layers[other]], target)
        with source.layer(other) as layer:
            with torch.no_grad():  # forward and train run the layer their names see: this one now
                retrace_forward = max(0.0, _once(forward) - layer_forward)
            layer.requires_grad_(True)
            params = list(layer.parameters())
            optimizer = adamw(params, lr=1e-12)
            retrace_train = max(0.0, _once(train) - layer_train)
            layer.requires_grad_(False)
            del optimizer
    head_name = "lm_head.weight" if "lm_head.weight" in source.files else "model.embed_tokens.weight"
    weight = source.read(head_name).to(target, torch.float32)
    head_rows = min(rows, max(HEAD_TIMED_ROWS, rows // HEAD_PART))  # the head's time is linear in its rows: a part timed
    final = torch.randn(head_rows, hidden, generator=generator).to(target)

    head_module = torch.nn.Linear(hidden, weight.shape[0], bias=False, device="meta")
    head_module.weight = torch.nn.Parameter(weight, requires_grad=False)

    def head() -> None:  # objectives.head_losses' kd: the student's logits whole, the teacher's a block at a time
        student = final.detach().requires_grad_(True)
        with precision.context(target):
            teacher_head = frozen_head(head_module)
            loss = blockwise_kd(head_module(student), lambda part: teacher_head(final[part]), compiled=compiled)
        loss.backward()
        sync()

    head_step, head_compile = _timed(head)
    head_step, head_compile = head_step * rows / head_rows, head_compile * rows / head_rows
    wall, machine_ended = time.perf_counter() - began, busy_cpu_seconds()
    others = None if machine_began is None or machine_ended is None else \
        max(0.0, (machine_ended - machine_began) - (time.process_time() - own_began)) / wall
    return Pace(device=str(target), precision=precision.mixed_precision if precision.autocast is not None else "float32",
                tokens_per_call=rows, layer_forward=layer_forward, layer_train=layer_train, head_step=head_step,
                layer_read=layer_read, layers=config.num_hidden_layers, first_converted=first, last_converted=last,
                converted=len(converted), measured_s=wall, other_cpus=others,
                compiled=compiled, compile_s=forward_compile + train_compile + head_compile if compiled else 0.0,
                retrace_forward_s=retrace_forward, retrace_train_s=retrace_train, teacher_kinds=teacher_kinds,
                student_kinds=student_kinds, converted_kinds=tuple(student_kinds[index] for index in converted),
                load=load, timed_at=timed_at)


SLOWEST = (*TIMED_PIECES, "compile_s", "retrace_forward_s",
           "retrace_train_s", "measured_s")  # the pieces the processes of a launch agree on as its slowest timed them


def measure_launch(checkpoint: str, *, seq_len: int, batch_size: int, grad_accum: int = 1, **settings) -> Pace:
    """``measure`` on every process of the launch this process runs under, all at once (module docstring), each timing
    its share of a step of ``batch_size`` sequences (``batches.StepSplit``'s rows of a micro-batch); every process gets
    the same pace: each piece the slowest process's, the main process's record otherwise, ``processes`` the launch's.
    One process: ``measure`` at ``batch_size``."""
    from dataclasses import replace

    from ..checkpoint.placement import resolve_device, world_size
    from .batches import StepSplit

    processes = world_size()
    if processes <= 1:
        return measure(checkpoint, seq_len=seq_len, batch_size=batch_size, **settings)
    import torch.distributed as dist

    from . import process_group

    process_group.start(resolve_device(settings.get("device", "auto")))
    rows = StepSplit(batch_size, processes, grad_accum).local
    process_group.barrier()  # every process starts timing together: the launch's contention is in the pace
    own = measure(checkpoint, seq_len=seq_len, batch_size=rows, **settings)
    paces: list[Pace | None] = [None] * processes
    dist.all_gather_object(paces, own)
    return replace(paces[0], processes=processes,
                   **{piece: max(getattr(pace, piece) for pace in paces) for piece in SLOWEST})


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
    from ..paths import cache_path

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

    from ..checkpoint.atomic import atomic_file
    from ..paths import cache_path

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
