"""Adaptation recipes run: the plan's stages one after another, each resumable, the plan recorded in the output.

What a recipe is (presets, named recipes, a recipe file, ``--stage``) is ``stages.py``; the run's plan, built from it
once (``entrance.plan_adapt``, before ``run_recipe`` runs it), is ``plan/adapt_plan.py``.

Files: stage k of n (k < n) writes its checkpoint to ``RUN/stage<k>-<name>/`` (in float32: the next stage starts
from the trained weights exactly) and its training state to ``RUN/stage<k>-<name>.run/``; the last stage writes OUT
(in ``output_dtype``, by default the recipe's input checkpoint's dtype). ``RUN/recipe.json`` holds the
plan. ``RUN`` is ``OUT.adapt-run`` (or ``--run-dir``). ``--resume`` skips the finished stages
and resumes the interrupted one exactly; a finished recipe removes RUN unless ``keep_state``.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..errors import LadderizeError
from ..checkpoint.atomic import check_apart
from ..checkpoint.placement import this_launch
from .plan.budget import replan
from .process_group import agreed
from .plan.config import FINGERPRINT_SKIPS, AdaptResult, PhaseProgress
from .plan.inputs import PLAN_FILE, STATE_DIR, adapt_inputs, run_folder
from .train.output import CURVE_FILE, checkpoint_dtype, stage_points
from .plan.adapt_plan import AdaptPlan
from .plan.planned_stage import PlannedStage
from .plan.settings_sections import SavingSettings
from .plan.stages import describe
from .plan.sequential_schedule import keeps_teacher_states, rows_read
from .stage_run import adapt, preflight

TEACHER_STATES_DIR = "teacher-states"  # in the recipe's run dir: what a sequential stage keeps for kd (teacher_states.py)


def _comparable(record: dict[str, Any]) -> dict[str, Any]:
    """A plan record without the settings that place data but leave the result alone (a resume may change them), and
    without the launch and its pricing (a sharded run may resume on another process count)."""
    placement = FINGERPRINT_SKIPS
    kept = {key: value for key, value in record.items() if key not in ("launch", "cost", "expected_s")}
    return {**kept, "plan": [{k: v for k, v in step.items() if k not in placement} for step in record.get("plan", [])]}


@dataclass
class RecipeResult:
    out: Path
    stages: list[AdaptResult]
    plan: list[dict[str, Any]]
    finished: bool
    run_dir: Path | None = None
    earlier: list[AdaptResult] = field(default_factory=list)  # the stages an earlier attempt finished, as recorded


@dataclass(frozen=True)
class RunOptions:
    """How ``run_recipe`` runs a plan and what it reports (what each stage trains is the plan's).

    ``run_dir``: RUN (default ``OUT.adapt-run``). ``keep_stages`` keeps the stage checkpoints in RUN (``keep_state``
    keeps them and the training state). ``stop_after_steps`` counts optimizer steps over all stages and ends the run
    there as a kill would (tests of resume); ``max_steps`` likewise, with the state saved there (``stage_run.adapt``).
    ``began``: when the run began (``time.perf_counter()``; default when ``run_recipe`` starts), the clock of a wall
    budget, which its re-plans and the stages' deadlines read (``budget.py``, "keeping the time"); pass the time the
    plan was built with (``plan_adapt``'s ``began``).
    ``on_plan(plan)`` shows the plan once every stage passed its preflight; ``on_stage_start(line)`` announces a stage
    (default ``on_message``); ``on_stage_end(stage, result, checkpoint)`` runs after each stage with its output
    checkpoint; ``progress`` and ``on_phase`` follow a stage's steps and its long phases before them (``stage_run.adapt``).
    """

    run_dir: str | None = None
    force: bool = False
    keep_state: bool = False
    keep_stages: bool = False
    resume: bool = False
    stop_after_steps: int | None = None
    max_steps: int | None = None
    began: float | None = None
    progress: Callable[..., None] | None = None
    on_message: Callable[[str], None] | None = None
    on_plan: Callable[[AdaptPlan], None] | None = None
    on_stage_start: Callable[[str], None] | None = None
    on_stage_end: Callable[[PlannedStage, AdaptResult, Path], None] | None = None
    on_phase: PhaseProgress | None = None


def run_recipe(plan: AdaptPlan, out: str | Path, options: RunOptions = RunOptions()) -> RecipeResult:
    """Run the stages of ``plan`` (``plan_adapt``) on its checkpoint, one after another; the last one writes ``out``.

    Every stage is checked (``train.preflight``) against the plan's checkpoint before the run dir exists; each stage's
    own input, written by the stage before it, is checked when the stage starts. A wall budget re-plans the stages
    left after each finished one (a new plan, recorded in ``RUN/recipe.json``); a resumed run keeps the sizes it
    planned.
    """
    run_dir = str(options.run_dir) if options.run_dir else None
    force, resume, checkpoint, out = options.force, options.resume, plan.checkpoint, str(out)
    say = options.on_message or (lambda _m: None)
    began = time.perf_counter() if options.began is None else options.began
    final = Path(out).expanduser().absolute()
    if final.exists() and not force:
        raise LadderizeError(f"output {final} already exists; pass --force to replace it")
    if not Path(checkpoint).expanduser().exists():
        raise LadderizeError(f"checkpoint {checkpoint} not found")
    top = run_folder(out, run_dir)
    inputs = adapt_inputs(checkpoint, plan.stages[0].resolved.training.data, plan.stages[0].resolved.objective.teacher)
    check_apart(final, inputs)
    check_apart(top, inputs, "the run folder")  # --force and a finished run remove it
    plan_file = top / PLAN_FILE
    # under a launcher rank 0 alone reads and writes the plan: another rank would find the one rank 0 just wrote
    main = this_launch().main
    if plan.budget is not None:
        plan = agreed(plan)
    steps = plan.steps
    if main and plan_file.is_file():
        if resume:
            saved = _comparable(json.loads(plan_file.read_text()))
            if saved != _comparable(json.loads(json.dumps(plan.record()))):
                changed = [s["stage"] for s, t in zip(saved.get("plan", []), _comparable(plan.record())["plan"]) if s != json.loads(json.dumps(t))]
                what = f"stage {changed[0]}" if changed and len(saved["plan"]) == len(steps) else "its stages"
                raise LadderizeError(f"cannot resume {top}: the recipe differs from the interrupted run's ({what}); "
                                     "run the same command again with --resume, or --force to start over")
        elif not force:
            raise LadderizeError(f"{top} holds an earlier run; pass --resume to continue it or --force to start over")
        else:
            shutil.rmtree(top)
    elif main and resume:
        raise LadderizeError(f"nothing to resume: {top} holds no interrupted run; run without --resume to start one")
    for stage in plan.stages:  # every stage's settings, data and teacher, before the run dir exists
        preflight(stage.config(checkpoint, out, run_dir=run_dir, force=True), checkpoint=checkpoint)
    if options.on_plan is not None:
        options.on_plan(plan)
    fresh = not top.exists()
    top.mkdir(parents=True, exist_ok=True)
    if main:
        plan_file.write_text(json.dumps(plan.record(), indent=1) + "\n")

    def deadline(index: int, current: AdaptPlan, reused_s: float) -> float | None:
        """When stage ``index`` of a wall budget should end (``budget.Sizing.deadline``, as re-planned). Under a
        launcher the main process's clock decides for every process (``train/step_watch.StepWatch``), in the joint and
        the sequential stage alike."""
        return None if current.budget is None else current.budget.deadline(index, current.stages, began, reused_s)

    def after_stage(index: int, current: AdaptPlan, stage_s: list[float], reused_s: float = 0.0) -> AdaptPlan:
        """A wall budget re-plans the stages left once for each finished stage (``budget.replan``): a new plan, whose
        budget record keeps the times of the one it replaces; ``current`` is left as it was."""
        sizing = current.budget
        if sizing is None or not sizing.wall or index + 1 >= len(current.stages) \
                or sizing.replanned_after(current.stages[index].number):
            return current
        # the main process's times decide, as its pace decided the plan
        spent = time.perf_counter() - began + reused_s  # this attempt's clock, and what earlier attempts trained
        planned, sizing = agreed(replan(current.stages, index, sizing, stage_s, say, spent_s=spent) if main else None)
        replanned = replace(current.with_stages(planned), budget=sizing)
        if main:
            plan_file.write_text(json.dumps(replanned.record(), indent=1) + "\n")
        return replanned

    try:
        return _run_stages(plan, final, top, options, after_stage=after_stage, deadline=deadline)
    except BaseException:  # refused or interrupted before anything was saved: leave no run dir to block the rerun
        if fresh and main and not _saved_anything(top):
            shutil.rmtree(top, ignore_errors=True)
        raise


def _saved_anything(top: Path) -> bool:
    """Whether a run dir holds training state or a finished stage (what ``--resume`` continues from)."""
    return any(top.glob(f"*/{STATE_DIR}")) or any(top.glob(f"*/{CURVE_FILE}"))


def _run_stages(plan: AdaptPlan, final: Path, top: Path, options: RunOptions, *,
                after_stage: Callable[..., AdaptPlan] = lambda _i, plan, _s, _r=0.0: plan,
                deadline: Callable[[int, AdaptPlan, float], float | None] = lambda _i, _plan, _r: None) -> RecipeResult:
    """The plan's stages one after another, each from the one before; ``after_stage(index, plan, stage_s, reused_s)``
    may re-size the stages after a finished one (``stage_s``: the finished stages' training seconds, from their curves;
    ``reused_s``: those of the stages an earlier attempt finished); ``deadline(index, plan, reused_s)`` is when stage
    ``index`` should end (None: no deadline; none where ``stop_after_steps`` or ``max_steps`` stops the run: its stages
    keep the plan's sizes, so that a resume continues them exactly)."""
    say = options.on_message or (lambda _m: None)
    stop_after_steps, max_steps, keep_state = options.stop_after_steps, options.max_steps, options.keep_state
    results: list[AdaptResult] = []
    earlier: list[AdaptResult] = []
    current, done_steps, stage_s, reused_s = str(plan.checkpoint), 0, [], 0.0
    for index in range(len(plan.stages)):
        stage, stages, steps = plan.stages[index], plan.stages, plan.steps
        budgeted = plan.budget is not None and plan.budget.wall  # a re-plan may grow what is read
        last = index == len(stages) - 1
        tag = f"stage{stage.number}-{stage.name}"
        stage_out = final if last else top / tag
        stage_run = top / f"{tag}.run"
        shares = any(keeps_teacher_states(stages, i) for i in range(index + 1))  # it or a stage before it keeps them
        kept_rows = rows_read(stages, index, this_launch().world)  # a re-plan may grow what is read: all rows, where any
        config = stage.config(current, str(stage_out), run_dir=str(stage_run), force=options.force or not last,
                              keep_state=keep_state, recipe={**_provenance_record(plan), "stage": stage.number},
                              teacher_states=str(top / TEACHER_STATES_DIR) if shares else None,
                              teacher_state_rows=None if budgeted and kept_rows else kept_rows)
        # a stage before the last writes fp32 (the next one starts from the trained weights as they are), OUT the
        # dtype asked for, by default the recipe's input checkpoint's
        config = config.with_fields(SavingSettings, output_dtype=(config.saving.output_dtype or
                                                                  checkpoint_dtype(plan.checkpoint)) if last else "float32")
        if not last and (stage_out / CURVE_FILE).is_file():  # written last: the stage finished
            curve = stage_points(json.loads((stage_out / CURVE_FILE).read_text()))
            earlier.append(_finished_stage(stage_out, curve))
            done_steps += curve[-1]["step"] if curve else 0
            say(f"stage {stage.number}/{len(steps)} {stage.name}: finished earlier, reusing {stage_out}")
            current = str(stage_out)
            stage_s.append(curve[-1]["train_s"] if curve else 0.0)
            reused_s += stage_s[-1]
            plan = after_stage(index, plan, stage_s, reused_s)
            continue
        if any(limit is not None and done_steps >= limit for limit in (stop_after_steps, max_steps)):
            return RecipeResult(final, results, steps, False, top, earlier)
        (options.on_stage_start or say)(f"stage {stage.number}/{len(steps)} {describe(stage)[len(str(stage.number)) + 2:]}")
        if not last:
            shutil.rmtree(stage_out, ignore_errors=True)  # a partial write of an earlier attempt
        result = adapt(config, resume=options.resume and (stage_run / "state").is_dir(), progress=options.progress,
                       on_message=options.on_message, on_phase=options.on_phase, checked=True,
                       stop_after_steps=None if stop_after_steps is None else stop_after_steps - done_steps,
                       max_steps=None if max_steps is None else max_steps - done_steps,
                       deadline=None if stop_after_steps is not None or max_steps is not None else deadline(index, plan, reused_s))
        results.append(result)
        written = json.loads((stage_out / CURVE_FILE).read_text()) if (stage_out / CURVE_FILE).is_file() else None
        if not written or written[-1]["step"] != result.steps:  # (an OUT left by an earlier run has its own curve)
            return RecipeResult(final, results, steps, False, top, earlier)  # stopped early, as a kill would
        done_steps += result.steps
        if options.on_stage_end is not None:
            options.on_stage_end(stage, result, stage_out)
        current = str(stage_out)
        stage_s.append(written[-1]["train_s"])
        plan = after_stage(index, plan, stage_s, reused_s)  # (after the last stage: nothing left to re-plan)
    steps = plan.steps
    if options.keep_stages and not keep_state:  # the stage checkpoints stay, their training state goes
        for path in top.iterdir():
            if path.is_dir() and not (path / CURVE_FILE).is_file():
                shutil.rmtree(path)
            elif path.is_file():
                path.unlink()
    elif not keep_state:
        shutil.rmtree(top, ignore_errors=True)
    return RecipeResult(final, results, steps, True, top if top.exists() else None, earlier)


def _finished_stage(stage_out: Path, curve: list[dict[str, Any]]) -> AdaptResult:
    """A stage an earlier attempt finished, as its checkpoint records it (the ``adapt`` record its training appended
    to the provenance): its steps, tokens and training time over all its attempts, and its own curve."""
    from ..checkpoint.io import read_provenance

    record = next((step for step in reversed(read_provenance(stage_out).get("history", [])) if step.get("step") == "adapt"), {})
    return AdaptResult(stage_out, record.get("steps", 0), record.get("tokens", 0), record.get("train_s", 0.0), curve,
                       throughput=record.get("throughput"))


def _provenance_record(plan: AdaptPlan) -> dict[str, Any]:
    """What each stage's provenance keeps of the plan: the recipe's name, its stages, the budget's sizing, the launch
    and the expected time (the pricing in full stays in ``RUN/recipe.json``)."""
    record = {key: value for key, value in plan.record().items() if key not in ("recipe", "checkpoint", "cost")}
    return {"name": plan.recipe, **record}
