"""``adapt``: one stage of a run, its settings and paths checked (``preflight``), then trained: a joint stage by
``train/trainer.py``'s one loop, the sequential stage by ``sequential/sequential_run.py``.

Files written:

- ``RUN_DIR/state/``: the latest training state, ``trainer_state.json`` (step, tokens,
  curve) plus what the training needs to continue exactly (``train/training_state.py``);
- ``RUN_DIR/curve.json`` and, at the end, ``OUT/adapt_curve.json``: the loss curve (a recipe's: every stage's,
  ``train/output.run_curve``);
- ``OUT``: the adapted model in the converted format (LoRA merged), with its provenance
  extended by an ``adapt`` record.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..errors import LadderizeError
from ..model import LadderLlamaForCausalLM
from ..checkpoint.placement import tf32_restored
from .plan.config import AdaptConfig, AdaptResult, PhaseProgress, StepInfo, needs_teacher, validate_config
from .train.training_state import STATE_DIR, record_unsaved


def adapt(
    config: AdaptConfig,
    *,
    resume: bool = False,
    progress: Callable[[StepInfo, LadderLlamaForCausalLM], None] | None = None,
    on_message: Callable[[str], None] | None = None,
    stop_after_steps: int | None = None,
    max_steps: int | None = None,
    on_phase: PhaseProgress | None = None,
    deadline: float | None = None,
    checked: bool = False,
) -> AdaptResult:
    """Adapt the converted layers of ``config.scope.checkpoint`` and write the result to ``config.saving.out``.

    ``progress(info, model)`` runs after every optimizer step on the main process (its time is
    not counted as training time; under the streamed sequential training ``model`` holds the
    weights of the layer in training only). ``stop_after_steps`` ends the run early without
    writing OUT, as a kill would (for tests of ``resume``). ``max_steps`` (``--max-steps``) ends it there too, with the
    state of that step saved (the joint training; the sequential one keeps its finished layers), so that
    ``resume`` continues the whole budget from it: a smoke test or a dry run of a long run. ``on_phase(what, done,
    total)`` follows a long phase before the steps, from its start (the sequential stage's caching of states).
    ``deadline`` (``time.perf_counter()``'s clock; a wall budget's stage): the training ends by then, the sequential
    stage's layers shortened to fit it on one process and a joint stage stopped at it, under a launcher by the main
    process's clock (``budget.py``, "keeping the time"). ``checked``: the caller ran ``preflight`` on this stage
    already (a recipe checks every stage before the first trains), so only its input checkpoint is checked here
    (``check_input``: a later stage's input is written by the stage before it).
    """
    say = on_message or (lambda _m: None)
    if checked:
        from .objectives.registry import parse_objectives

        check_input(config.scope.checkpoint)
        weights = parse_objectives(config.objective.objectives)
    else:
        weights = preflight(config)
    out = Path(config.saving.out).expanduser().absolute()
    checkpoint = str(Path(config.scope.checkpoint).expanduser())
    run_dir = config.resolved_run_dir()
    if (run_dir / STATE_DIR).exists() and not resume and not config.saving.force:
        raise LadderizeError(f"{run_dir} holds an earlier run; pass --resume to continue it or --force to start over")
    if max_steps is not None:
        stop_after_steps = max_steps if stop_after_steps is None else min(stop_after_steps, max_steps)
    trained: list[float] = []  # the training time of the last progress report (the main process's)

    def report(info: StepInfo, model: LadderLlamaForCausalLM) -> None:
        trained[:] = [info.train_s]
        if progress is not None:
            progress(info, model)

    run = dict(resume=resume, progress=report, say=say, stop_after_steps=stop_after_steps)
    try:
        with tf32_restored():  # a stage sets the TF32 switches of its training precision; what follows gets them back
            if config.sequential.local_schedule == "sequential":
                from .sequential.sequential_run import adapt_sequential

                return adapt_sequential(config, weights, checkpoint, out, **run, on_phase=on_phase, deadline=deadline)
            from .train.trainer import train_joint

            return train_joint(config, weights, checkpoint, out, **run, save_at_stop=max_steps is not None,
                               deadline=deadline)
    except BaseException:  # Ctrl-C, SIGTERM or an error: the time past the saved state counts on the resume
        if trained:
            record_unsaved(run_dir / STATE_DIR, trained[0])
        raise


def preflight(config: AdaptConfig, checkpoint: str | None = None) -> dict[str, float]:
    """Everything a run can be refused for, checked before it writes anything (its run dir included).

    The settings (``validate_config``, ``--mixed-precision``), OUT, the data, and the input checkpoint
    (``checkpoint``, default ``config.scope.checkpoint``; a recipe passes its first input for every stage, since
    later stages read a checkpoint not written yet): that it exists, has converted layers and a tokenizer
    (``check_input``), and that the teacher the training needs resolves from it. Returns the objective weights.
    """
    from ..corpus.token_store import check_data
    from .plan.inputs import resolve_teacher

    weights = validate_config(config)
    if config.sequential.local_schedule != "sequential":
        from ..checkpoint.placement import this_launch
        from .plan.strategy_choice import choose_strategy

        choose_strategy(config, this_launch().world)  # a setting --shard fsdp cannot take, refused here
    out = Path(config.saving.out).expanduser().absolute()
    if out.exists() and not config.saving.force:
        raise LadderizeError(f"output {out} already exists; pass --force to replace it")
    source = str(Path(checkpoint or config.scope.checkpoint).expanduser())
    tokenizer = check_input(source)
    if needs_teacher(config, weights):
        resolve_teacher(source, config.objective.teacher)
    check_data(config.training.data, tokenizer)
    return weights


def check_input(checkpoint: str | Path):
    """The input checkpoint of a run: it exists, has converted layers and a tokenizer (one line otherwise); returns
    the tokenizer."""
    from ..checkpoint.io import load_tokenizer
    from .plan.inputs import check_input_checkpoint

    check_input_checkpoint(checkpoint)
    return load_tokenizer(str(Path(checkpoint).expanduser()), "adaptation")
