"""How a joint stage runs on its launch: which entry of ``STRATEGIES`` (``strategies.py``: FSDP2, DDP, or one a user
registers), over how many processes, and why.

``choose_strategy(settings, launch)`` is the one place the choice is made. The plan (``adapt_plan._fill_device``), the
pricing (``cost.plan_run``, ``cost.JointMemory``), ``adapt --dry-run``, the refusal's advice and the run
(``trainer.Trainer``: the entry's run class) all read it, so what a plan prices is what runs.

- ``--shard NAME``: that entry (``ddp``: replicated, one process on a launch of one; ``fsdp``: sharded, one process
  too); a strategy that shards, asked for with a setting it does not take, is refused;
- ``--shard auto`` (the default): on a launch of one, the first entry in ``auto``'s order that does not shard (DDP's
  run on one process); on more, the first that takes the stage's settings (FSDP2, unless a setting of ``SETTINGS`` is
  on: then DDP, and the strategy's reason names the setting).

Which setting needs the whole weights on every process is data (``SETTINGS``): a strategy that shards trains the
converted layers from shards, so only one that does not shard takes them. This module reads settings only: it imports
no training module, so the planning side stays free of them (``tests/test_import_graph.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...errors import LadderizeError
from .config import AdaptConfig
from .settings_sections import ParallelismSettings, ScopeSettings
from .strategies import STRATEGIES, StrategyEntry, shard_choices

ONE_PROCESS = "one process"  # a strategy that holds the whole weights, on a launch of one
REPLICATED = "replicated"  # every process holds the whole student, its gradients and AdamW
SHARDED = "sharded"  # every process holds 1/processes of them


@dataclass(frozen=True)
class Setting:
    """A stage setting that needs the whole weights on every process: its flag as the user writes it, its section and
    field in ``AdaptConfig``, when it is on, and the value that turns it off. Only a strategy that does not shard
    takes it."""

    flag: str
    section: type
    field: str
    on: Callable[[Any], bool]
    off: Any

    def value(self, settings: AdaptConfig) -> Any:
        """The setting's value in ``settings``."""
        return getattr(settings.section(self.section), self.field)


# in the order a refusal names them
SETTINGS: tuple[Setting, ...] = (
    Setting("--train lora", ScopeSettings, "train", lambda value: value == "lora", "converted"),
    Setting("ema", ScopeSettings, "ema", lambda value: bool(value), 0.0),
    Setting("--head-grouping", ScopeSettings, "head_grouping", lambda value: bool(value), False),
    Setting("interpolate", ScopeSettings, "interpolate", lambda value: float(value) != 1, 1.0),
    Setting("--train all", ScopeSettings, "train", lambda value: value == "all", "converted"),
)


@dataclass(frozen=True)
class Strategy:
    """How a joint stage runs: the ``entry`` of ``STRATEGIES`` over ``processes``, and why (``reason``: the setting
    or launch that chose it)."""

    entry: StrategyEntry
    processes: int
    reason: str

    @property
    def shards(self) -> bool:
        """Each process holds 1/processes of the trained weights, their gradients and AdamW."""
        return self.entry.shards

    @property
    def kind(self) -> str:
        """What each process holds (``ONE_PROCESS``, ``REPLICATED`` or ``SHARDED``), from the entry's traits and the process
        count."""
        if self.entry.shards:
            return SHARDED
        return REPLICATED if self.processes > 1 else ONE_PROCESS

    def describe(self) -> str:
        """``sharded over 8 processes with FSDP2``, ``replicated over 8 processes with DDP: --train lora needs ...``,
        ``on one process``."""
        label, kind = self.entry.label, self.kind
        if kind == SHARDED:
            return f"sharded over {self.processes} process{'es' if self.processes != 1 else ''} with {label}"
        if kind == REPLICATED:
            return f"replicated over {self.processes} processes with {label}: {self.reason}"
        return "on one process" if self.reason == ONE_PROCESS else f"on one process: {self.reason}"


def whole_weight_settings(settings: AdaptConfig) -> list[Setting]:
    """The settings on in a stage's ``settings`` that only a strategy holding the whole weights takes."""
    return [entry for entry in SETTINGS if entry.on(entry.value(settings))]


def _named(shard: str) -> StrategyEntry:
    if shard not in STRATEGIES:
        raise LadderizeError(f"unknown --shard {shard!r}; choose from {', '.join(shard_choices())}")
    return STRATEGIES[shard]


def choose_strategy(settings: AdaptConfig, launch: Any) -> Strategy:
    """The strategy a joint stage with ``settings`` runs with on ``launch``
    (a ``cost.Launch``, or a process count): the entry ``--shard NAME`` names, or for ``--shard auto`` the first entry
    in ``auto``'s order that takes the stage's settings, on one process the first that does not shard. A strategy
    that shards, asked for by name, with a setting it does not take is refused."""
    processes = launch if isinstance(launch, int) else launch.processes
    shard = settings.parallelism.shard
    blockers = whole_weight_settings(settings)
    if shard != "auto":
        entry = _named(shard)
        if entry.shards and blockers:
            whole = next(name for name in shard_choices()[1:] if not STRATEGIES[name].shards)
            raise LadderizeError(f"--shard {shard} trains the converted layers: {blockers[0].flag} needs the "
                                 f"replicated path (--shard {whole})")
        return Strategy(entry, processes, f"--shard {shard}")
    candidates = [STRATEGIES[name] for name in shard_choices()[1:] if STRATEGIES[name].auto is not None]
    if processes <= 1:
        return Strategy(next(entry for entry in candidates if not entry.shards), processes, ONE_PROCESS)
    entry = next(entry for entry in candidates if not (entry.shards and blockers))
    reason = f"--shard {entry.name}" if not blockers else f"{blockers[0].flag} needs the whole weights on every process"
    return Strategy(entry, processes, reason)


def whole_weight_changes(settings: AdaptConfig) -> AdaptConfig:
    """``settings`` with the settings that keep a stage replicated turned off (a named strategy that does not shard
    becomes auto)."""
    for entry in whole_weight_settings(settings):
        settings = settings.with_fields(entry.section, **{entry.field: entry.off})
    shard = settings.parallelism.shard
    if shard != "auto" and not _named(shard).shards:
        settings = settings.with_fields(ParallelismSettings, shard="auto")
    return settings
