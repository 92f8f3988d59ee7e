"""What ``ladderize adapt CKPT OUT`` asks for, typed: ``AdaptRequest``, the one object the command line (or a Python
caller) hands to the run's entrance (``entrance.adapt_checkpoint``, ``entrance.dry_run``), and ``RunReports``, what the
run tells its caller as it goes.

A request names the checkpoint and OUT, what trains (a recipe, ``--stage``s, or a single stage's own settings), what
sizes it (``budget``), the settings every stage shares, and how the run is kept (run folder, ``force``, ``resume``).
A setting left ``None`` is not given: the recipe's presets and the sections' defaults decide it. The plan
(``plan.build_plan``) turns the request into typed stages once; flat setting names exist here only as the field
names, which are the sections' own (``settings_sections.py``).

This module imports no torch: the command line builds a request before any heavy import.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

from .plan.config import GivenSettings

if TYPE_CHECKING:
    from .plan.budget import Budget
    from .plan.stages import Recipe

SINGLE = "single"  # a single stage's own setting: with a recipe or --stage it is refused (plan._check_choice)
SHARED = "shared"  # a setting every stage shares


def _given(group: str) -> Any:
    return field(default=None, metadata={"group": group})


@dataclass(frozen=True)
class AdaptRequest:
    """One adapt run as asked for (module docstring); ``began`` is when the command began (``time.perf_counter()``):
    a wall budget's clock and the result's wall time start there (default: when the run starts)."""

    checkpoint: str
    out: str
    # what trains and how much
    recipe: str | Recipe | None = None  # a built-in recipe's name, a recipe file or a parsed one (stages.py)
    stages: tuple[str, ...] = ()  # --stage NAME:key=value,... in order
    budget: Budget | None = None  # wall time (30m) or tokens (3B) for a recipe's stages; given as text, parsed here
    # a single stage's own settings (none given: a recipe runs)
    objectives: str | None = _given(SINGLE)
    train: str | None = _given(SINGLE)
    tokens: int | None = _given(SINGLE)
    lr: float | None = _given(SINGLE)
    local_inputs: str | None = _given(SINGLE)
    local_schedule: str | None = _given(SINGLE)
    epochs: float | None = _given(SINGLE)
    # settings every stage shares
    data: str | None = _given(SHARED)
    teacher: str | None = _given(SHARED)
    seq_len: int | None = _given(SHARED)
    batch_size: int | None = _given(SHARED)
    grad_accum: int | None = _given(SHARED)
    lora_rank: int | None = _given(SHARED)
    lora_alpha: float | None = _given(SHARED)
    save_every: int | None = _given(SHARED)
    save_minutes: float | None = _given(SHARED)
    shard: str | None = _given(SHARED)
    activation_checkpointing: bool | None = _given(SHARED)
    mixed_precision: str | None = _given(SHARED)
    max_grad_norm: float | None = _given(SHARED)  # an Accelerate config's gradient_clipping (accelerate_config.py)
    seed: int | None = _given(SHARED)
    head_grouping: bool | None = _given(SHARED)
    states: str | None = _given(SHARED)
    compile: bool | None = _given(SHARED)
    output_dtype: str | None = _given(SHARED)
    dtype: str | None = _given(SHARED)
    device: str = "auto"
    # how the run is kept
    run_dir: str | None = None
    force: bool = False
    keep_state: bool = False
    resume: bool = False
    max_steps: int | None = None
    began: float | None = None

    def __post_init__(self) -> None:
        """``budget`` given as text (``--budget 30m``) is parsed here, once, into a ``Budget`` (one line if it is not
        one): every part of the run reads it typed."""
        if isinstance(self.budget, str):
            from .plan.budget import parse_budget

            object.__setattr__(self, "budget", parse_budget(self.budget))

    def shared(self) -> GivenSettings:
        """The settings every stage shares that the request gives, with its device."""
        return GivenSettings.of({**self._group(SHARED), "device": self.device})

    def single(self) -> GivenSettings:
        """A single stage's own settings the request gives (none: a recipe runs)."""
        return GivenSettings.of(self._group(SINGLE))

    def with_settings(self, **settings: Any) -> AdaptRequest:
        """This request with ``settings`` (field names) given."""
        return replace(self, **settings)

    def _group(self, group: str) -> dict[str, Any]:
        return {f.name: value for f in fields(self)
                if f.metadata.get("group") == group and (value := getattr(self, f.name)) is not None}



@dataclass(frozen=True)
class RunReports:
    """What a run tells its caller: ``on_message(line)`` its lines, ``on_plan(plan)`` the plan once every stage passed
    its preflight, ``on_stage_start(line)`` each stage (default ``on_message``), ``progress(info, model)`` after each
    optimizer step, ``on_phase(what, done, total)`` a stage's long phases before its steps (``stage_run.adapt``)."""

    on_message: Callable[[str], None] | None = None
    on_plan: Callable[[Any], None] | None = None
    on_stage_start: Callable[[str], None] | None = None
    progress: Callable[..., None] | None = None
    on_phase: Callable[[str, int, int], None] | None = None

    def say(self, line: str) -> None:
        """``on_message``, where there is one."""
        if self.on_message is not None:
            self.on_message(line)
