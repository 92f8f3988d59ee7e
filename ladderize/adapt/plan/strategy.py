"""How a joint stage runs on its launch: one process, replicated over the processes (DDP) or sharded (FSDP2).

``choose_strategy(settings, launch)`` is the one place the choice is made. The plan (``plan._fill_device``), the
pricing (``cost.plan_run``, ``cost.JointMemory``), ``adapt --dry-run``, the refusal's advice and the run
(``train.adapt``: ``sharded.py`` or ``joint.py``) all read it, so what a plan prices is what runs.

- ``--shard ddp``: replicated (one process on a launch of one);
- ``--shard auto`` (the default): one process on a launch of one; sharded on more, unless a setting the sharded
  training does not take is on (``SETTINGS``): then replicated, and the strategy's reason names the setting;
- ``--shard fsdp``: sharded, one process too; a setting the sharded training does not take is refused.

Which strategy takes which setting is data (``SETTINGS``): the sharded training trains the converted layers from
shards, so whatever needs the whole weights on every rank keeps the replicated one. This module reads settings only:
it imports no training module, so the planning side stays free of them (``tests/test_import_graph.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ...errors import LadderizeError

ONE_PROCESS = "one process"  # joint.py, no process group
REPLICATED = "replicated"  # joint.py under DDP: every process holds the whole student, its gradients and AdamW
SHARDED = "sharded"  # sharded.py: FSDP2, every process holds 1/processes of them
KINDS = (ONE_PROCESS, REPLICATED, SHARDED)


@dataclass(frozen=True)
class Setting:
    """A stage setting some strategies do not take: its flag as the user writes it, the ``AdaptConfig`` field, when it
    is on, the value that turns it off, and the strategies that run it."""

    flag: str
    key: str
    on: Callable[[Any], bool]
    off: Any
    runs_on: frozenset[str]


_WHOLE = frozenset({ONE_PROCESS, REPLICATED})  # the whole weights on every rank

# in the order a refusal names them
SETTINGS: tuple[Setting, ...] = (
    Setting("--train lora", "train", lambda value: value == "lora", "converted", _WHOLE),
    Setting("ema", "ema", lambda value: bool(value), 0.0, _WHOLE),
    Setting("--head-grouping", "head_grouping", lambda value: bool(value), False, _WHOLE),
    Setting("interpolate", "interpolate", lambda value: float(value) != 1, 1.0, _WHOLE),
    Setting("--train all", "train", lambda value: value == "all", "converted", _WHOLE),
)


@dataclass(frozen=True)
class Strategy:
    """How a joint stage runs: ``kind`` (``KINDS``) over ``processes``, and why (``reason``: the setting or launch
    that chose it)."""

    kind: str
    processes: int
    reason: str

    @property
    def sharded(self) -> bool:
        return self.kind == SHARDED

    def describe(self) -> str:
        """``sharded over 8 processes with FSDP2``, ``replicated over 8 processes with DDP: --train lora needs ...``,
        ``on one process``."""
        if self.kind == SHARDED:
            return f"sharded over {self.processes} process{'es' if self.processes != 1 else ''} with FSDP2"
        if self.kind == REPLICATED:
            return f"replicated over {self.processes} processes with DDP: {self.reason}"
        return "on one process" if self.reason == ONE_PROCESS else f"on one process: {self.reason}"


def setting(settings: Any, key: str) -> Any:
    """The setting named ``key`` (its flat name) of a stage's ``settings``: an ``AdaptConfig``, or a plan's stage dict
    typed by ``config.stage_config``."""
    from .config import stage_config

    return stage_config(settings).flat()[key]


def whole_weight_settings(settings: Any) -> list[Setting]:
    """The settings on in ``settings`` that the sharded training does not take."""
    from .config import stage_config

    flat = stage_config(settings).flat()
    return [entry for entry in SETTINGS if SHARDED not in entry.runs_on and entry.on(flat[entry.key])]


def choose_strategy(settings: Any, launch: Any) -> Strategy:
    """The strategy a joint stage with ``settings`` (``AdaptConfig`` or a plan's stage dict) runs with on ``launch``
    (a ``cost.Launch``, or a process count). ``--shard fsdp`` with a setting it does not take is refused."""
    from .config import stage_config

    processes = launch if isinstance(launch, int) else launch.processes
    typed = stage_config(settings)
    shard = typed.parallelism.shard
    if shard == "ddp":
        return Strategy(REPLICATED if processes > 1 else ONE_PROCESS, processes, "--shard ddp")
    if shard == "auto" and processes <= 1:
        return Strategy(ONE_PROCESS, processes, ONE_PROCESS)
    blockers = whole_weight_settings(typed)
    if not blockers:
        return Strategy(SHARDED, processes, f"--shard {shard}")
    if shard == "fsdp":
        raise LadderizeError(f"--shard fsdp trains the converted layers: {blockers[0].flag} needs the replicated "
                             "path (--shard ddp)")
    return Strategy(REPLICATED, processes, f"{blockers[0].flag} needs the whole weights on every process")


def without_whole_weight_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """``settings`` with the settings that keep a stage replicated turned off (``--shard ddp`` becomes auto)."""
    changed = dict(settings)
    for entry in whole_weight_settings(settings):
        changed[entry.key] = entry.off
    if setting(settings, "shard") == "ddp":
        changed["shard"] = "auto"
    return changed
