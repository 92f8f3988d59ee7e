"""What an adaptation run is: its settings (``AdaptConfig``), its progress reports and its result.

``AdaptConfig`` is the single description of a run: the typed sections of ``settings_sections.py``, read through
them (``config.optimizer.lr``) and changed one section at a time (``with_fields``). ``GivenSettings`` is what one
source gives (a stage preset, a recipe file, ``--stage``, the command line, an Accelerate config): a config and the
names given, laid over one another (``over``). A setting's flat name (its field's) is read here once, from the edge's
parsers (``GivenSettings.of``, ``AdaptConfig.from_flat``), and given back for the records: ``flat`` for the
provenance and the resume ``fingerprint``, which a resumed run must share with the run it continues.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import Field, asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from ...errors import LadderizeError
from ..objectives.registry import JOINT_ONLY_INPUTS, TEACHER_OBJECTIVES
from .settings_sections import (SECTIONS, ObjectiveSettings, OptimizerSettings, ParallelismSettings, SavingSettings,
                                ScopeSettings, SequentialSettings, TrainingSettings)

FLAT_FIELDS: dict[str, Field[Any]] = {f.name: f for kind in SECTIONS for f in fields(kind)}  # a setting's flat name: its field


@dataclass(frozen=True)
class AdaptConfig:
    """Everything that defines an adaptation run, one typed section per concern (the resume fingerprint is built
    from it)."""

    objective: ObjectiveSettings = field(default_factory=ObjectiveSettings)
    scope: ScopeSettings = field(default_factory=ScopeSettings)
    sequential: SequentialSettings = field(default_factory=SequentialSettings)
    training: TrainingSettings = field(default_factory=TrainingSettings)
    saving: SavingSettings = field(default_factory=SavingSettings)
    parallelism: ParallelismSettings = field(default_factory=ParallelismSettings)
    optimizer: OptimizerSettings = field(default_factory=OptimizerSettings)

    @classmethod
    def from_flat(cls, settings: Mapping[str, Any] | None = None, /, **names: Any) -> AdaptConfig:
        """The config of flat setting names (``settings``, then ``names`` over them), each into its section; the
        others take their defaults. An unknown name is refused in one line naming it."""
        given = {**(settings or {}), **names}
        for name in given:
            if name not in FLAT_FIELDS:
                raise LadderizeError(f"unknown setting {name!r}; settings are {', '.join(sorted(FLAT_FIELDS))}")
        return cls(**{f.name: _section_of(f)(**{k: given[k] for k in _names_of(f) if k in given}) for f in fields(cls)})

    def flat(self) -> dict[str, Any]:
        """Every setting by its flat name (the provenance, ``recipe.json``, the resume fingerprint)."""
        return {name: value for section in self.sections() for name, value in asdict(section).items()}

    def with_fields(self, section: type, **values: Any) -> AdaptConfig:
        """This config with ``values`` set in its section of type ``section`` (``dataclasses.replace``: a field the
        section has not is a ``TypeError``)."""
        name = self._field_of(section)
        return replace(self, **{name: replace(getattr(self, name), **values)})

    def section(self, section: type) -> Any:
        """This config's section of type ``section``."""
        return getattr(self, self._field_of(section))

    def _field_of(self, section: type) -> str:
        name = next((f.name for f in fields(self) if _section_of(f) is section), None)
        if name is None:
            raise TypeError(f"{section.__name__} is not a section of AdaptConfig")
        return name

    def changed_from(self, other: AdaptConfig) -> tuple[str, ...]:
        """The settings (field names) whose values differ from ``other``'s."""
        mine, theirs = self.flat(), other.flat()
        return tuple(name for name, value in mine.items() if theirs[name] != value)

    def resolved_run_dir(self) -> Path:
        """The run folder (``inputs.run_folder``): ``run_dir``, or ``OUT.adapt-run``."""
        from .inputs import run_folder

        return run_folder(self.saving.out, self.saving.run_dir)

    def fingerprint(self) -> dict[str, Any]:
        """The settings (flat names) a resumed run must share with the interrupted one.

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
        return {k: v for k, v in self.flat().items() if k not in FINGERPRINT_SKIPS}

    def sections(self) -> tuple[Any, ...]:
        """Every section, in the order ``check_settings`` checks them."""
        return tuple(getattr(self, f.name) for f in fields(self))


FINGERPRINT_SKIPS = frozenset({"out", "run_dir", "force", "save_every", "save_minutes", "shard", "activation_checkpointing",
                               "keep_state", "recipe", "stream_layers", "states", "device", "compile", "teacher_states",
                               "teacher_state_rows", "output_dtype"})  # what ``fingerprint`` leaves out


def _section_of(container_field: Field[Any]) -> Any:
    """The section class an ``AdaptConfig`` field holds."""
    return container_field.default_factory


def _names_of(container_field: Field[Any]) -> tuple[str, ...]:
    return tuple(f.name for f in fields(_section_of(container_field)))


@dataclass(frozen=True)
class GivenSettings:
    """Settings one source gives (a stage preset, a recipe's shared settings, a stage's own, the command line),
    typed: ``config`` holds them over the sections' defaults, ``names`` says which fields were given, in order."""

    config: AdaptConfig = field(default_factory=AdaptConfig)
    names: tuple[str, ...] = ()

    @classmethod
    def of(cls, settings: Mapping[str, Any]) -> GivenSettings:
        """The settings ``settings`` gives by flat name (the edge's parsers; an unknown name is refused in one line)."""
        return cls(AdaptConfig.from_flat(settings), tuple(settings))

    def over(self, below: GivenSettings) -> GivenSettings:
        """These settings over ``below``'s: each field given here takes its value here, the others ``below``'s."""
        record = {**below.record(), **self.record()}
        return GivenSettings(AdaptConfig.from_flat(record), tuple(record))

    def with_given(self, section: type, **values: Any) -> GivenSettings:
        """These settings with ``values`` given in the section of type ``section`` (a value ``None``: not given)."""
        given = {name: value for name, value in values.items() if value is not None}
        if not given:
            return self
        return GivenSettings(self.config.with_fields(section, **given), self.names).including(*given)

    def including(self, *names: str) -> GivenSettings:
        """These settings, ``names`` counted as given with the values they have (a default spelt out)."""
        return replace(self, names=self.names + tuple(n for n in names if n not in self.names))

    def without(self, *names: str) -> GivenSettings:
        """These settings without ``names`` (their sections' defaults again)."""
        return GivenSettings.of({k: v for k, v in self.record().items() if k not in names})

    def disagreements(self, other: GivenSettings) -> list[tuple[str, Any, Any]]:
        """The settings both give with different values: (name, this value, ``other``'s)."""
        mine, theirs = self.record(), other.record()
        return [(name, value, theirs[name]) for name, value in mine.items() if name in theirs and theirs[name] != value]

    def value(self, name: str) -> Any:
        """The value given for the setting ``name`` (None: not given)."""
        return self.record().get(name)

    def sets(self, name: str) -> bool:
        """Whether the field ``name`` is given."""
        return name in self.names

    def record(self) -> dict[str, Any]:
        """The given settings by flat name (``recipe.json``'s record of a stage)."""
        flat = self.config.flat()
        return {name: flat[name] for name in self.names}


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
    wall_s: float | None = None  # the whole command's wall seconds, measured (``entrance.adapt_checkpoint``)


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

    The joint training autocasts and scales fp16's loss itself (``train/optimizer_step.py``), on CUDA only
    (``check_fp16_device``).
    """
    if parallelism.mixed_precision == "fp16":
        raise LadderizeError("the sequential training (seq-local) has no fp16 loss scaling; use --mixed-precision bf16 "
                             "or no there (a recipe can set it per stage: --stage seq-local:mixed_precision=bf16)")
    from ...checkpoint.placement import check_dtype

    if check_dtype(parallelism.dtype) == "float16":  # before anything is written
        raise LadderizeError("the sequential stage trains in float32 or bfloat16 (float16 needs loss scaling); use --dtype bfloat16")


def check_fp16_device(config: AdaptConfig, known_without_torch: bool = False) -> None:
    """fp16 (``--mixed-precision fp16`` or ``--dtype float16``) only where the run trains on a CUDA GPU
    (``known_without_torch``: refused only where the device is ``cpu`` or no NVIDIA driver is here, torch not asked)."""
    from ...checkpoint.placement import check_dtype, resolve_device
    from ...runtime.host import no_cuda_here

    parallelism = config.parallelism
    if parallelism.mixed_precision == "fp16":
        asked, instead = "--mixed-precision fp16", "bf16 or no"
    elif check_dtype(parallelism.dtype) == "float16":
        asked, instead = "--dtype float16", "--dtype bfloat16 or float32"
    else:
        return
    if known_without_torch:
        on_cpu = parallelism.device == "cpu" or (not parallelism.device.startswith("cuda") and no_cuda_here())
    else:
        on_cpu = resolve_device(parallelism.device).type != "cuda"
    if on_cpu:
        raise LadderizeError(f"{asked} needs a CUDA GPU; on a CPU use {instead}")


def needs_teacher(config: AdaptConfig, weights: dict[str, float]) -> bool:
    """Whether a run loads a teacher: an objective compares with it, head grouping reads it, or the sequential
    training runs it for every layer's inputs and targets."""
    return config.sequential.runs or bool(TEACHER_OBJECTIVES & set(weights)) or config.scope.head_grouping


def local_inputs_of(config: AdaptConfig) -> str:
    """The local objective's inputs: as given, else the training order's default."""
    if config.objective.local_inputs is not None:
        return config.objective.local_inputs
    return "student" if config.sequential.runs else "teacher"
