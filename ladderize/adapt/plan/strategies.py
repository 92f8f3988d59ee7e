"""The strategies a joint stage can run with, as entries (``STRATEGIES``): each names its run and declares the traits
the plan, the pricing and the run read (``strategy_choice.choose_strategy`` picks one). A new strategy is one entry, added with
``register``, and its run class (``trainer.JointRun``); nothing reads a strategy's name but ``--shard``. Imports
nothing: the planning side and the settings' check read the table before any training module loads."""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import LadderizeError


@dataclass(frozen=True)
class StrategyEntry:
    """One way a joint stage runs on its launch, an entry of ``STRATEGIES``, asked for by ``--shard NAME``: the run
    the loop drives (``run``: ``module:Class``, a ``trainer.JointRun``, imported by the loop only), whether each process
    holds 1/processes of the trained weights, their gradients and AdamW and gathers the teacher's layers (``shards``:
    the memory priced, the teacher states a stage reads), what it runs on (``label``, the plan's words), and its place
    in ``--shard auto``'s order (``auto``; None: only when asked for). A strategy that does not shard holds the whole
    weights on every process, so it takes every setting of ``SETTINGS``; one that shards takes none of them."""

    name: str
    run: str
    shards: bool
    label: str
    auto: int | None = None


STRATEGIES: dict[str, StrategyEntry] = {}


def register(entry: StrategyEntry) -> StrategyEntry:
    """Add ``entry`` to ``STRATEGIES`` (``--shard NAME``, the plan, the pricing and the run read it from there)."""
    if entry.name == "auto" or not entry.name.isidentifier():
        raise LadderizeError(f"a strategy's name is a word other than auto, not {entry.name!r}")
    STRATEGIES[entry.name] = entry
    return entry


register(StrategyEntry("fsdp", "ladderize.adapt.train.sharded:ShardedRun", shards=True, label="FSDP2", auto=0))
register(StrategyEntry("ddp", "ladderize.adapt.train.replicated:ReplicatedRun", shards=False, label="DDP", auto=1))


def shard_choices() -> tuple[str, ...]:
    """``--shard``'s values: auto, then the strategies in ``auto``'s order, then those only asked for by name."""
    ordered = sorted(STRATEGIES.values(), key=lambda entry: (entry.auto is None, entry.auto or 0))
    return ("auto", *(entry.name for entry in ordered))
