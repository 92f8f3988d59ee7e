"""The plan of an adapt run: one typed object, built once before any weight loads, that every stage reads.

``build_plan`` resolves the command line (a single stage's flags, or a recipe and the settings shared by its stages),
sizes the stages to ``--budget`` (``budget.py``), and prices them for the launch the run is under or one it names
(``cost.plan_run``: memory per GPU, tokens per step, steps, saves, and on a known GPU the expected tokens/s and wall
time), from the checkpoint's ``config.json``. A run then builds each stage's ``AdaptConfig`` from it
(``PlannedStage.config``), writes its ``record`` to ``RUN/recipe.json`` and into the output's provenance, and
``adapt --dry-run`` prints it and stops.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import LadderizeError
from .config import GivenSettings, check_settings
from .cost import Launch, RunPlan
from .inputs import check_seq_len, model_positions
from .planned_stage import PlannedStage
from .settings_sections import ParallelismSettings, TrainingSettings
from .stage_clock import Pace, StageClock, stages_seconds

if TYPE_CHECKING:
    from .budget import Budget, Sizing
    from .stages import Recipe


@dataclass
class AdaptPlan:
    """What an adapt run will do and what it will cost (module docstring)."""

    recipe: str  # the recipe's name (a file's path, "command line" for --stage), or the single stage's objective
    checkpoint: str
    stages: list[PlannedStage]
    launch: Launch
    single: bool = False  # one stage from the single-stage flags: it trains into OUT directly, without a recipe's run dir
    budget: Sizing | None = None  # how --budget sized the stages (budget.size_recipe)
    cost: RunPlan | None = None  # the stages priced for ``launch`` (None without a config.json or converted layers)
    converted: tuple[int, ...] = ()  # the checkpoint's converted layers (from its config.json)
    notes: tuple[str, ...] = ()  # how a default was fitted to the model (``_fit_positions``), printed with the plan

    @property
    def steps(self) -> list[dict[str, Any]]:
        """The stages as ``recipe.json`` and the provenance record them (``PlannedStage.step``)."""
        return [stage.step for stage in self.stages]

    def with_stages(self, stages: Sequence[PlannedStage]) -> "AdaptPlan":
        """This plan with its stages re-sized (a wall budget's re-plan after a finished stage), priced again."""
        plan = replace(self, stages=list(stages))
        plan.cost = _price(plan) if self.cost is not None else None
        return plan

    @property
    def clock(self) -> StageClock | None:
        """What times the stages (``stage_clock.py``): the pace the budget timed on this device (under a launcher, on
        every process of it), else the launch priced at the assumed MFU (None: neither, as on a CPU without a
        budget)."""
        if self.budget is not None and self.budget.pace is not None:
            return self.budget.pace
        return self.cost.clock if self.cost is not None else None

    @property
    def expected_s(self) -> float | None:
        """The wall seconds the run is expected to take: its stages timed by its clock (``stages_seconds``)."""
        clock = self.clock
        if clock is None:
            return None
        return float(sum(stages_seconds(clock, self.stages, self.budget and self.budget.data_tokens)))

    def record(self) -> dict[str, Any]:
        """``RUN/recipe.json`` and the provenance's ``recipe.plan``: the stages, the budget's sizing, the launch and
        its pricing."""
        record: dict[str, Any] = {"recipe": self.recipe, "checkpoint": str(Path(self.checkpoint).expanduser().absolute()),
                                  "plan": self.steps}
        if self.budget is not None:
            record["budget"] = self.budget.record()
        record["launch"] = {"processes": self.launch.processes, "gpu": self.launch.gpu}
        if self.cost is not None:
            record["expected_s"] = self.expected_s
            record["cost"] = self.cost.to_dict()
        return record

    def tokens_trained(self, stage: PlannedStage) -> int:
        """The tokens ``stage`` trains, as its progress and the run's last line count them: a joint stage's tokens in
        whole steps, a sequential stage's steps through each group of layers it trains together times their tokens
        (``sequential_schedule.window_steps``: its calibration tokens x epochs, once for every group)."""
        from .sequential_schedule import window_epochs, window_steps

        settings = stage.resolved
        training = settings.training
        if not stage.sequential:
            return training.steps * training.tokens_per_step  # the global batch: the same on any launch
        rows = max(1, training.sequences)
        batch = training.step_rows(rows)
        epochs = window_epochs(self.converted, settings.sequential.epochs, settings.sequential.epochs_ramp, settings.sequential.window)
        return sum(window_steps(epochs, rows, batch).values()) * batch * training.seq_len

    def lines(self) -> list[str]:
        """The plan as a run prints it before it starts: each stage, the tokens it trains where a sequential stage
        counts them otherwise than its size, then what it is expected to cost."""
        from ...progress import format_duration
        from .stages import describe

        head = (f"plan (stage {self.stages[0].name}):" if self.single else
                f"plan (recipe {self.recipe}, {len(self.stages)} stage(s)):")
        out = [head, *(f"  {describe(stage)}" for stage in self.stages), *(f"  {note}" for note in self.notes)]
        if self.converted and any(stage.sequential for stage in self.stages):
            trained = [self.tokens_trained(stage) for stage in self.stages]
            parts = ", ".join(f"{stage.name} {count:,}" for stage, count in zip(self.stages, trained))
            out.append(f"  tokens trained: {parts}" + (f" ({sum(trained):,} in all)" if len(trained) > 1 else "") +
                       "; a sequential stage trains its tokens x epochs through each converted layer (or window) in "
                       "turn, where a budget counts them once (token passes)")
        expected = self.expected_s
        if expected is not None:
            clock = self.clock
            how = (f"at the assumed MFU on {self.launch.describe()}" if not isinstance(clock, Pace) else
                   "timed on this device" if clock.processes == 1 else
                   f"timed on each of this launch's {clock.processes} processes, a step split over them")
            out.append(f"  expected: {format_duration(expected)} ({how})")
        return out


def build_plan(
    checkpoint: str | Path,
    *,
    shared: GivenSettings | None = None,
    single: GivenSettings | None = None,
    recipe: "str | Recipe | None" = None,
    stages: list[str] | None = None,
    budget: Budget | None = None,
    launch: str | Launch | None = None,
    priced_only: bool = False,
    saved: dict[str, Any] | None = None,
    say: Callable[[str], None] = lambda _line: None,
    began: float | None = None,
    pace: Pace | None = None,
) -> AdaptPlan:
    """The plan of ``ladderize adapt CKPT ...`` (module docstring). Each stage's settings are checked
    (``config.check_settings``) as soon as it is resolved, before anything is sized, priced or timed.

    ``launch``: ``8xH100`` or a ``Launch`` (None: the launch this process runs under). ``priced_only`` (``--dry-run``)
    reads nothing but ``config.json``: a token budget is sized with the launch's memory as the calibration cap, and a
    wall budget, which a run times on its device first, is refused; otherwise a plan that does not fit a known GPU's
    memory is refused in one line before the budget reads or times anything (its batch only grows after that).
    ``saved``: the record of an interrupted run's plan,
    whose sizes a resume with the same budget keeps (they were timed when the run began). ``began``: when the command
    began (``time.perf_counter()``), so that a wall budget's stages get the time left once the plan is made. ``pace``:
    this device's pace, timed just now for a budget that asked for it (``budget.PaceNeeded``: the caller times it and
    plans again, ``entrance.with_timed_pace``; planning imports no training)."""
    from ...checkpoint.architectures import read_config_header
    from .budget import Sizing, check_budget_steps, max_calibration_tokens, plan_line, scale_stages, size_recipe

    checkpoint = str(checkpoint)
    shared, single = shared or GivenSettings(), single or GivenSettings()
    sized_by = budget
    where = (launch if isinstance(launch, Launch) else Launch.parse(launch) if launch else
             Launch.current(shared.config.parallelism.device))
    readable = (Path(checkpoint) / "config.json").is_file()
    name, stages_planned, chosen = planned_stages(checkpoint, shared, single, recipe, stages, budget)
    plan = AdaptPlan(name, checkpoint, stages_planned, where, single=chosen is None)
    given = _user_set(chosen, shared, single)
    positions = model_positions(read_config_header(checkpoint)) if readable else None
    plan = _fit_positions(plan, positions, given)
    for stage in plan.stages:  # every stage's settings, before anything is sized, priced or timed
        check_settings(stage.resolved)
        check_seq_len(stage.resolved.training.seq_len, positions, checkpoint)  # one the user set: no longer than the positions
    plan = _divide_batches(plan, given, say)
    if readable and where.memory_bytes:
        plan = _fill_device(plan, given, say, grow=False)  # checkpointing where not one sequence fits without it
    if readable and where.memory_bytes and not priced_only:  # a known GPU's memory: refused before a budget is timed
        unfit = _price(plan)
        if unfit is not None and unfit.refusal is not None:
            raise LadderizeError(f"the plan does not fit: {unfit.refusal}")
    if sized_by is not None:
        stages = plan.stages
        check_budget_steps(stages)
        if priced_only:
            if sized_by.tokens is None:
                raise LadderizeError(f"--dry-run prices a token budget (500M, 3B); --budget {sized_by.text} is wall time, "
                                     "which a run measures on its device first")
            from ...checkpoint.io import load_config

            window = max((stage.resolved.sequential.window for stage in plan.stages if stage.sequential), default=1)
            cap = max_calibration_tokens(load_config(checkpoint).hidden_size, "cpu", window=window,
                                         available=where.memory_bytes)
            plan = plan.with_stages(scale_stages(stages, sized_by.tokens, max_calibration=cap))
            plan.budget = Sizing(sized_by.text, sized_by.tokens, cap)
            say(plan_line(sized_by, plan.stages))
        elif saved is not None and saved.get("budget", {}).get("text") == sized_by.text:
            plan = plan.with_stages([PlannedStage.from_step(step) for step in saved["plan"]])  # recipe.json's record
            plan.budget = Sizing.from_record(saved["budget"])
        else:
            sized, record = size_recipe(stages, sized_by, checkpoint, say, began=began, pace=pace)
            plan = plan.with_stages(sized)
            plan.budget = record
    if readable and where.memory_bytes:
        plan = _fill_device(plan, given, say)
    if readable:
        from ...checkpoint.io import load_config

        plan.converted = tuple(load_config(checkpoint).layout.converted_layers)
    plan.cost = _price(plan) if readable else None
    return plan


MIN_FILLED_STEPS = 1_000  # a batch grown to fill the device leaves a stage at least this many optimizer steps
FILL_MARGIN = 0.05  # a batch grown to fill the device leaves this share of the usable memory free (the estimate's error)


def planned_stages(checkpoint: str, shared: GivenSettings, single: GivenSettings, recipe: "str | Recipe | None",
                   stages: Sequence[str] | None, budget: Budget | None) -> tuple[str, list[PlannedStage], "Recipe | None"]:
    """The stages a request makes, typed, before anything is fitted or sized: the single stage its own settings give
    (over the shared ones, with the defaults it trains with spelt out), else the recipe's (``stages.resolve_stages``);
    the plan's name and the recipe (None: a single stage). A command line that mixes the two, or names a setting that
    no stage takes, is refused in one line."""
    from .stages import SINGLE_STAGE_FLAGS, _RESERVED, chosen_recipe, converted_modes, resolve_stages, with_measured_lr

    _check_choice(single, recipe, list(stages) if stages else None, budget, SINGLE_STAGE_FLAGS)
    for key in shared.names:
        if key in _RESERVED:
            raise LadderizeError(f"{key} is not a stage setting")
    if single.names:
        settings = single.over(shared)
        if (Path(checkpoint) / "config.json").is_file():
            settings = with_measured_lr(settings, converted_modes(checkpoint))
        settings = settings.including("objectives", "tokens", "lr")  # the defaults it trains with, as a recipe's stages
        name = settings.config.objective.objectives
        return name, [PlannedStage.of(1, name, settings)], None
    chosen = chosen_recipe(recipe, list(stages) if stages else None)
    return chosen.name, resolve_stages(chosen, checkpoint, shared), chosen


def _user_set(recipe: "Recipe | None", shared: GivenSettings, single: GivenSettings) -> list[set[str]]:
    """The settings the user chose for each stage (command line, recipe file, ``--stage``), not a preset's."""
    given = set(shared.names) | set(single.names)
    if recipe is None:
        return [given]
    return [given | set(recipe.shared.names) | set(stage.settings.names) for stage in recipe.stages]


def _divide_batches(plan: AdaptPlan, chosen: list[set[str]], say: Callable[[str], None]) -> AdaptPlan:
    """``plan`` with each joint stage's global batch divisible into the launch's processes x its accumulation
    (``batches.StepSplit.check``): a batch the user gave that does not divide is refused in one line naming the sizes
    that do; a preset's is rounded up to the nearest that does, with a line that says so."""
    from .batches import divisible_batch

    stages = list(plan.stages)
    for index, stage in enumerate(stages):
        if stage.sequential:
            continue
        settings = stage.resolved
        split = settings.training.split(plan.launch.processes)
        if split.even:
            continue
        given = chosen[min(index, len(chosen) - 1)]
        if "batch_size" in given:
            try:
                split.check()
            except LadderizeError as refused:
                raise LadderizeError(f"stage {stage.number} ({stage.name}): {refused}") from None
        batch = divisible_batch(split.batch_size, split.parts)
        stages[index] = stage.with_fields(TrainingSettings, batch_size=batch)
        say(f"stage {stage.number} ({stage.name}): batch {split.batch_size} rounded up to {batch}, "
            f"to divide into {plan.launch.processes} process(es) x {split.grad_accum} micro-batch(es) of "
            f"{batch // split.parts} sequence(s); --batch-size sets it")
    return plan.with_stages(stages) if stages != plan.stages else plan


def _fit_positions(plan: AdaptPlan, positions: int | None, chosen: list[set[str]]) -> AdaptPlan:
    """``plan`` with each stage's sequence length, where the user did not set it and the default is longer than the
    ``positions`` the model encodes, cut to them (a note the plan prints); one the user set is checked, not cut."""
    if positions is None:
        return plan
    stages, notes = list(plan.stages), []
    for index, stage in enumerate(stages):
        if stage.resolved.training.seq_len > positions and "seq_len" not in chosen[min(index, len(chosen) - 1)]:
            notes.append(f"stage {stage.number} ({stage.name}): sequences of {positions:,} tokens, the positions the model "
                         f"encodes (max_position_embeddings), not the default {stage.resolved.training.seq_len:,}")
            stages[index] = stage.with_fields(TrainingSettings, seq_len=positions)
    return replace(plan.with_stages(stages), notes=plan.notes + tuple(notes)) if notes else plan


def _fill_device(plan: AdaptPlan, chosen: list[set[str]], say: Callable[[str], None], *, grow: bool = True) -> AdaptPlan:
    """``plan`` with each joint stage's global batch grown to fill the launch's GPU memory (``grow``): processes x
    accumulation x the largest micro-batch per process whose memory estimate (``cost.JointMemory``) fits, where the
    stage still takes ``MIN_FILLED_STEPS`` optimizer steps or more, and never smaller than the stage's own. Where the
    stage's own batch's rows per process do not fit, they are split into accumulated micro-batches that do (the same
    sequences per step, ``batches.StepSplit``), with activation checkpointing turned on where
    not one sequence fits without it (``grow`` False: that alone, before the plan is checked against the memory). A
    batch size the user gave is not grown (it is still accumulated where it must be); an accumulation or
    checkpointing the user gave, and a stage too short to fill the device, stay as they are."""
    from ...checkpoint.io import load_config
    from .batches import StepSplit, dividing_accumulation
    from .cost import JointMemory, usable_bytes

    config = load_config(plan.checkpoint)
    converted = config.layout.converted_layers
    if not converted:
        return plan
    usable, processes = usable_bytes(plan.launch.memory_bytes), plan.launch.processes
    stages = list(plan.stages)
    for index, stage in enumerate(stages):
        given = chosen[min(index, len(chosen) - 1)]
        if stage.sequential:
            continue
        settings = stage.resolved
        seq_len, accum, start = settings.training.seq_len, settings.training.grad_accum, settings.training.batch_size  # start: the global batch
        local = StepSplit(start, processes, accum).local  # its rows on one process in one micro-batch
        checkpointing = settings.parallelism.activation_checkpointing

        def largest(most: int, checked: bool, accumulated: int, room: float = usable) -> int:
            """The largest batch up to ``most`` that fits ``room``, priced for the strategy the stage runs with
            (``JointMemory.for_step``), with ``checked`` checkpointing and ``accumulated`` micro-batches a step."""
            return JointMemory.largest_batch(config, converted, processes, seq_len, room, most=most,
                                             stage=stages[index].with_fields(ParallelismSettings, activation_checkpointing=checked)
                                             .with_fields(TrainingSettings, grad_accum=accumulated))

        gpu = plan.launch.describe().split(" x ")[-1]
        if largest(local, checkpointing, accum) < local:  # the stage's own batch does not fit
            split = max(accum, 2)  # a smaller batch is accumulated: priced so (FSDP2 keeps unsharded gradients)
            if not checkpointing and "activation_checkpointing" not in given and not largest(1, False, split) \
                    and largest(1, True, split):
                checkpointing = True
                stages[index] = stages[index].with_fields(ParallelismSettings, activation_checkpointing=True)
                say(f"stage {stage.number} ({stage.name}): activation checkpointing on, since without it not one "
                    f"sequence of {seq_len:,} tokens fits a {gpu}")
            smaller = largest(local, checkpointing, split)
            divides = dividing_accumulation(start, processes, -(-start // (processes * smaller))) if smaller else None
            if 0 < smaller < local and "grad_accum" not in given and divides:  # the same sequences, accumulated
                accum = divides
                stages[index] = stages[index].with_fields(TrainingSettings, grad_accum=divides)
                say(f"stage {stage.number} ({stage.name}): "
                    f"{StepSplit(start, processes, accum).describe()}, in the memory of a {gpu}")
        if not grow or "batch_size" in given:
            continue
        most = settings.training.tokens // (MIN_FILLED_STEPS * seq_len * accum * processes)
        batch = max(start, processes * accum * largest(most, checkpointing, accum, usable * (1 - FILL_MARGIN)))
        if batch > start:
            stages[index] = stages[index].with_fields(TrainingSettings, batch_size=batch)
            split = StepSplit(batch, processes, accum)
            say(f"stage {stage.number} ({stage.name}): {split.describe()} "
                f"({split.local * seq_len:,} tokens per process a micro-batch), the largest that fits the GPU's memory "
                f"with {FILL_MARGIN:.0%} of it left free; --batch-size sets it")
    return plan.with_stages(stages) if stages != plan.stages else plan


def _price(plan: AdaptPlan) -> RunPlan | None:
    """``plan``'s stages priced for its launch from the checkpoint's ``config.json`` (None without converted layers:
    there is nothing to price, and the run refuses it, ``train.preflight``)."""
    from ...checkpoint.io import load_config
    from .cost import plan_run

    config = load_config(plan.checkpoint)
    layout = config.layout
    if not layout.converted_layers:
        return None
    return plan_run(config, layout.describe(), layout.converted_layers, plan.stages, plan.launch,
                    model_name=Path(plan.checkpoint).name, data_tokens=plan.budget and plan.budget.data_tokens)


def _check_choice(single: GivenSettings, recipe: str | None, stages: list[str] | None, budget: Budget | None,
                  flags: dict[str, str]) -> None:
    """Refuse a command line that names a single stage and a recipe, both --recipe and --stage, or a budget for a
    single stage."""
    if single.names and (recipe or stages):
        names = ", ".join(flags.get(k, "--" + k.replace("_", "-")) for k in single.names)
        raise LadderizeError(f"{names} set a single stage; with --recipe/--stage put them in a stage instead, e.g. --stage kd:tokens=32768,lr=2e-4")
    if recipe and stages:
        raise LadderizeError("give --recipe or --stage, not both")
    if budget is not None and single.names:
        raise LadderizeError("--budget sizes a recipe's stages; a single stage takes --tokens instead")
