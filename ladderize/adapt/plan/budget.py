"""``adapt --budget``: a recipe's stages sized to a budget of tokens or of wall time.

A budget is either tokens (``20M``, ``500K``, ``163840``) or wall time on the device in use (``90s``,
``30m``, ``1.5h``). A recipe's cost is counted in *token passes*: a sequential stage costs its
calibration tokens times its epochs (each converted layer trains that many tokens), any other stage
its tokens. The built-in recipe ``best`` costs 65,536 x 2 + 32,768 = 163,840 token passes, and that is
the default budget: without ``--budget`` nothing changes.

A token budget scales every stage by the same factor, rounded to whole optimizer steps (at least one
per stage), with the stages' warm-up scaled alike, and the horizon of a stage's weight average
(``ema``: ``1 / (1 - decay)`` steps) too. A sequential stage's calibration set stops growing
where the data ends (its whole sequences; further epochs over the same set overfit it) or where its
cached states would take more than ``STATE_MEMORY_SHARE`` of the memory there is
(``sequential_schedule.state_copies`` state tensors, more with ``window``); the tokens past that go to the next stage that is not
sequential (kd in ``best``), which passes over the data as many times as they need. A wall budget is turned into tokens by the pace measured on this
device (``pace.py``) before the run: the plan says what it timed and what it expects each stage to take, as a token
budget's plan does from the same pace. The pace is kept per machine load (``pace.store_pace``: the fastest timed here at
about the load of now), and a wall budget shorter than the recipe's smallest run by it is refused before anything is
timed or read, unless it was timed at a higher load than now: then a timing now decides. After each stage but the
last, the stages left are re-planned to the time left (``replan``): a pace timed on a quieter or busier machine than
the run then met still ends near the budget. Under a launcher the pace is timed on every process at once and agreed
(``pace.measure_launch``, run by the entrance where the plan asks for it, ``PaceNeeded``, and handed back as data),
its steps split over the processes (``stage_clock.py``), and every process runs the main process's plan
(``process_group.agreed``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import LadderizeError
from ...progress import counted
from .planned_stage import PlannedStage
from .settings_sections import OptimizerSettings, ParallelismSettings, ScopeSettings, TrainingSettings
from .stage_clock import Pace, recipe_seconds, stages_seconds, tokens_for_seconds

_TIME_UNITS = {"s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}
_TOKEN_UNITS = {"": 1, "k": 1_000, "K": 1_000, "M": 1_000_000, "G": 1_000_000_000, "B": 1_000_000_000}
STATE_MEMORY_SHARE = 0.25  # of the memory there is, the most a sequential stage's cached states may take
MAX_WARMUP_STEPS = 100


@dataclass(frozen=True)
class Budget:
    """Token passes (``tokens``) or wall seconds (``seconds``); ``text`` as the user wrote it."""

    text: str
    tokens: int | None = None
    seconds: float | None = None

    def describe(self) -> str:
        return duration(self.seconds) if self.seconds is not None else counted(self.tokens, "token")

    @property
    def bare(self) -> bool:
        """Whether ``text`` is a number without a unit (read as token passes)."""
        return re.fullmatch(r"\s*\d+(?:\.\d+)?\s*", self.text) is not None


@dataclass(frozen=True)
class Sizing:
    """How ``--budget`` sized a plan's stages, and the times it implies: the plan keeps it (``AdaptPlan.budget``),
    ``RUN/recipe.json`` records it (``record``, read back by ``from_record``, so that a resume keeps the sizes).

    ``text``: the budget as written; ``tokens``: the token passes sized; ``calibration_cap``: the most tokens a
    sequential stage's calibration set holds (its states' memory). A run's sizing (``size_recipe``) adds the pace it
    sized by, the planned seconds of each stage (``planned_s``) and what timing the pace cost (``timed_s``); a wall
    budget its seconds, the seconds spent starting (``spent_s``) and each re-plan after a finished stage
    (``replanned``: JSON records, ``replan``). A dry run's sizing has the first three only."""

    text: str
    tokens: int | None = None
    calibration_cap: int | None = None
    seconds: float | None = None
    data_tokens: int | None = None  # the whole data in tokens, where a sequential stage reads all of it
    pace: Pace | None = None
    timed_s: float | None = None
    planned_s: tuple[float, ...] | None = None
    spent_s: float | None = None
    replanned: tuple[dict[str, Any], ...] = ()

    @property
    def sized_by_run(self) -> bool:
        """Whether a run sized it (by a pace), not a dry run."""
        return self.planned_s is not None

    def record(self) -> dict[str, Any]:
        """The JSON record (``RUN/recipe.json``'s ``budget``)."""
        record: dict[str, Any] = {"text": self.text, "tokens": self.tokens, "calibration_cap": self.calibration_cap}
        if self.sized_by_run:
            record.update(seconds=self.seconds, data_tokens=self.data_tokens, timed_s=self.timed_s,
                          planned_s=list(self.planned_s), pace=self.pace.record() if self.pace is not None else None)
            if self.spent_s is not None:
                record["spent_s"] = self.spent_s
            if self.replanned:
                record["replanned"] = [dict(entry) for entry in self.replanned]
        return record

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Sizing:
        """The sizing ``record`` holds."""
        planned = record.get("planned_s")
        return cls(record["text"], record.get("tokens"), record.get("calibration_cap"), record.get("seconds"),
                   record.get("data_tokens"), Pace(**record["pace"]) if record.get("pace") else None,
                   record.get("timed_s"), None if planned is None else tuple(planned), record.get("spent_s"),
                   tuple(record.get("replanned", ())))

    @property
    def wall(self) -> bool:
        """Whether the budget is wall time: its stages have deadlines."""
        return self.seconds is not None

    def replanned_after(self, number: int) -> bool:
        """Whether the stages were re-planned after stage ``number`` finished."""
        return any(entry["after_stage"] == number for entry in self.replanned)

    def deadline(self, index: int, stages: Sequence[PlannedStage], began: float, reused_s: float) -> float | None:
        """When stage ``index`` of ``stages`` should end (``time.perf_counter()``'s clock; None: not a wall budget):
        its planned time from now, the latest re-plan's where one was made before it; the last stage the budget's end
        (``began``: when the command began; ``reused_s``: the seconds an earlier attempt trained, spent already)."""
        import time

        if not self.wall:
            return None
        if index + 1 >= len(stages):
            return began + self.seconds - reused_s
        expected = next((entry["expected_s"] for entry in reversed(self.replanned)
                         if entry["after_stage"] < stages[index].number), None)
        planned = expected[index - len(stages) + len(expected)] if expected else self.planned_s[index]
        return time.perf_counter() + planned


def duration(seconds: float) -> str:
    """``45 s`` under two minutes, else ``12.5 min``."""
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def parse_budget(text: str) -> Budget:
    """``30m``, ``90s``, ``1.5h``, ``2min`` (wall time) or ``20M``, ``500K``, ``1G``, ``163840`` (tokens)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", str(text))
    unit = match.group(2) if match else None
    if match and unit in _TIME_UNITS:
        seconds = float(match.group(1)) * _TIME_UNITS[unit]
        if seconds > 0:
            return Budget(str(text), seconds=seconds)
    elif match and unit in _TOKEN_UNITS:
        tokens = float(match.group(1)) * _TOKEN_UNITS[unit]
        if tokens >= 1:
            return Budget(str(text), tokens=int(tokens))
    raise LadderizeError(f"--budget {text!r}: give wall time (90s, 30m, 1.5h) or tokens (500K, 20M, 1G; "
                         "lowercase m is minutes, uppercase M millions)")


def stage_cost(stage: PlannedStage) -> float:
    """Token passes of a resolved stage: tokens x its passes (a sequential stage's epochs, ``PlannedStage.passes``)."""
    return stage.tokens * stage.passes


def recipe_cost(stages: Sequence[PlannedStage]) -> int:
    """Token passes of a recipe's resolved stages."""
    return round(sum(stage_cost(stage) for stage in stages))


def scale_stages(stages: Sequence[PlannedStage], tokens: int, *, max_calibration: int | None = None) -> list[PlannedStage]:
    """``stages`` (resolved) sized to ``tokens`` token passes (module docstring).

    ``max_calibration``: the most calibration tokens a sequential stage may cache; the rest moves to the next
    stage that is not sequential (where there is none, the sequential stage keeps them).
    """
    factor = tokens / max(1, recipe_cost(stages))
    wanted = [stage_cost(stage) * factor for stage in stages]
    capped = [False] * len(stages)
    for index, stage in enumerate(stages):
        if not stage.sequential or max_calibration is None:
            continue
        epochs = stage.passes
        if wanted[index] / epochs <= max_calibration:
            continue
        later = [k for k in range(index + 1, len(stages)) if not stages[k].sequential]
        if later:
            wanted[later[0]] += wanted[index] - max_calibration * epochs
            wanted[index] = max_calibration * epochs
            capped[index] = True
    sized = []
    for index, (stage, cost) in enumerate(zip(stages, wanted)):
        unit = stage.resolved.training.tokens_per_step
        epochs = stage.passes
        stage_tokens = max(1, round(cost / epochs / unit)) * unit
        if capped[index] and stage_tokens > max_calibration:
            stage_tokens = max(1, max_calibration // unit) * unit  # rounded down: the cap holds
        scale = stage_tokens / stage.tokens
        warmup = stage.resolved.optimizer.warmup_steps if stage.sets("warmup_steps") else None  # a preset's, scaled
        stage = stage.with_fields(TrainingSettings, tokens=stage_tokens)
        if warmup is not None:
            stage = stage.with_fields(OptimizerSettings, warmup_steps=min(MAX_WARMUP_STEPS, max(1, round(warmup * scale))))
        ema = stage.resolved.scope.ema
        if ema:  # the average's horizon, 1 / (1 - decay) steps, grows with the stage
            stage = stage.with_fields(ScopeSettings, ema=round(1 - (1 - ema) / scale, 6))
        sized.append(stage)
    return sized


def max_calibration_tokens(hidden_size: int, device: str, bytes_per_value: int = 4, window: int = 1,
                           available: float | None = None) -> int | None:
    """The most calibration tokens whose cached states (``sequential_schedule.state_copies(window)`` tensors of
    ``hidden_size``) fit in ``STATE_MEMORY_SHARE`` of the memory there is on ``device`` (None where it cannot be read);
    ``available``: that memory, given (a GPU the run is priced for) rather than read."""
    from .sequential_schedule import state_copies

    available = available or _available_memory(device)
    if available is None:
        return None
    return max(1, int(STATE_MEMORY_SHARE * available / (state_copies(window) * hidden_size * bytes_per_value)))


def _available_memory(device: str) -> int | None:
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        from ...checkpoint.placement import resolve_device

        free, _total = torch.cuda.mem_get_info(resolve_device(device))  # "cuda": this process's own GPU, not GPU 0
        return int(free)
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        return None


def plan_line(budget: Budget, stages: Sequence[PlannedStage]) -> str:
    """One line: the budget and what the stages got."""
    parts = []
    for stage in stages:
        size = counted(stage.tokens, "token")
        if stage.sequential:
            size += f" x {stage.passes:g}"
        parts.append(f"{stage.name} {size}")
    total = recipe_cost(stages)
    how = f" (--budget {budget.text.strip()}: a bare number counts token passes; 30m is wall time)" if budget.bare else ""
    over = (f", more than {budget.tokens:,}: each stage trains whole steps, at least one"
            if budget.tokens is not None and total > budget.tokens else "")
    return f"budget {budget.describe()}{how}: {total:,} token passes ({', '.join(parts)}){over}"


def check_budget_steps(stages: Sequence[PlannedStage]) -> None:
    """A recipe a budget can size: every stage sets a token count."""
    for stage in stages:
        if (not stage.sets("tokens") or not isinstance(stage.tokens, int) or stage.tokens < 1
                or not math.isfinite(stage_cost(stage))):
            raise LadderizeError(f"--budget: stage {stage.number} ({stage.name}) has no token count to size")


class PaceNeeded(Exception):
    """The plan needs this device's pace timed before it can size a budget: ``line`` says so, and ``timing`` is what
    to time (``checkpoint`` and the settings ``pace.measure_launch`` takes). The caller times it under the launch and
    plans again with the pace as data (``entrance.with_timed_pace``): planning imports no training."""

    def __init__(self, line: str, checkpoint: str, timing: dict[str, Any]):
        super().__init__(line)
        self.line, self.checkpoint, self.timing = line, checkpoint, timing


def size_recipe(stages: Sequence[PlannedStage], budget: Budget, checkpoint: str,
                say=lambda _line: None, began: float | None = None,
                pace: Pace | None = None) -> tuple[list[PlannedStage], Sizing]:
    """``stages`` sized to ``budget`` (a wall budget timed on this device first), and the sizing the plan keeps.

    The pace is ``pace`` where given (timed on this device just now; kept for the next run), else the one kept for
    this machine's load now (``kept_paces.py``), else ``PaceNeeded`` is raised, saying what to time. A wall budget's
    smallest run (one step a stage) must fit the budget by the pace (``_check_floor``; a kept pace timed at a higher
    load than now that refuses it asks to be timed again first); the stages are then sized to the time left on the
    clock (``began``: when the command began, ``time.perf_counter()``), and where that is less than the smallest run,
    they run it. Under a launcher every process takes the main process's decisions (``process_group.agreed``)."""
    import time

    from ...checkpoint.io import load_config
    from ...checkpoint.placement import this_launch
    from . import kept_paces as pacing
    from ..process_group import agreed

    steps = list(stages)
    check_budget_steps(steps)
    first = steps[0]
    device = first.resolved.parallelism.device
    sequential = [s.resolved for s in steps if s.sequential]
    window = max((s.sequential.window for s in sequential), default=1)
    resolved = device if device != "auto" else _auto_device()
    # the pace first (a wall budget's smallest run is checked by it before the data is read); a token budget's plan
    # takes its expected time from it too
    if budget.seconds is not None:
        steps = _eager_if_short(steps, budget, resolved, say)
        first = steps[0]
    settings = first.resolved
    processes = this_launch().world
    timing = dict(seq_len=settings.training.seq_len, batch_size=settings.training.batch_size, device=device, dtype=settings.parallelism.dtype,
                  mixed_precision=settings.parallelism.mixed_precision, compile=settings.parallelism.compile)
    # the kept paces' key holds the precision as the stage sets it (None: not set)
    key = pacing.pace_key(checkpoint, seq_len=settings.training.seq_len, batch_size=settings.training.batch_size, device=resolved,
                          dtype=settings.parallelism.dtype, mixed_precision=(settings.parallelism.mixed_precision if first.sets("mixed_precision") else None), compile=settings.parallelism.compile,
                          processes=processes, grad_accum=settings.training.grad_accum)
    # the main process's load, kept pace and fixed costs decide for every process, which then times (or not) with
    # the others
    main = this_launch().main
    fixed = fixed_costs_refusal(budget, checkpoint, began) if main else None
    now = pacing.machine_load()
    now, kept, fixed = agreed((now, pacing.cached_pace(key, pacing.load_band(now)) if main and pace is None else None,
                               fixed))
    if fixed is not None:
        raise LadderizeError(fixed)
    if pace is not None:  # timed just now: kept for the next run
        when = TIMED
        if main:
            pacing.store_pace(key, pace)
    else:
        pace, when = kept, KEPT

    def timing_needed(line: str) -> PaceNeeded:
        return PaceNeeded(line, checkpoint, {**timing, "grad_accum": settings.training.grad_accum})

    def retime(refused: bool) -> bool:
        """Whether to time again: the kept pace refuses, and it was timed at a higher load than the machine's now
        (or either is not known); one answer for every process."""
        return agreed(refused and when == KEPT and (kept.load is None or now is None or kept.load > now))

    if pace is None:  # (a pace kept here answers at once: the floor it names is the one the next run checks by it)
        raise timing_needed(f"budget {budget.describe()}: timing this device's pace (a converted layer's forward and "
                            "backward and the kd head, a few calls each: seconds; kept for the next run)")
    refit = (f"budget {budget.describe()}: timing this device's pace again: the one kept here, timed at "
             f"{pacing.describe_load(kept and kept.load)}, refuses it; the {pacing.describe_load(now)} now")
    if budget.seconds is not None:
        if retime(_floor_seconds(pace, steps) > budget.seconds):
            raise timing_needed(refit)
        _check_floor(budget, pace, steps, when)
    memory_cap = max_calibration_tokens(load_config(checkpoint).hidden_size, resolved,
                                        window=window)
    cap = _data_tokens(first, checkpoint, memory_cap) if sequential else memory_cap
    held = cap if sequential and (memory_cap is None or cap < memory_cap) else None  # the whole data, in tokens

    def size(plan: Sequence[PlannedStage], tokens: int) -> list[PlannedStage]:
        return scale_stages(plan, tokens, max_calibration=cap)

    record: dict[str, Any] = {"text": budget.text, "seconds": budget.seconds, "calibration_cap": cap, "data_tokens": held}
    tokens = budget.tokens
    if budget.seconds is not None:
        def fit() -> tuple[float, int]:
            spent = 0.0 if began is None else time.perf_counter() - began  # imports, the data, the pace: spent already
            return spent, agreed(tokens_for_seconds(pace, steps, budget.seconds - spent, size, held))

        spent, tokens = fit()
        if tokens < 1 and retime(_floor_seconds(pace, size(steps, 1), held) > budget.seconds):
            raise timing_needed(refit)
        record["spent_s"] = round(spent, 3)
        if tokens < 1:
            _check_floor(budget, pace, size(steps, 1), when, held)  # refused where the smallest run is over the budget
            tokens = 1
        record["pace"] = pace.record()
        kept_note = "" if when == TIMED else (
            f" (kept in {pacing.pace_file(key, pacing.load_band(now))}: each piece the fastest timed here at about this "
            f"load, {pacing.describe_load(pace.load)} then, {pacing.describe_load(now)} now)")
        say(f"budget {budget.describe()} {pacing.describe(pace)}{kept_note}: {tokens:,} token passes fit"
            + (f" in the {duration(max(0.0, budget.seconds - spent))} left after {duration(spent)} of starting" if spent else ""))
    sized = size(steps, tokens)
    record["tokens"] = tokens
    record["timed_s"] = pace.measured_s if when == TIMED else 0.0  # what timing the pace cost this run
    full = cap is not None and any(stage.sequential and stage.tokens + stage.resolved.training.tokens_per_step > cap for stage in sized)
    say(plan_line(budget, sized) + (f"; the sequential calibration set is capped at {cap:,} tokens (the data, or "
                                    f"{STATE_MEMORY_SHARE:.0%} of memory for its states): the rest goes to the next stage" if full else "")
        + "".join(f"; {name} reads the data {passes:.1f} times over: past one pass, the runs measured on SmolLM2 "
                  "gained WikiText and lost LAMBADA (docs/adapt.md); more data buys more than more passes"
                  for name, passes in rereads(sized, first, held)))
    planned = stages_seconds(pace, sized, held)
    record["planned_s"] = planned
    if budget.tokens is not None:
        record["pace"] = pace.record()
    say("planned wall time: " + ", ".join(f"{stage.name} {duration(s)}" for stage, s in zip(sized, planned))
        + (f" (of {budget.describe()})" if budget.seconds is not None else f" ({pacing.describe(pace)})"))
    return sized, Sizing.from_record(record)


KEPT, TIMED = "timed here before, its fastest", "timed now"  # where the pace came from, as a refusal names it
FLOOR_MARGIN = 1.25  # the smallest budget a refusal names: the smallest run's time by the pace, times this, rounded up


def floor_budget(seconds: float) -> str:
    """The ``--budget`` a refusal names for a smallest run of ``seconds`` by the pace: ``FLOOR_MARGIN`` over it, rounded
    up to whole minutes from a minute on, else to whole seconds. A budget that long passes the check by the same pace
    (``_check_floor``: the smallest run no longer than the budget), and by a pace up to ``FLOOR_MARGIN`` slower."""
    least = FLOOR_MARGIN * seconds
    return f"{math.ceil(least / 60 - 1e-9)}m" if least >= 60 else f"{max(1, math.ceil(least - 1e-9))}s"


def fixed_costs_refusal(budget: Budget, checkpoint: str, began: float | None) -> str | None:
    """Why a wall ``budget`` cannot hold the run's fixed costs, known before any timing (None where it can): the
    seconds the command has spent starting (``began``: imports, the data) and reading the student's and the teacher's
    weights at ``cost.DISK_BYTES_PER_S``."""
    import time

    from .cost import DISK_BYTES_PER_S

    if budget.seconds is None:
        return None
    spent = 0.0 if began is None else time.perf_counter() - began
    weights = sum(file.stat().st_size for file in Path(checkpoint).glob("*.safetensors"))
    fixed = spent + 2 * weights / DISK_BYTES_PER_S
    if fixed < budget.seconds:
        return None
    return (f"--budget {budget.text}: shorter than what the run spends before it trains ({duration(spent)} to start, "
            f"about {duration(2 * weights / DISK_BYTES_PER_S)} to read the student's and the teacher's weights), before "
            f"this device's pace is timed; give at least --budget {floor_budget(fixed)}")


def _floor_seconds(pace: Pace, stages: Sequence[PlannedStage], held: int | None = None) -> float:
    """The seconds of the recipe's smallest sizing (one step per stage) by ``pace``."""
    return recipe_seconds(pace, scale_stages(stages, 1), held)


def _check_floor(budget: Budget, pace: Pace, stages: Sequence[PlannedStage], when: str, held: int | None = None) -> None:
    """Refuse ``budget`` in one line, naming the smallest wall budget that runs (``floor_budget``), where the recipe's
    smallest sizing (one step per stage) takes longer by ``pace`` than the budget."""
    floor = _floor_seconds(pace, stages, held)
    if floor > budget.seconds:
        raise LadderizeError(f"--budget {budget.text}: too short for this recipe on {pace.device}; its smallest run "
                             f"takes about {duration(floor)} (by the pace {when}): give at least "
                             f"--budget {floor_budget(floor)}")


def replan(stages: Sequence[PlannedStage], index: int, sizing: Sizing, stage_s: list[float],
           say=lambda _line: None, spent_s: float | None = None) -> tuple[list[PlannedStage], Sizing]:
    """A wall budget's stages after stage ``index`` re-sized to the time left once it has finished: the new stages and
    a new sizing. It holds the plan's times as it now stands (``planned_s``) and, in ``replanned``, an entry per
    re-plan with the times it replaced (``before_s``).

    The time spent is the run's clock (``spent_s``: the wall seconds since the command began, loading, writing and the
    pace included), and never less than the pace's timing here and the finished stages' own training seconds
    (``stage_s``, from their curves: a run resumed after a kill counts the training it did, not the time it lay
    stopped). The stages left are timed by the pace, slowed by as much as the finished ones ran over their plan (never
    sped up: a budget is a ceiling), and sized by ``scale_stages``. Where even their smallest sizing does not fit, the
    line says so at once, and by how much the run will end past its budget."""
    record = sizing.record()
    pace = sizing.pace
    ran, planned = sum(stage_s[: index + 1]), sum(record["planned_s"][: index + 1])
    slower = max(1.0, ran / planned) if planned > 0 else 1.0
    spent = (pace.measured_s if sizing.timed_s is None else sizing.timed_s) + ran
    if spent_s is not None:
        spent = max(spent, spent_s)
    left = record["seconds"] - spent
    rest = list(stages[index + 1:])

    def size(plan: Sequence[PlannedStage], tokens: int) -> list[PlannedStage]:
        return scale_stages(plan, tokens, max_calibration=record.get("calibration_cap"))

    held, done = record.get("data_tokens"), list(stages[: index + 1])
    tokens = tokens_for_seconds(pace, rest, max(0.0, left) / slower, size, held, done)
    sized = size(rest, max(1, tokens))
    plan = [*done, *sized]
    timed = stages_seconds(pace, sized, held, done)
    expected = [slower * seconds for seconds in timed]
    before = record["planned_s"]
    record["planned_s"] = [*before[: index + 1], *timed]  # the pace's times of the plan as it now stands
    record.setdefault("replanned", []).append({
        "after_stage": stages[index].number, "ran_s": round(ran, 3), "spent_s": round(spent, 3),
        "left_s": round(left, 3), "slower": round(slower, 4), "tokens": recipe_cost(sized), "expected_s": expected,
        "before_s": before})
    finished = stages[index].name
    pace_note = f", at the {slower:.2f}x slower pace the stages so far ran" if slower > 1 else ""
    sizes = ", ".join(f"{new.name} {old.tokens:,} -> {counted(new.tokens, 'token')}" for old, new in zip(rest, sized))
    over = spent + sum(expected) - record["seconds"]
    short = "" if tokens else (
        f", less than the smallest stage left: it runs one step, and the run will end about {duration(max(0.0, over))} "
        f"past its budget of {duration(record['seconds'])} ({finished} ran over its plan; nothing left can be shortened)")
    say(f"budget {duration(record['seconds'])}: {finished} ran {duration(ran)} (planned {duration(planned)}), "
        f"{duration(spent)} spent in all, {duration(max(0.0, left))} left" + short +
        f"; re-planned {sizes}: {recipe_cost(plan):,} token passes "
        f"(expected {', '.join(duration(s) for s in expected)}{pace_note})")
    return plan, Sizing.from_record(record)


def _eager_if_short(stages: list[PlannedStage], budget: Budget, device: str,
                    say) -> list[PlannedStage]:
    """``stages`` on ``device`` (resolved, not ``auto``) with auto's compile turned off where a wall budget is too
    short to earn back the compiler's waits (``compilation.eager_for_budget``); a setting given (``--compile``,
    ``compile=`` in a stage) stays."""
    import torch

    from .compile_policy import AUTO_MIN_BUDGET_S, eager_for_budget

    target = torch.device(device)
    if not any(eager_for_budget(stage.resolved.parallelism.compile, budget.seconds, target) for stage in stages):
        return stages
    say(f"budget {budget.describe()}: eager layers (auto compiles from {duration(AUTO_MIN_BUDGET_S)} on: in a shorter "
        "budget the compiler's waits cost more than its fused ops save; --compile asks for it)")
    return [stage.with_fields(ParallelismSettings, compile=False) if stage.resolved.parallelism.compile is None else stage
            for stage in stages]


def rereads(sized: Sequence[PlannedStage], first: PlannedStage, held: int | None) -> list[tuple[str, float]]:
    """The joint stages that read the first stage's data, ``held`` tokens in all, more than once: (name, passes)."""
    if not held:
        return []
    data = first.resolved.training.data
    return [(stage.name, stage.tokens / held) for stage in sized
            if not stage.sequential and stage.resolved.training.data == data and stage.tokens > held]


def _data_tokens(stage: PlannedStage, checkpoint: str, cap: int | None) -> int | None:
    """The tokens of whole sequences the data holds, up to ``cap`` (tokenized into the token store that far)."""
    from ...checkpoint.io import load_tokenizer
    from ...corpus.windows import token_windows

    settings = stage.resolved
    seq_len = settings.training.seq_len
    windows = token_windows(settings.training.data, load_tokenizer(checkpoint, "adaptation"), seq_len,
                            max_tokens=cap)
    held = len(windows) * seq_len
    return held if cap is None or held < cap else cap


def _auto_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
