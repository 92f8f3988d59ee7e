"""The one entrance of an adapt run: ``adapt_checkpoint(request, reports)`` runs what an ``AdaptRequest`` asks for
(``ladderize adapt CKPT OUT``), and ``dry_run(request, launch)`` prices its plan without reading a weight.

The entrance starts the launch's process group (under a launcher), holds the run folder's lock, builds the plan once
(``plan_adapt``: ``plan.build_plan``), then trains a single stage (``stage_run.adapt``) or a recipe's stages
(``recipe_run.run_recipe``), each refusal it can make without torch made first (``check_request``). It imports the
training only when it runs one: the command line imports it before anything heavy.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from ..checkpoint.placement import resolve_device, this_launch
from ..errors import LadderizeError
from .plan.budget import Budget
from .plan.stage_clock import Pace
from .plan.config import AdaptResult
from .plan.inputs import PLAN_FILE, STATE_DIR, check_resumable, run_folder
from .plan.adapt_plan import AdaptPlan, build_plan
from .request import AdaptRequest, RunReports

__all__ = ["AdaptRequest", "AdaptRun", "RunReports", "adapt_checkpoint", "check_request", "dry_run", "plan_adapt",
           "whole_run_pace", "with_timed_pace"]


def plan_adapt(request: AdaptRequest, say: Callable[[str], None] = lambda _m: None) -> AdaptPlan:
    """The plan of a run (``plan.build_plan``): a resumed run with a budget keeps the sizes of the plan its earlier
    attempt recorded in ``RUN/recipe.json``, read by the main process alone and agreed by every process of a launch."""
    from .process_group import agreed

    top = run_folder(request.out, request.run_dir)
    saved, refusal = None, None
    if request.resume and this_launch().main and (top / PLAN_FILE).is_file():
        saved = json.loads((top / PLAN_FILE).read_text())
        try:
            _check_resumed_budget(saved, request.budget, top)
        except LadderizeError as exc:
            refusal = str(exc)
    # every process plans from the main process's record, so that all take the same collectives (a budget sized
    # anew agrees its pace and its tokens; a saved one agrees nothing more)
    saved, refusal = agreed((saved, refusal))
    if refusal is not None:
        raise LadderizeError(refusal)
    return with_timed_pace(lambda pace, heard: build_plan(
        request.checkpoint, shared=request.shared, single=request.single, recipe=request.recipe,
        stages=list(request.stages) or None, budget=request.budget, saved=saved, say=heard, began=request.began,
        pace=pace), say)


Planned = TypeVar("Planned")


def with_timed_pace(plan: Callable[[Pace | None, Callable[[str], None]], Planned],
                    say: Callable[[str], None] = lambda _m: None) -> Planned:
    """``plan(None, say)``; where it asks for this device's pace (``budget.PaceNeeded``), the pace timed under the
    launch (``pace.measure_launch``, on every process of it) and ``plan(pace, say)`` again, the pace handed in as data
    (a plan given a pace timed just now asks for none). The lines are said once, in order: what the first plan said
    before it asked, the line that asks, then the second plan's lines past those it repeats."""
    from .plan.budget import PaceNeeded

    heard: list[str] = []
    try:
        planned = plan(None, heard.append)
    except PaceNeeded as needed:
        from .train.pace import measure_launch

        for line in [*heard, needed.line]:
            say(line)
        pace = measure_launch(needed.checkpoint, **needed.timing)
        repeated = list(reversed(heard))  # the second plan says these first, again

        def once(line: str) -> None:
            if repeated and repeated[-1] == line:
                repeated.pop()
                return
            repeated.clear()
            say(line)

        return plan(pace, once)
    for line in heard:
        say(line)
    return planned


def _check_resumed_budget(saved: dict[str, Any], budget: Budget | None, top: Path) -> None:
    """A resumed run sizes its stages as the interrupted one did: the same ``--budget`` (or none), or one line naming
    it, before a budget of another size is timed and sized."""
    started = (saved.get("budget") or {}).get("text")
    given = None if budget is None else budget.text
    if started != given:
        was = "without --budget" if started is None else f"with --budget {started}"
        raise LadderizeError(f"cannot resume {top}: the run was planned {was}; run the same command again with --resume, "
                             "or --force to start over")


def check_request(request: AdaptRequest) -> None:
    """Everything ``request`` can be refused for that its flags, its paths and the checkpoint's config tell, checked
    without torch (one line per mistake, in about a second), by ``adapt_checkpoint`` before anything else: the
    checkpoint (its config, its weights' headers, converted layers to adapt), OUT and the run folder (free, apart from
    the inputs, in folders that exist), an interrupted run to resume, the data; then flags that do not go together,
    stage names and settings, fp16 where no CUDA GPU can be, and the teacher's folder where a stage reads one.
    ``build_plan`` checks the choices again, with the rest."""
    from ..checkpoint.architectures import read_config_header
    from ..checkpoint.atomic import check_apart, check_file_target, check_output_free
    from ..convert.inspect import count_parameters
    from ..corpus.token_store import check_data
    from .plan.inputs import adapt_inputs, check_input_checkpoint

    checkpoint, out, run_dir = Path(request.checkpoint), Path(request.out), request.run_dir
    read_config_header(checkpoint)
    count_parameters(checkpoint.expanduser())  # missing, truncated or corrupt weights: one line, before torch
    inputs = adapt_inputs(checkpoint, request.data, request.teacher)
    check_output_free(out.expanduser().absolute(), request.force, inputs)  # a resumed run too: OUT is written last
    check_apart(run_dir, inputs, "--run-dir")  # --force and a finished run remove it
    check_file_target(out, "output")
    if run_dir is not None:
        check_file_target(run_dir, "--run-dir")
    check_input_checkpoint(checkpoint)  # converted layers to adapt
    if request.resume:  # an interrupted run of this checkpoint to continue, or one line (its recipe: once planned)
        check_resumable(checkpoint, out, run_dir, single=bool(request.single.names))
    if request.data is not None:  # (the recipe's own data, where none is given: each stage's preflight reads it)
        check_data(request.data)
    from .plan.adapt_plan import planned_stages
    from .plan.config import check_fp16_device, check_settings, needs_teacher
    from .plan.inputs import resolve_teacher

    _name, stages, _recipe = planned_stages(str(request.checkpoint), request.shared, request.single, request.recipe,
                                            request.stages, request.budget)
    configs = [stage.resolved for stage in stages]
    teacher = False
    for config in configs:
        teacher = needs_teacher(config, check_settings(config)) or teacher
        check_fp16_device(config, known_without_torch=True)
    if teacher:  # the dense teacher a stage reads: --teacher, or the source the provenance names, is here
        resolve_teacher(str(request.checkpoint), request.teacher)


@dataclass
class AdaptRun:
    """What ``adapt_checkpoint`` did: ``result`` is the last stage's, with steps, tokens and time summed over stages
    (those an earlier attempt finished included), and ``resumed_from_step`` the run's step this attempt went on from."""

    result: AdaptResult
    stages: list[AdaptResult]  # every stage's, in order: those an earlier attempt finished, then this attempt's
    finished: bool = True  # False: stopped at --max-steps, OUT not written (resume continues)


def _resume_hint(exc: BaseException, where: Path) -> None:
    exc.hint = (f"training state saved in {where}; run the same command with --resume to continue"
                if where.exists() else "no training state was saved yet; run the same command again to start over")


def adapt_checkpoint(request: AdaptRequest, reports: RunReports = RunReports()) -> AdaptRun:
    """The pipeline behind ``ladderize adapt``: one stage (the request's single-stage settings) or a recipe.

    Under a launcher it starts the launch's process group first (``process_group.start``, on the request's device),
    then holds the run folder's lock (``run_lock.py``) from before its plan to its end: a run into an OUT that another
    live run holds is refused in one line naming it, before it reads or writes anything. The run's plan
    (``plan_adapt``) is built once: a single stage without ``lr`` takes the measured rate of its kind and the converted
    modes, and ``budget`` (``30m`` wall time or ``20M`` tokens) sizes a recipe's stages (``budget.py``);
    ``reports.on_plan(plan)`` shows it. An interrupt gets a hint on how to continue. ``max_steps`` stops after that
    many optimizer steps (over all stages) with a resumable state, as HF Trainer's ``max_steps`` for a smoke test, but
    keeps the budget's learning-rate schedule, so that ``resume`` continues it exactly. ``began`` (default now): a wall
    budget's clock, and the wall time the result gives (``AdaptResult.wall_s``)."""
    from ..checkpoint.placement import check_device, check_dtype
    from .plan.settings_sections import ParallelismSettings

    request = request.with_settings(checkpoint=str(request.checkpoint), out=str(request.out),
                                    run_dir=str(request.run_dir) if request.run_dir else None,
                                    shared=request.shared.with_given(ParallelismSettings, device=check_device(request.device),
                                                                     dtype=check_dtype(request.shared.config.parallelism.dtype)),
                                    began=time.perf_counter() if request.began is None else request.began)
    check_request(request)
    if this_launch().several:  # the launch's process group, before anything agrees on a verdict or a plan
        from .process_group import start

        start(resolve_device(request.device))
    from .run_lock import holding_run

    top = run_folder(request.out, request.run_dir)
    with holding_run(top, Path(request.out).expanduser().absolute(), reports.say):
        return _adapt_checkpoint(request, reports)


def _adapt_checkpoint(request: AdaptRequest, reports: RunReports) -> AdaptRun:
    """``adapt_checkpoint`` under its lock."""
    from ..errors import Interrupted
    from .recipe_run import RunOptions, run_recipe
    from .stage_run import adapt, preflight
    from .train.training_state import read_trainer_state

    checkpoint, out, run_dir, began = request.checkpoint, request.out, request.run_dir, request.began
    plan = plan_adapt(request, say=reports.say)
    _check_disk(plan, Path(out).expanduser().absolute(), run_folder(out, run_dir), resume=request.resume)
    if plan.single:
        config = plan.stages[0].config(checkpoint, out, run_dir=run_dir, force=request.force, keep_state=request.keep_state)
        preflight(config)  # refused before the plan is shown, as a recipe's stages are
        if request.resume:  # the settings the run was started with, before the plan is shown and the models load
            read_trainer_state(config.resolved_run_dir() / STATE_DIR, config)
        if reports.on_plan is not None:
            reports.on_plan(plan)
        try:
            result = adapt(config, resume=request.resume, progress=reports.progress, on_message=reports.on_message,
                           max_steps=request.max_steps, on_phase=reports.on_phase, checked=True)
        except Interrupted as exc:
            _resume_hint(exc, config.resolved_run_dir() / "state")
            raise
        result.wall_s = time.perf_counter() - began
        return AdaptRun(result, [result], not result.stopped_early)
    options = RunOptions(run_dir=run_dir, force=request.force, keep_state=request.keep_state, resume=request.resume,
                         max_steps=request.max_steps, began=began, progress=reports.progress,
                         on_message=reports.on_message, on_plan=reports.on_plan, on_stage_start=reports.on_stage_start,
                         on_phase=reports.on_phase)
    top = run_folder(out, run_dir)
    try:
        outcome = run_recipe(plan, out, options)
    except Interrupted as exc:
        _resume_hint(exc, top)
        raise
    if not outcome.stages:  # --max-steps reached before this run's first stage (resumed past it)
        raise LadderizeError(f"--max-steps {request.max_steps}: the run in {top} is already past that step; resume "
                             "without it")
    every = outcome.earlier + outcome.stages
    result = copy.copy(outcome.stages[-1])
    result.steps, result.tokens = sum(r.steps for r in every), sum(r.tokens for r in every)
    # the step of the whole run this attempt went on from: the stages earlier attempts finished, and the resumed one's
    result.resumed_from_step = sum(r.steps for r in outcome.earlier) + sum(r.resumed_from_step for r in outcome.stages)
    result.train_s = sum(r.train_s for r in every)
    result.throughput = whole_run_pace(every)
    if outcome.run_dir is not None:
        result.state_dir = outcome.run_dir
    result.wall_s = time.perf_counter() - began
    return AdaptRun(result, every, outcome.finished)


def _check_disk(plan: AdaptPlan, out: Path, top: Path, resume: bool) -> None:
    """Refuse in one line, before the models load, a run whose writes do not fit the free space of their disks
    (``cost.RunPlan.disk_bytes``: OUT, and the run folder less what a resumed run already holds there); the main
    process's verdict is every process's."""
    from ..checkpoint.free_space import check_free_space, folder_bytes
    from .process_group import agreed

    if plan.cost is None:
        return
    refusal = None
    if this_launch().main:
        needs = plan.cost.disk_bytes()
        held = folder_bytes(top) if resume else 0.0
        try:
            check_free_space({"OUT": (out, needs["OUT"]),
                              "the run folder": (top, max(0.0, needs["the run folder"] - held))})
        except LadderizeError as exc:
            refusal = str(exc)
    refusal = agreed(refusal)
    if refusal is not None:
        raise LadderizeError(refusal)


def whole_run_pace(stages: list[AdaptResult]) -> dict[str, Any] | None:
    """The pace of every stage together: tokens trained over training seconds, and MFU weighted by each stage's time
    (each stage's MFU counts its own FLOPs per token, and is given where every stage has one); None before any
    training second."""
    paces = [stage.throughput for stage in stages]
    seconds = sum(stage.train_s for stage in stages)
    if seconds <= 0:
        return None
    total = sum(stage.tokens for stage in stages) / seconds
    processes = next((pace["processes"] for pace in paces if pace), 1)
    whole = {"tokens_per_s": round(total, 1), "tokens_per_s_per_process": round(total / processes, 1),
             "processes": processes}
    if all(pace and "mfu" in pace for pace in paces):
        whole["mfu"] = round(sum(pace["mfu"] * stage.train_s for pace, stage in zip(paces, stages)) / seconds, 4)
    return whole


def dry_run(request: AdaptRequest, launch: str | None, say: Callable[[str], None] = lambda _line: None) -> AdaptPlan:
    """``ladderize adapt --dry-run``: the plan of ``request`` priced for ``launch`` (``8xH100``; None: the launch this
    process runs under), from the checkpoint's ``config.json`` alone: no weights, tokenizer or data read. ``say``
    hears how the plan was made (a budget's sizes)."""
    from .plan.inputs import check_input_checkpoint

    check_input_checkpoint(request.checkpoint)  # converted layers to price
    return build_plan(request.checkpoint, shared=request.shared, single=request.single, recipe=request.recipe,
                      stages=list(request.stages) or None, budget=request.budget, launch=launch, priced_only=True,
                      say=say)


