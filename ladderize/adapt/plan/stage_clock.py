"""How many seconds a stage takes on a device: one time model, its rates from where the device was timed or priced.

``stage_seconds(clock, stage, stored_teacher)`` splits a resolved stage into what it runs and asks the clock (a
``StageClock``: the device's rates) for the seconds of each part:

- the fixed costs of any stage (``fixed_seconds``): reading the weights of both models and writing the student's;
- a sequential stage (``sequential_seconds``): the teacher's forward over the calibration set once, then each converted
  layer trained ``epochs`` times on the cached states (and its closed-form start, with ``closed_form``);
- any other stage (``joint_seconds``): its steps, each the teacher's forward, the student's forward and backward and
  the heads; without the teacher's layers where it reads the states a sequential stage stored (``stored_teacher``).

Two sources give the rates:

- ``Pace``: a device timed here (``pace.measure``): seconds per piece of one process's step of ``tokens_per_call``
  tokens (a layer's forward, its training step, the kd head, a layer's read), and the compiler's waits with compiled
  layers; under a launcher every process timed together (``processes``), so the contention of the launch is in it;
- ``cost.PricedDevice``: a launch priced from afar (``adapt --dry-run 8xH100``): FLOPs per token
  (``cost.FlopCount``) over the GPU's peak FLOP/s x an assumed MFU, on the processes a step is split over.

Both count the processes' data parallelism alike: a joint stage's steps take what the busiest process computes of
each (``process_share``: its rows of every micro-batch, ``batches.StepSplit``), a sequential stage's passes are split
over the processes its step's batch reaches (``sequential_processes``); a wall budget under N processes is sized to
what N processes do in it.

Each source counts the work in its own unit: the pace in layer passes (the layers a stage runs, from the first
converted one up), the launch in FLOPs (the objectives' reads, ``cost.FlopCount``); only the pace knows the reads and
the compiler's waits (0 from afar). Where the counts meet, the seconds agree: a kd stage timed by a pace whose pieces
take what the launch's assumed rate gives their FLOPs takes the launch's seconds (``tests/adapt/test_stage_clock.py``).

``stages_seconds`` times a recipe's stages in order (a joint stage on the rows a sequential stage before it stored
reads their teacher states: ``sequential_schedule.reads_stored_teacher``); ``tokens_for_seconds`` sizes them to a wall
time. The pace's count, per token:

- sequential: the teacher's layers below the first converted one once, then for every layer from the first converted
  to the last its teacher forward and the student's forward (the states moved past it), and for each converted layer
  ``epochs`` training passes (``CLOSED_FORM_TRAINS`` more with ``closed_form``);
- joint (``kd``, ``local``, ``lm``): the teacher's forward through every layer and the student's from the first
  converted one up (the frozen layers below it are the teacher's, computed once: ``objectives.AdaptLoss``'s shared
  prefix), the backward through the same layers, and the heads (with ``train: all``, the student's forward and
  backward through every layer); a stage that reads stored teacher states runs no teacher layer;
- every stage reads the weights of both models about twice (``layer_read`` per layer) and writes one
  (``FIXED_READS``);
- with compiled layers (``compilation.py``), each stage waits ``COMPILES_PER_STAGE`` times for the compiler as long
  as the measurement's first calls did (``compile_s``), and again for every other kind of layer graph it runs
  (``compile_waits``: the layers of a kind share one graph, ``compilation.graph_kinds``).

Plain arithmetic on settings and rates: no torch, nothing of the training imported.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from .planned_stage import PlannedStage
from .sequential_schedule import reads_stored_teacher

FIXED_READS = 3  # weight passes per stage: the student's and the teacher's reads, and the write
# a converted layer's closed-form start (``least_squares.py``): two passes over the calibration set, forward and the
# backward to the module's output, about 1.5 training passes (38 s measured against 48 s for 2 on SmolLM2, 8,192 tokens)
CLOSED_FORM_TRAINS = 1.5
# compiled layers: each stage compiles its layers' graphs for its own shapes (training, evaluation and state batches)
COMPILES_PER_STAGE = 2


class StageClock(Protocol):
    """A device's rates for each part of a stage (module docstring): a ``Pace`` timed here or a
    ``cost.PricedDevice`` priced from afar."""

    def fixed_seconds(self, stage: PlannedStage) -> float:
        """Seconds any stage spends besides its steps: reading and writing weights."""
        ...

    def sequential_seconds(self, stage: PlannedStage) -> float:
        """Seconds of a sequential stage's passes: the teacher's once, each converted layer's ``epochs`` times."""
        ...

    def joint_seconds(self, stage: PlannedStage, stored_teacher: bool) -> float:
        """Seconds of a joint stage's steps, without the teacher's layers where ``stored_teacher``."""
        ...


def process_share(stage: PlannedStage, processes: int) -> float:
    """The part of a joint stage's tokens one of ``processes`` computes: its rows of each micro-batch times the
    micro-batches, over the global batch (``batches.StepSplit``: ``1 / processes`` for a batch that divides, as the plan
    makes every joint stage's)."""
    split = stage.resolved.training.split(processes)
    return split.grad_accum * split.local / split.batch_size


def sequential_processes(stage: PlannedStage, processes: int) -> int:
    """The processes a sequential stage's step is split over: at most its batch's sequences (and the calibration set's)."""
    training = stage.resolved.training
    return min(processes, training.step_rows(max(1, training.sequences)))


def stage_seconds(clock: StageClock, stage: PlannedStage, stored_teacher: bool = False) -> float:
    """The expected wall seconds of one resolved stage on ``clock`` (module docstring); ``stored_teacher``: it reads
    the teacher's states a sequential stage stored (``reads_stored_teacher``), so neither model's frozen layers run."""
    if stage.sequential:
        return clock.fixed_seconds(stage) + clock.sequential_seconds(stage)
    return clock.fixed_seconds(stage) + clock.joint_seconds(stage, stored_teacher)


def stages_seconds(clock: StageClock, stages: Sequence[PlannedStage], data_tokens: int | None = None,
                   before: Sequence[PlannedStage] = ()) -> list[float]:
    """The expected wall seconds of each of ``stages``, run after the finished stages ``before`` (a stage that will
    read the teacher's states a sequential stage stores is timed so: ``reads_stored_teacher``)."""
    done = list(before)
    return [stage_seconds(clock, stage, reads_stored_teacher([*done, *stages], len(done) + index, data_tokens))
            for index, stage in enumerate(stages)]


def recipe_seconds(clock: StageClock, stages: Sequence[PlannedStage], data_tokens: int | None = None,
                   before: Sequence[PlannedStage] = ()) -> float:
    """The expected wall seconds of ``stages``, run after the finished stages ``before``."""
    return sum(stages_seconds(clock, stages, data_tokens, before))


def tokens_for_seconds(clock: StageClock, stages: Sequence[PlannedStage], seconds: float,
                       size: Callable[[Sequence[PlannedStage], int], list[PlannedStage]], data_tokens: int | None = None,
                       before: Sequence[PlannedStage] = ()) -> int:
    """The most token passes whose stages, sized by ``size(stages, tokens)``, are expected to fit in ``seconds``
    (0 when not even the smallest sizing fits)."""
    def fits(tokens: int) -> bool:
        return recipe_seconds(clock, size(stages, tokens), data_tokens, before) <= seconds

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


@dataclass(frozen=True)
class Pace:
    """A device timed here (``pace.measure``): seconds of each piece for one process's step of ``tokens_per_call``
    tokens, timed on each of ``processes`` processes together (each piece the slowest process's), and the model's layer
    counts; a ``StageClock``."""

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
    processes: int = 1  # the launch's processes, every one timed at once; a stage's steps are split over them
    load: float | None = None  # the 1-minute load average per CPU of this process's when the timing began (None: not known)
    timed_at: float | None = None  # when the timing began (seconds since the epoch)

    def record(self) -> dict[str, Any]:
        return asdict(self)

    def fixed_seconds(self, stage: PlannedStage) -> float:
        """``FIXED_READS`` passes over every layer's weights."""
        return FIXED_READS * self.layers * self.layer_read

    def sequential_seconds(self, stage: PlannedStage) -> float:
        """The forwards past the first converted layer and each converted layer's training passes, per token, and
        the compiler's waits: without gradient the teacher's layers and the student's past the first converted one
        (its states, and each converted layer's held-out loss), with it the converted layers."""
        span = self.last_converted - self.first_converted + 1
        epochs = stage.passes
        fits = CLOSED_FORM_TRAINS if stage.resolved.sequential.closed_form else 0.0
        forwards = self.first_converted + 2 * span
        per = forwards * self.layer_forward + self.converted * (epochs + fits) * self.layer_train
        waits = compile_waits(self, {*self.teacher_kinds, *self.student_kinds[self.first_converted:]},
                              set(self.converted_kinds))
        return waits + stage.tokens * per * (1.0 / self.tokens_per_call) / sequential_processes(stage, self.processes)

    def joint_seconds(self, stage: PlannedStage, stored_teacher: bool) -> float:
        """Per token the teacher's layers (none where ``stored_teacher``) and the student's forward, its backward and
        the heads, and the compiler's waits for the kinds of layer the stage runs; of each step, the part the busiest
        process computes (``process_share``)."""
        trains_all = stage.resolved.scope.train == "all"
        student_layers = self.layers if trains_all else self.layers - self.first_converted
        backward = student_layers * (self.layer_train - self.layer_forward)
        teacher_layers = 0 if stored_teacher else self.layers
        per = (teacher_layers + student_layers) * self.layer_forward + backward + self.head_step
        waits = compile_waits(self, set() if stored_teacher else set(self.teacher_kinds),
                              set(self.student_kinds[0 if trains_all else self.first_converted:]))
        share = process_share(stage, self.processes)
        return waits + stage.tokens * share * per * (1.0 / self.tokens_per_call)


def fit_steps(planned: dict[int, int], left_s: float, spent_s: float, steps_done: int) -> dict[int, int]:
    """``planned`` steps (by window, or by stage), shortened in proportion (at least one each) to fit ``left_s`` seconds
    at the pace ``steps_done`` steps took ``spent_s`` (as planned where no step has run yet, or they fit): how a stage
    that runs behind its plan keeps its time (``deadline.Deadline.fitted``)."""
    if steps_done <= 0:
        return dict(planned)
    affordable = max(0.0, left_s) * steps_done / max(spent_s, 1e-9)
    wanted = sum(planned.values())
    if affordable >= wanted:
        return dict(planned)
    share = affordable / wanted
    return {start: max(1, int(count * share)) for start, count in planned.items()}


def compile_waits(pace: Pace, forward_kinds: set[int], trained_kinds: set[int]) -> float:
    """The seconds a stage of compiled layers waits for the compiler (module docstring): the first converted layer's
    kind compiled ``COMPILES_PER_STAGE`` times, then each other kind of graph it runs without gradient
    (``forward_kinds``) and with it (``trained_kinds``) traced once (0 with eager layers)."""
    if not pace.compiled:
        return 0.0
    first = set(pace.student_kinds[pace.first_converted : pace.first_converted + 1])
    return (COMPILES_PER_STAGE * pace.compile_s + len(forward_kinds - first) * pace.retrace_forward_s
            + len(trained_kinds - first) * pace.retrace_train_s)
