"""How fast this device adapts a checkpoint: the timings that turn ``adapt --budget 30m`` into tokens.

``measure`` times, on the device and at the precision the run will use, the pieces every stage is
made of, on random states of one step's shape: a converted layer's forward alone (``layer_forward``)
and forward + backward + AdamW step (``layer_train``), the LM head with the kd loss forward + backward beside the
teacher's head forward, block by block as kd computes it (``head_step``: ``objectives.blockwise_kd``), and
reading one layer's weights (``layer_read``). The stages' times follow from what each one runs per token
(``stage_seconds``):

- sequential (``seq-local``): the teacher's layers below the first converted one once, then for every
  layer from the first converted to the last its teacher forward and the student's forward (the
  states moved past it), and for each converted layer ``epochs`` training passes (and its closed-form
  start, ``CLOSED_FORM_TRAINS`` more, with ``closed_form``);
- any other stage (``kd``, ``local``, ``lm``): per token the teacher's forward through every layer and the
  student's from the first converted one up (the frozen layers below it are the teacher's, computed once:
  ``objectives.AdaptLoss``'s shared prefix), the backward through the same layers, and the heads (with
  ``train: all``, the student's forward and backward through every layer); a stage that reads the teacher's
  states a sequential stage stored (``sequential_schedule.reads_stored_teacher``) runs no teacher layer;
- every stage reads the weights of both models about twice (``layer_read`` per layer) and writes one;
- with compiled layers (``compilation.py``, the run's own setting), the pieces are timed compiled, and each stage
  waits ``COMPILES_PER_STAGE`` times for the compiler as long as the measurement's first calls did (``compile_s``),
  and again for every other kind of layer graph it runs (``compile_waits``): the layers of a kind share one graph
  (``compilation.graph_kinds``; ladder 15-29 of a 30-layer model: the first layer, the dense ones after it and the
  ladder ones). The pace times that wait on a layer of another kind than the first converted one
  (``retrace_forward_s`` for a forward without gradient, ``retrace_train_s`` for a training step).

The measurement takes seconds to a minute (a CPU is slower per call than a GPU, not in how many calls).
It also counts the CPU time every other process used meanwhile on the CPUs it may run on (``other_cpus``,
from ``/proc/stat`` on Linux): a pace timed beside other work is the pace of a busy machine, and the plan line says so
(``BUSY_CPUS`` or more), since a run on a quieter machine would have fit more tokens, and one on a busier
machine fewer.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch

from .sequential_schedule import reads_stored_teacher

REPEATS = 3  # timed calls per piece (after one untimed), the median kept
FIXED_READS = 3  # weight passes per stage: the student's and the teacher's reads, and the write
# a converted layer's closed-form start (``least_squares.py``): two passes over the calibration set, forward and the
# backward to the module's output, about 1.5 training passes (38 s measured against 48 s for 2 on SmolLM2, 8,192 tokens)
CLOSED_FORM_TRAINS = 1.5
# compiled layers: each stage compiles its layers' graphs for its own shapes (training, evaluation and state batches)
COMPILES_PER_STAGE = 2
BUSY_CPUS = 0.5  # other processes' CPUs' worth of work while the pace was timed, from which the plan line says so
HEAD_PART, HEAD_TIMED_ROWS = 4, 256  # the kd head is timed on a quarter of a step's rows (at least 256) and scaled up
PACE_CACHE = "pace"  # paths.cache_path's folder of the paces timed on this machine (``cached_pace``)


@dataclass(frozen=True)
class Pace:
    """Seconds of each piece for one step of ``tokens_per_call`` tokens, and the model's layer counts."""

    device: str
    precision: str
    tokens_per_call: int
    layer_forward: float
    layer_train: float
    head_step: float
    layer_read: float
    layers: int
    first_converted: int
    last_converted: int
    converted: int
    measured_s: float
    other_cpus: float | None = None  # other processes' CPU seconds per second while timed (None: not known here)
    compiled: bool = False  # decoder layers compiled (compilation.py), as the run will
    compile_s: float = 0.0  # compiled layers: the first forward's and training step's wait for the compiler
    retrace_forward_s: float = 0.0  # compiled layers: another kind's first forward without gradient, beyond its pace
    retrace_train_s: float = 0.0  # and its first training step (forward and backward traced), beyond its pace
    # the graph kind of each teacher and student layer and of each converted layer (compilation.graph_kinds), from
    # which a stage's graphs follow (compile_waits)
    teacher_kinds: tuple[int, ...] = ()
    student_kinds: tuple[int, ...] = ()
    converted_kinds: tuple[int, ...] = ()

    def record(self) -> dict[str, Any]:
        return asdict(self)


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
                student_kinds=student_kinds, converted_kinds=tuple(student_kinds[index] for index in converted))


def stage_seconds(pace: Pace, step: dict[str, Any], stored_teacher: bool = False) -> float:
    """The expected wall seconds of one resolved stage (module docstring); ``stored_teacher``: it reads the teacher's
    states a sequential stage stored (``reads_stored_teacher``), so neither model's frozen layers run."""
    per_token = 1.0 / pace.tokens_per_call
    reads = FIXED_READS * pace.layers * pace.layer_read
    if step.get("local_schedule") == "sequential":
        span = pace.last_converted - pace.first_converted + 1
        epochs = float(step.get("epochs", 1.0))
        fits = CLOSED_FORM_TRAINS if step.get("closed_form") else 0.0
        forwards = pace.first_converted + 2 * span
        per = forwards * pace.layer_forward + pace.converted * (epochs + fits) * pace.layer_train
        # without gradient: the teacher's layers (below the first converted one and past it), the student's past it
        # (its states, and each converted layer's held-out loss); with it: the converted layers
        waits = compile_waits(pace, {*pace.teacher_kinds, *pace.student_kinds[pace.first_converted:]},
                              set(pace.converted_kinds))
        return reads + waits + step["tokens"] * per * per_token
    trains_all = step.get("train") == "all"
    student_layers = pace.layers if trains_all else pace.layers - pace.first_converted
    backward = student_layers * (pace.layer_train - pace.layer_forward)
    teacher_layers = 0 if stored_teacher else pace.layers
    per = (teacher_layers + student_layers) * pace.layer_forward + backward + pace.head_step
    waits = compile_waits(pace, set() if stored_teacher else set(pace.teacher_kinds),
                          set(pace.student_kinds[0 if trains_all else pace.first_converted:]))
    return reads + waits + step["tokens"] * per * per_token


def compile_waits(pace: Pace, forward_kinds: set[int], trained_kinds: set[int]) -> float:
    """The seconds a stage of compiled layers waits for the compiler (module docstring): the first converted layer's
    kind compiled ``COMPILES_PER_STAGE`` times, then each other kind of graph it runs without gradient
    (``forward_kinds``) and with it (``trained_kinds``) traced once (0 with eager layers)."""
    if not pace.compiled:
        return 0.0
    first = set(pace.student_kinds[pace.first_converted : pace.first_converted + 1])
    return (COMPILES_PER_STAGE * pace.compile_s + len(forward_kinds - first) * pace.retrace_forward_s
            + len(trained_kinds - first) * pace.retrace_train_s)


def stages_seconds(pace: Pace, steps: list[dict[str, Any]], data_tokens: int | None = None,
                   before: list[dict[str, Any]] = ()) -> list[float]:
    """The expected wall seconds of each of ``steps``, run after the finished stages ``before`` (a stage that will
    read the teacher's states a sequential stage stores is timed so: ``reads_stored_teacher``)."""
    done = list(before)
    return [stage_seconds(pace, step, reads_stored_teacher([*done, *steps], len(done) + index, data_tokens))
            for index, step in enumerate(steps)]


def recipe_seconds(pace: Pace, steps: list[dict[str, Any]], data_tokens: int | None = None,
                   before: list[dict[str, Any]] = ()) -> float:
    """The expected wall seconds of ``steps``, run after the finished stages ``before``."""
    return sum(stages_seconds(pace, steps, data_tokens, before))


def tokens_for_seconds(pace: Pace, steps: list[dict[str, Any]], seconds: float, size, data_tokens: int | None = None,
                       before: list[dict[str, Any]] = ()) -> int:
    """The most token passes whose stages, sized by ``size(steps, tokens)``, are expected to fit in ``seconds``
    (0 when not even the smallest sizing fits)."""
    def fits(tokens: int) -> bool:
        return recipe_seconds(pace, size(steps, tokens), data_tokens, before) <= seconds

    low, high = 0, 1
    while fits(high) and high < 10**13:
        low, high = high, high * 2
    while high - low > max(1, low // 10_000):
        middle = (low + high) // 2
        if fits(middle):
            low = middle
        else:
            high = middle
    return low


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
             mixed_precision: str | None, compile: bool | None) -> str:
    """The name of the pace ``measure`` would time for these arguments on this machine: what the pace depends on, the
    model's shape and layout (its ``config.json``'s settings, not its path: another conversion of the same shape shares
    it), the step's shape, the device and precision, compilation, the CPUs this process may use and the torch build."""
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
    return hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()[:20]


# config.json entries that name the checkpoint or its tools, not its shape: they leave the pace alone
CONFIG_NOT_PACE = {"_name_or_path", "transformers_version", "auto_map", "architectures", "name_or_path"}


def pace_file(key: str):
    """Where the pace of ``key`` is kept (``store_pace``)."""
    from ..paths import cache_path

    return cache_path(PACE_CACHE) / f"{key}.json"


def cached_pace(key: str) -> Pace | None:
    """The pace stored under ``key`` (``store_pace``) by an earlier run on this machine, None where there is none."""
    import json

    file = pace_file(key)
    try:
        values = json.loads(file.read_text())
        return Pace(**{name: tuple(value) if isinstance(value, list) else value for name, value in values.items()})
    except (OSError, ValueError, TypeError):
        return None


TIMED_PIECES = ("layer_forward", "layer_train", "head_step", "layer_read")


def store_pace(key: str, pace: Pace) -> None:
    """Keep under ``key``, for the next run's budget check, the fastest of ``pace`` and the pace kept there, piece by
    piece: a budget refused by it is too short even on this machine at its quietest (written whole, then renamed)."""
    import json
    from dataclasses import replace

    from ..checkpoint.atomic import atomic_file
    from ..paths import cache_path

    kept = cached_pace(key)
    if kept is not None:
        pace = replace(pace, **{piece: min(getattr(pace, piece), getattr(kept, piece)) for piece in TIMED_PIECES})
    folder = cache_path(PACE_CACHE)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with atomic_file(folder / f"{key}.json") as tmp:
            tmp.write_text(json.dumps(pace.record()))
    except OSError:  # a read-only cache costs the next run a timing, not this run its result
        pass
