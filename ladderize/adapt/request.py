"""What ``ladderize adapt CKPT OUT`` asks for, typed: ``AdaptRequest``, the one object the command line (or a Python
caller) hands to the run's entrance (``entrance.adapt_checkpoint``, ``entrance.dry_run``), and ``RunReports``, what the
run tells its caller as it goes.

A request names the checkpoint and OUT, what trains (a recipe, ``--stage``s, or a single stage's own settings), what
sizes it (``budget``), the settings every stage shares, and how the run is kept (run folder, ``force``, ``resume``).
Its settings are typed as given (``config.GivenSettings``): what is not given, the recipe's presets and the sections'
defaults decide. ``AdaptRequest.of`` takes them by name, as the command line has them.

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
    shared: GivenSettings = field(default_factory=GivenSettings)  # the settings every stage shares, as given
    single: GivenSettings = field(default_factory=GivenSettings)  # a single stage's own (none given: a recipe runs)
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

    @classmethod
    def of(cls, checkpoint: str, out: str, **options: Any) -> AdaptRequest:
        """The request of the command line's names: the request's own fields by name, each stage setting (its
        section's field name; ``None``: not given) into ``single`` or ``shared`` as the recipe parser sorts them
        (``stages.given_settings``)."""
        from .plan.stages import given_settings

        own = {f.name for f in fields(cls)} - {"shared", "single"}
        shared, single = given_settings({k: v for k, v in options.items() if k not in own})
        return cls(checkpoint, out, shared=shared, single=single, **{k: v for k, v in options.items() if k in own})

    @property
    def data(self) -> str | None:
        """``--data`` as given (None: each stage's own text)."""
        return self.shared.value("data")

    @property
    def teacher(self) -> str | None:
        """``--teacher`` as given (None: the source the checkpoint's provenance names)."""
        return self.shared.value("teacher")

    @property
    def device(self) -> str:
        """The device every stage trains on (``auto`` unless given)."""
        return self.shared.config.parallelism.device

    def with_settings(self, **settings: Any) -> AdaptRequest:
        """This request with its own fields ``settings`` replaced."""
        return replace(self, **settings)


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
