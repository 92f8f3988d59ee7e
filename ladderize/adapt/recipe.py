"""Adaptation recipes: named stages run one after another, each resumable, the plan recorded in the output.

A recipe is a list of stages plus settings shared by all of them. A stage is a named preset
(``STAGES``) with optional overrides; the learning rate defaults per stage kind and layer
mode, as measured (docs/adapt.md). Precedence, lowest first: ``AdaptConfig`` defaults, the
stage preset, the shared settings (recipe file top level, or the command line's shared
flags), the stage's own settings.

Command line (``ladderize adapt CKPT OUT``):

    (no stage flag)                         the built-in recipe ``best``
    --recipe best|seq-local|FILE.yaml       a built-in recipe or a recipe file
    --stage seq-local:tokens=65536,epochs=2 --stage kd:tokens=32768,lr=2e-4
                                            stages named on the command line, in order;
                                            ``objective=kd+local*0.5`` weights objectives

Recipe file (YAML, torchtune / axolotl style)::

    data: wikitext2-heldout        # shared settings: AdaptConfig field names
    seq_len: 512
    stages:
      - seq-local                  # a stage by name, with its preset
      - name: kd
        tokens: 32768
        lr: 2.0e-4

Files: stage k of n (k < n) writes its checkpoint to ``RUN/stage<k>-<name>/`` and its training
state to ``RUN/stage<k>-<name>.run/``; the last stage writes OUT. ``RUN/recipe.json`` holds the
plan. ``RUN`` is ``OUT.adapt-run`` (or ``--run-dir``). ``--resume`` skips the finished stages
and resumes the interrupted one exactly; a finished recipe removes RUN unless ``keep_state``.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ..errors import LadderizeError, one_line
from ..checkpoint.placement import process_rank
from ..progress import counted
from .budget import Budget, agreed, replan
from .config import AdaptConfig, AdaptResult
from .output import CURVE_FILE
from .plan import AdaptPlan, build_plan
from .teacher_states import keeps_teacher_states
from .train import adapt, preflight

# Stage presets (AdaptConfig overrides): the settings of the measured best recipe (benchmarks/adapt_ladder.py:
# 512-token sequences, 2 per step; 2 warm-up steps for seq-local, 5 for kd, as in the measured kd pass).
STAGES: dict[str, dict[str, Any]] = {
    "seq-local": {"objectives": "local", "local_schedule": "sequential", "tokens": 65_536, "epochs": 2.0, "batch_size": 2,
                  "warmup_steps": 2},
    "kd": {"objectives": "kd", "tokens": 32_768, "batch_size": 2, "warmup_steps": 5},
    "local": {"objectives": "local", "local_schedule": "joint", "tokens": 131_072},
    "lm": {"objectives": "lm", "tokens": 131_072},
}
RECIPES: dict[str, list[str]] = {
    # sequential local 65,536 x 2, then kd 32,768: 96.0% of the ladder 15-29 gap (docs/adapt.md)
    "best": ["seq-local", "kd"],
    "seq-local": ["seq-local"],
    "kd": ["kd"],
}
DEFAULT_RECIPE = "best"
PLAN_FILE = "recipe.json"
TEACHER_STATES_DIR = "teacher-states"  # in the recipe's run dir: what a sequential stage keeps for kd (teacher_states.py)
ALIASES = {"objective": "objectives", "schedule": "local_schedule", "inputs": "local_inputs", "top_k": "kd_top_k"}
_FIELDS = {f.name: f for f in fields(AdaptConfig)}
# settings a recipe may not set (they name the run, not a stage)
_RESERVED = {"checkpoint", "out", "run_dir", "force", "keep_state", "recipe"}


@dataclass
class Stage:
    name: str
    settings: dict[str, Any] = field(default_factory=dict)  # the stage's own overrides


@dataclass
class Recipe:
    name: str
    stages: list[Stage]
    shared: dict[str, Any] = field(default_factory=dict)


def _coerce(key: str, value: Any, where: str) -> tuple[str, Any]:
    key = ALIASES.get(key.replace("-", "_"), key.replace("-", "_"))
    if key not in _FIELDS or key in _RESERVED:
        known = sorted(k for k in _FIELDS if k not in _RESERVED)
        raise LadderizeError(f"{where}: unknown setting {key!r}; settings are {', '.join(known)}")
    kind = str(_FIELDS[key].type)
    try:
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            return key, None
        if kind.startswith("int"):
            return key, int(value)
        if kind.startswith("float"):
            return key, float(value)
        if kind.startswith("bool"):
            if isinstance(value, str):
                if value.lower() not in ("true", "false", "yes", "no", "1", "0"):
                    raise ValueError(value)
                return key, value.lower() in ("true", "yes", "1")
            return key, bool(value)
    except (TypeError, ValueError):
        raise LadderizeError(f"{where}: {key} must be {kind.split(' ')[0]}, got {value!r}") from None
    if key == "objectives" and isinstance(value, str):
        value = value.replace("+", ",").replace("*", "=")  # command-line form kd+local*0.5
    return key, str(value)


def _stage(name: str, settings: dict[str, Any], where: str) -> Stage:
    if name not in STAGES:
        raise LadderizeError(f"{where}: unknown stage {name!r}; stages are {', '.join(STAGES)}")
    return Stage(name, dict(_coerce(k, v, f"{where} stage {name}") for k, v in settings.items()))


def parse_stage(spec: str) -> Stage:
    """``NAME[:key=value,key=value]`` (the ``--stage`` form)."""
    name, _, rest = spec.strip().partition(":")
    settings = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq:
            raise LadderizeError(f"--stage {spec}: expected key=value, got {item!r} (e.g. --stage kd:tokens=32768,lr=2e-4)")
        settings[key.strip()] = value.strip()
    return _stage(name.strip(), settings, f"--stage {spec}")


def load_recipe(spec: str) -> Recipe:
    """A built-in recipe by name, or a YAML recipe file."""
    if spec in RECIPES:
        return Recipe(spec, [Stage(name) for name in RECIPES[spec]])
    path = Path(spec).expanduser()
    if not path.is_file():
        raise LadderizeError(f"unknown recipe {spec!r}: give a built-in recipe ({', '.join(RECIPES)}) or a YAML recipe file")
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" at line {where.line + 1}, column {where.column + 1}" if where is not None else ""
        problem = getattr(exc, "problem", None) or one_line(exc)
        raise LadderizeError(f"recipe {path} does not parse as YAML{line}: {problem}") from None
    if not isinstance(data, dict) or not isinstance(data.get("stages"), list) or not data["stages"]:
        raise LadderizeError(f"recipe {path} must be a mapping with a non-empty 'stages' list (see docs/adapt.md)")
    stages = []
    for number, item in enumerate(data["stages"], 1):
        if isinstance(item, str):
            stages.append(parse_stage(item))
        elif isinstance(item, dict) and isinstance(item.get("name"), str):
            stages.append(_stage(item["name"], {k: v for k, v in item.items() if k != "name"}, f"recipe {path}"))
        else:
            raise LadderizeError(f"recipe {path}: stage {number} must be a stage name or a mapping with 'name'")
    shared = dict(_coerce(k, v, f"recipe {path}") for k, v in data.items() if k != "stages")
    return Recipe(str(path), stages, shared)


def converted_modes(checkpoint: str) -> set[str]:
    """The modes of the converted layers of ``checkpoint`` (read from its config, no weights)."""
    from ..checkpoint.io import load_config

    layout = load_config(checkpoint).layout
    return {layout.modes[i].value for i in layout.converted_layers}


def stage_kind(settings: dict[str, Any]) -> str:
    if settings.get("local_schedule") == "sequential":
        return "sequential"
    return "kd" if settings.get("objectives", AdaptConfig.objectives) == "kd" else "joint"


def measured_lr(settings: dict[str, Any], modes: set[str]) -> float:
    """The measured peak learning rate for this stage kind and these converted-layer modes: the smallest of the
    modes' own rates (``ModeTraits.learning_rates``, the mode table's), else ``learning_rates_fallback``'s."""
    from ..model.layout import LayerMode, learning_rates_fallback

    kind = stage_kind(settings)
    own = [rates[kind] for rates in (LayerMode(mode).traits.learning_rates for mode in modes) if kind in rates]
    return min(own, default=learning_rates_fallback()[kind])


def resolve_stages(recipe: Recipe, checkpoint: str, shared: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every stage's resolved settings (the AdaptConfig overrides), ``lr`` filled in per layer mode."""
    modes = converted_modes(checkpoint) if Path(checkpoint).is_dir() else set()
    steps = []
    for number, stage in enumerate(recipe.stages, 1):
        settings = {**STAGES[stage.name], **recipe.shared, **(shared or {}), **stage.settings}
        if number > 1:
            settings.pop("head_grouping", None)  # once, before the first stage
        if settings.get("lr") is None:
            settings["lr"] = measured_lr(settings, modes)
        steps.append({"stage": number, "name": stage.name, **settings})
    return steps


def describe(step: dict[str, Any]) -> str:
    kind = step.get("local_schedule", "joint")
    epochs = float(step.get("epochs", AdaptConfig.epochs))
    tokens = counted(step["tokens"], "token") + (f" x {counted(epochs, 'epoch')}" if kind == "sequential" else "")
    keys = ("train", "data", "local_inputs", "kd_divergence", "kd_temperature", "kd_top_k", "interpolate", "ema") + (("states", "stream_layers", "closed_form", "epochs_ramp", "window") if kind == "sequential" else ())
    extra = "".join(f", {k} {step[k]}" for k in keys if k in step)
    return (f"{step['stage']}. {step['name']}: {step['objectives']} ({kind}), {tokens}, lr {step['lr']:g}, "
            f"batch {step.get('batch_size', AdaptConfig.batch_size)}{extra}")


def _comparable(record: dict[str, Any]) -> dict[str, Any]:
    """A plan record without the settings that place data but leave the result alone (a resume may change them), and
    without the launch and its pricing (a sharded run may resume on another process count)."""
    placement = set(AdaptConfig(checkpoint="", out="").fingerprint()) ^ {f.name for f in fields(AdaptConfig)}
    kept = {key: value for key, value in record.items() if key not in ("launch", "cost", "expected_s")}
    return {**kept, "plan": [{k: v for k, v in step.items() if k not in placement} for step in record.get("plan", [])]}


@dataclass
class RecipeResult:
    out: Path
    stages: list[AdaptResult]
    plan: list[dict[str, Any]]
    finished: bool
    run_dir: Path | None = None


def run_recipe(
    recipe: Recipe,
    checkpoint: str,
    out: str,
    *,
    shared: dict[str, Any] | None = None,
    run_dir: str | None = None,
    force: bool = False,
    keep_state: bool = False,
    keep_stages: bool = False,
    resume: bool = False,
    progress=None,
    on_message: Callable[[str], None] | None = None,
    on_plan: Callable[[list[dict[str, Any]]], None] | None = None,
    on_stage_start: Callable[[str], None] | None = None,
    on_stage_end: Callable[[dict[str, Any], AdaptResult, Path], None] | None = None,
    stop_after_steps: int | None = None,
    max_steps: int | None = None,
    budget: Budget | None = None,
    plan: AdaptPlan | None = None,
) -> RecipeResult:
    """Run the stages of ``recipe`` on ``checkpoint``; the last one writes ``out``.

    ``plan``: the run's plan (``plan.build_plan``), built here from ``recipe``, ``shared`` and ``budget`` where not
    given; ``budget`` sizes the stages to tokens or wall time (``budget.py``); a resumed run keeps the sizes it planned.

    ``stop_after_steps`` counts optimizer steps over all stages and ends the run there as a
    kill would (tests of resume); ``max_steps`` likewise, with the state saved there (``run.adapt``). ``keep_stages`` keeps the stage checkpoints in the run dir (``keep_state``
    keeps them and the training state). ``on_stage_start(line)`` announces a stage (default
    ``on_message``); ``on_stage_end(step, result, checkpoint)`` runs after each stage with its output checkpoint.
    """
    say = on_message or (lambda _m: None)
    final = Path(out).expanduser().absolute()
    if final.exists() and not force:
        raise LadderizeError(f"output {final} already exists; pass --force to replace it")
    if not Path(checkpoint).expanduser().exists():
        raise LadderizeError(f"checkpoint {checkpoint} not found")
    top = AdaptConfig(checkpoint=checkpoint, out=out, run_dir=run_dir).resolved_run_dir()
    plan_file = top / PLAN_FILE
    # under a launcher rank 0 alone reads and writes the plan: another rank would find the one rank 0 just wrote
    main = process_rank() == 0
    if plan is None:
        saved = json.loads(plan_file.read_text()) if resume and budget is not None and plan_file.is_file() else None
        plan = build_plan(checkpoint, shared=shared, recipe=recipe, budget=budget, saved=saved, say=say)
    if plan.budget is not None:
        plan = agreed(plan, plan.steps[0].get("device", AdaptConfig.device))
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
        say(f"nothing to resume in {top}; starting a new run")
    for stage in plan.stages:  # every stage's settings, data and teacher, before the run dir exists
        preflight(stage.config(checkpoint, out, run_dir=run_dir, force=True), checkpoint=checkpoint)
    if on_plan is not None:
        on_plan(steps)
    fresh = not top.exists()
    top.mkdir(parents=True, exist_ok=True)
    if main:
        plan_file.write_text(json.dumps(plan.record(), indent=1) + "\n")

    def after_stage(index: int, current: AdaptPlan, stage_s: list[float]) -> AdaptPlan:
        """A wall budget re-plans the stages left once for each finished stage (``budget.replan``), kept in the plan."""
        sizing = current.budget
        if sizing is None or sizing.get("seconds") is None or index + 1 >= len(current.stages) \
                or any(entry["after_stage"] == current.stages[index].number for entry in sizing.get("replanned", [])):
            return current
        # the main process's times decide, as its pace decided the plan
        planned, timed = agreed((replan(current.steps, index, sizing, stage_s, say), sizing) if main else None,
                                current.steps[0].get("device", AdaptConfig.device))
        sizing.update(timed)
        current = current.with_steps(planned)
        current.budget = sizing
        if main:
            plan_file.write_text(json.dumps(current.record(), indent=1) + "\n")
        return current

    try:
        return _run_stages(plan, out, final, top, run_dir=run_dir, force=force, keep_state=keep_state,
                           keep_stages=keep_stages, resume=resume, progress=progress, on_message=on_message,
                           on_stage_start=on_stage_start, on_stage_end=on_stage_end, stop_after_steps=stop_after_steps,
                           max_steps=max_steps, after_stage=after_stage)
    except BaseException:  # refused or interrupted before anything was saved: leave no run dir to block the rerun
        if fresh and main and not _saved_anything(top):
            shutil.rmtree(top, ignore_errors=True)
        raise


def _saved_anything(top: Path) -> bool:
    """Whether a run dir holds training state or a finished stage (what ``--resume`` continues from)."""
    from .training_state import STATE_DIR

    return any(top.glob(f"*/{STATE_DIR}")) or any(top.glob(f"*/{CURVE_FILE}"))


def _run_stages(plan: AdaptPlan, out: str, final: Path, top: Path, *,
                run_dir: str | None, force: bool, keep_state: bool, keep_stages: bool, resume: bool, progress,
                on_message: Callable[[str], None] | None, on_stage_start: Callable[[str], None] | None,
                on_stage_end: Callable[[dict[str, Any], AdaptResult, Path], None] | None,
                stop_after_steps: int | None, max_steps: int | None,
                after_stage: Callable[[int, AdaptPlan, list[float]], AdaptPlan] = lambda _i, plan, _s: plan,
                ) -> RecipeResult:
    """The plan's stages one after another, each from the one before; ``after_stage(index, plan, stage_s)`` may re-size
    the stages after a finished one (``stage_s``: the finished stages' training seconds, from their curves)."""
    say = on_message or (lambda _m: None)
    results: list[AdaptResult] = []
    current, done_steps, stage_s = str(plan.checkpoint), 0, []
    for index in range(len(plan.stages)):
        stage, steps = plan.stages[index], plan.steps
        last = index == len(steps) - 1
        tag = f"stage{stage.number}-{stage.name}"
        stage_out = final if last else top / tag
        stage_run = top / f"{tag}.run"
        shares = any(keeps_teacher_states(steps, i) for i in range(index + 1))  # it or a stage before it keeps them
        config = stage.config(current, str(stage_out), run_dir=str(stage_run), force=force or not last,
                              keep_state=keep_state, recipe={**_provenance_record(plan), "stage": stage.number},
                              teacher_states=str(top / TEACHER_STATES_DIR) if shares else None)
        if not last and (stage_out / CURVE_FILE).is_file():  # written last: the stage finished
            curve = json.loads((stage_out / CURVE_FILE).read_text())
            done_steps += curve[-1]["step"] if curve else 0
            say(f"stage {stage.number}/{len(steps)} {stage.name}: finished earlier, reusing {stage_out}")
            current = str(stage_out)
            stage_s.append(curve[-1]["train_s"] if curve else 0.0)
            plan = after_stage(index, plan, stage_s)
            continue
        if any(limit is not None and done_steps >= limit for limit in (stop_after_steps, max_steps)):
            return RecipeResult(final, results, steps, False, top)
        (on_stage_start or say)(f"stage {stage.number}/{len(steps)} {describe(stage.step)[len(str(stage.number)) + 2:]}")
        if not last:
            shutil.rmtree(stage_out, ignore_errors=True)  # a partial write of an earlier attempt
        result = adapt(config, resume=resume and (stage_run / "state").is_dir(), progress=progress, on_message=on_message,
                       stop_after_steps=None if stop_after_steps is None else stop_after_steps - done_steps,
                       max_steps=None if max_steps is None else max_steps - done_steps)
        results.append(result)
        written = json.loads((stage_out / CURVE_FILE).read_text()) if (stage_out / CURVE_FILE).is_file() else None
        if not written or written[-1]["step"] != result.steps:  # (an OUT left by an earlier run has its own curve)
            return RecipeResult(final, results, steps, False, top)  # stopped early, as a kill would
        done_steps += result.steps
        if on_stage_end is not None:
            on_stage_end(stage.step, result, stage_out)
        current = str(stage_out)
        stage_s.append(written[-1]["train_s"])
        plan = after_stage(index, plan, stage_s)  # (after the last stage: nothing left to re-plan)
    steps = plan.steps
    if keep_stages and not keep_state:  # the stage checkpoints stay, their training state goes
        for path in top.iterdir():
            if path.is_dir() and not (path / CURVE_FILE).is_file():
                shutil.rmtree(path)
            elif path.is_file():
                path.unlink()
    elif not keep_state:
        shutil.rmtree(top, ignore_errors=True)
    return RecipeResult(final, results, steps, True, top if top.exists() else None)


SINGLE_STAGE_FLAGS = {"objectives": "--objective", "local_schedule": "--local-schedule", "local_inputs": "--local-inputs"}


@dataclass
class AdaptRun:
    """What ``adapt_checkpoint`` did: ``result`` is the last stage's, with steps, tokens and time summed over stages."""

    result: AdaptResult
    stages: list[AdaptResult]
    finished: bool = True  # False: stopped at --max-steps, OUT not written (resume continues)


def _resume_hint(exc: BaseException, where: Path) -> None:
    exc.hint = (f"training state saved in {where}; run the same command with --resume to continue"
                if where.exists() else "no training state was saved yet; run the same command again to start over")


def adapt_checkpoint(
    checkpoint: str | Path,
    out: str | Path,
    *,
    shared: dict[str, Any] | None = None,
    single: dict[str, Any] | None = None,
    recipe: str | None = None,
    stages: list[str] | None = None,
    run_dir: str | Path | None = None,
    force: bool = False,
    keep_state: bool = False,
    resume: bool = False,
    device: str = "auto",
    dtype: str | None = None,
    progress=None,
    on_message: Callable[[str], None] | None = None,
    on_plan: Callable[[AdaptPlan], None] | None = None,
    on_stage_start: Callable[[str], None] | None = None,
    max_steps: int | None = None,
    budget: str | None = None,
) -> AdaptRun:
    """The pipeline behind ``ladderize adapt``: one stage (``single`` settings) or a recipe (``recipe``/``stages``).

    The run's plan (``plan.build_plan``) is built first, once: a single stage without ``lr`` takes the measured rate
    of its kind and the converted modes, and ``budget`` (``--budget``: ``30m`` wall time or ``20M`` tokens) sizes a
    recipe's stages (``budget.py``); ``on_plan(plan)`` shows it. An interrupt gets a hint on how to continue.
    ``max_steps`` stops after that many optimizer steps (over all stages) with a resumable state, as HF Trainer's
    ``max_steps`` for a smoke test, but keeps the budget's learning-rate schedule, so that ``resume`` continues it
    exactly.
    """
    from ..errors import Interrupted
    from ..checkpoint.placement import check_device, check_dtype

    shared = dict(shared or {})
    shared["device"] = check_device(device)  # every stage on it (placement.py); the joint stages through Accelerate
    if (dtype_name := check_dtype(dtype)) is not None:
        shared["dtype"] = dtype_name
    checkpoint, out = str(checkpoint), str(out)
    run_dir = str(run_dir) if run_dir else None
    top = AdaptConfig(checkpoint=checkpoint, out=out, run_dir=run_dir).resolved_run_dir()
    saved = None
    if resume and budget is not None and process_rank() == 0 and (top / PLAN_FILE).is_file():
        saved = json.loads((top / PLAN_FILE).read_text())
    plan = build_plan(checkpoint, shared=shared, single=single, recipe=recipe, stages=stages, budget=budget, saved=saved,
                      say=on_message or (lambda _m: None))
    if plan.single:
        config = plan.stages[0].config(checkpoint, out, run_dir=run_dir, force=force, keep_state=keep_state)
        if on_plan is not None:
            preflight(config)  # refused before the plan is shown, as a recipe's stages are
            on_plan(plan)
        try:
            result = adapt(config, resume=resume, progress=progress, on_message=on_message, max_steps=max_steps)
        except Interrupted as exc:
            _resume_hint(exc, config.resolved_run_dir() / "state")
            raise
        return AdaptRun(result, [result], not result.stopped_early)
    shown: list[AdaptPlan] = []

    def show(_steps: list[dict[str, Any]]) -> None:
        if on_plan is not None:
            on_plan(shown[0] if shown else plan)

    try:
        outcome = run_recipe(chosen_recipe(recipe, stages), checkpoint, out, run_dir=run_dir, force=force,
                             keep_state=keep_state, resume=resume, progress=progress, on_message=on_message,
                             on_plan=show, on_stage_start=on_stage_start, max_steps=max_steps, plan=plan)
    except Interrupted as exc:
        _resume_hint(exc, top)
        raise
    if not outcome.stages:  # --max-steps reached before this run's first stage (resumed past it)
        raise LadderizeError(f"--max-steps {max_steps}: the run in {top} is already past that step; resume without it")
    result = outcome.stages[-1]
    result.steps, result.tokens = sum(r.steps for r in outcome.stages), sum(r.tokens for r in outcome.stages)
    result.train_s = sum(r.train_s for r in outcome.stages)
    result.throughput = whole_run_pace(outcome.stages)
    if outcome.run_dir is not None:
        result.state_dir = outcome.run_dir
    return AdaptRun(result, outcome.stages, outcome.finished)


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


def chosen_recipe(recipe: str | Recipe | None, stages: list[str] | None) -> Recipe:
    """The stages named on the command line, else the recipe named (the default one without a name)."""
    if isinstance(recipe, Recipe):
        return recipe
    return Recipe("command line", [parse_stage(s) for s in stages]) if stages else load_recipe(recipe or DEFAULT_RECIPE)


def dry_run(
    checkpoint: str | Path,
    launch: str | None,
    *,
    shared: dict[str, Any] | None = None,
    single: dict[str, Any] | None = None,
    recipe: str | None = None,
    stages: list[str] | None = None,
    budget: str | None = None,
) -> AdaptPlan:
    """``ladderize adapt --dry-run``: the plan of this command priced for ``launch`` (``8xH100``; None: the launch
    this process runs under), from ``checkpoint``'s ``config.json`` alone: no weights, tokenizer or data read."""
    from .inputs import check_input_checkpoint

    check_input_checkpoint(checkpoint)  # converted layers to price
    return build_plan(checkpoint, shared=shared, single=single, recipe=recipe, stages=stages, budget=budget,
                      launch=launch, priced_only=True)


def _provenance_record(plan: AdaptPlan) -> dict[str, Any]:
    """What each stage's provenance keeps of the plan: the recipe's name, its stages, the budget's sizing, the launch
    and the expected time (the pricing in full stays in ``RUN/recipe.json``)."""
    record = {key: value for key, value in plan.record().items() if key not in ("recipe", "checkpoint", "cost")}
    return {"name": plan.recipe, **record}
