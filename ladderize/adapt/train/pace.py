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

What a pace is kept as, and its key, is ``kept_paces.py``'s.
"""

from __future__ import annotations

import os
import statistics
import time

import torch

from ..plan import kept_paces
from ..plan.kept_paces import TIMED_PIECES
from ..plan.stage_clock import Pace

REPEATS = 3  # timed calls per piece (after one untimed), the median kept
HEAD_PART, HEAD_TIMED_ROWS = 4, 256  # the kd head is timed on a quarter of a step's rows (at least 256) and scaled up


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
    from .compilation import adamw, compile_layers, graph_kinds
    from .optimizer_step import OptimizerStep
    from ..plan.compile_policy import resolve_compile
    from ...checkpoint.io import load_config
    from ...checkpoint.placement import resolve_device, training_precision
    from ...model.layout import LayerMode
    from ..layers.layer_source import StreamedLayers
    from ..objectives.losses import blockwise_kd, frozen_head
    from ...convert.residual_states import attention_kwargs

    began, own_began, machine_began = time.perf_counter(), time.process_time(), busy_cpu_seconds()
    load, timed_at = kept_paces.machine_load(), time.time()
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
        stack = OptimizerStep(adamw(params, lr=1e-12), params, target)  # the training's clip and step

        def train() -> None:
            with precision.context(target):
                out = layer(*states, **kwargs)
                loss = sum(tensor.float().square().mean() for tensor in out)
            stack.backward(loss)
            stack.clip(1.0)
            stack.step()
            sync()

        layer_train, train_compile = _timed(train)
        layer.requires_grad_(False)
        del stack
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
            stack = OptimizerStep(adamw(params, lr=1e-12), params, target)
            retrace_train = max(0.0, _once(train) - layer_train)
            layer.requires_grad_(False)
            del stack
    head_name = "lm_head.weight" if "lm_head.weight" in source.files else "model.embed_tokens.weight"
    weight = source.read(head_name).to(target, torch.float32)
    head_rows = min(rows, max(HEAD_TIMED_ROWS, rows // HEAD_PART))  # the head's time is linear in its rows: a part timed
    final = torch.randn(head_rows, hidden, generator=generator).to(target)

    head_module = torch.nn.Linear(hidden, weight.shape[0], bias=False, device="meta")
    head_module.weight = torch.nn.Parameter(weight, requires_grad=False)

    def head() -> None:  # objectives.blockwise_head_losses' kd: the student's logits whole, the teacher's a block at a time
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
    One process: ``measure`` at ``batch_size``. Under a launch, the launch's process group is running
    (``process_group.start``)."""
    from dataclasses import replace

    from ...checkpoint.placement import this_launch
    from ..plan.batches import StepSplit

    processes = this_launch().world
    if processes <= 1:
        return measure(checkpoint, seq_len=seq_len, batch_size=batch_size, **settings)
    import torch.distributed as dist

    from .. import process_group

    rows = StepSplit(batch_size, processes, grad_accum).local
    process_group.barrier()  # every process starts timing together: the launch's contention is in the pace
    own = measure(checkpoint, seq_len=seq_len, batch_size=rows, **settings)
    paces: list[Pace | None] = [None] * processes
    dist.all_gather_object(paces, own)
    return replace(paces[0], processes=processes,
                   **{piece: max(getattr(pace, piece) for pace in paces) for piece in SLOWEST})
