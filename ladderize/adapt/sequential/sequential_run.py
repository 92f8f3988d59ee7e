"""The sequential training as an adapt run: one layer at a time, each trained layer written out at once.

1. Layer sources (``layer_source.py``): by default ``StreamedLayers``, a weightless model of
   the student and of the teacher whose modules are read from their safetensors while in
   use. ``stream_layers=False``, or head grouping (which permutes heads of both models at
   once), loads both whole instead (``ResidentLayers``). The numbers are the same.
2. The calibration states entering the first converted layer: the teacher's embedding, then
   its layers below (frozen and shared with the student), one module at a time. States live
   in memory or in memory-mapped files in the run dir (``states="disk"``, ``state_store.py``).
3. For each layer from the first converted to the last: the teacher's layer gives the
   target states and is given back; the student's layer is trained if converted (and not
   finished before a resume; with ``closed_form`` its ``o_proj`` and ``down_proj`` are first refit
   by least squares, ``least_squares.py``), written to ``RUN/state/layer-NNNNN.safetensors`` at once,
   moves the student's states past it, and is given back.
4. OUT: assembled tensor by tensor from the checkpoint and the layer files
   (``output.write_streamed_output``), or saved from the model held whole.

Peak memory, streamed: one layer's weights, gradients and AdamW state (4 copies of a layer),
plus the states, plus one output shard at the end; the model's depth does not enter.

Device (``config.parallelism.device``, ``placement.resolve_device``): the layer in use, its gradients and
AdamW state are on the device, one layer at a time (read straight onto it when streamed, moved
there from the host copy when resident), at the training precision (``placement.training_precision``).
The calibration states are on the device too when ``sequential_schedule.state_copies`` of them fit in
``STATE_FRACTION`` of its free memory, else in pinned host memory (or on disk, ``states="disk"``),
copied over a chunk or a batch at a time. On CPU every copy is the tensor itself: the numbers
are the CPU run's bit for bit.

Data parallel (``accelerate launch`` / torchrun, ``WORLD_SIZE`` > 1): each process owns the sequences
whose index modulo the process count is its rank, computes and holds only their states (1/N of the
memory), and trains the same layer on the rows of each batch it owns (``--batch-size`` is the step's
batch); the losses are shares of the batch's and the gradients are summed (``layer_training.owned_rows``), so
the steps are one process's within fp32 rounding. The main process writes the layer files and OUT (the others
wait for OUT on the file system, not in a collective: ``process_group.written_by_main``); each
process writes the teacher's states of its own sequences (``teacher_states.write``), those of the rows a
later stage reads (``config.objective.teacher_state_rows``).

Resume: ``trainer_state.json`` names the last finished layer, and the window saved partway if any
(the stage's ``train/step_watch.StepWatch``, as a joint stage's: a minute in, then every ``save_minutes``, or every
``save_every`` steps, and at a held Ctrl-C or SIGTERM). After each finished window
every process keeps its states entering the next one (``states-rankNNNNN.safetensors``). A resumed run reads the
finished layers from their files and those states (where they are missing or of other sequences it recomputes them
through the finished layers), and trains the next
window from its start, or from its saved step with its saved weights and AdamW state: a layer's
training (and refit) is a pure function of its input states, its weights and (layer, seed), so the
result equals an uninterrupted run's bit for bit.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import torch

from ...checkpoint.atomic import atomic_file
from ...checkpoint.free_space import disk_full_as_one_line
from ...checkpoint.placement import LaunchRank, TrainingPrecision
from ...checkpoint.tensor_files import read_tensors, save_safetensors, tensor_names
from ...errors import LadderizeError
from ..train.compilation import compile_layers
from ..plan.compile_policy import COMPILING, resolve_compile
from ..plan.config import AdaptConfig, AdaptResult, PhaseProgress, StepInfo, local_inputs_of
from ..train.output import layer_tensors, write_output, write_streamed_output, written_marker
from ..process_group import barrier, on_every_process, written_by_main
from ..train.step_watch import StepWatch
from ..train.training_state import STATE_DIR, finish_state, read_trainer_state, write_trainer_state
from ...model.layout import format_layer_ranges
from ...progress import counted
from .layer_training import LayerProgress, StateCache, owned_rows, train_layer
from ..plan.sequential_schedule import layer_windows, state_copies, window_epochs, window_steps
from .least_squares import refit_output_projections
from .state_store import StateStore
from ..layers.layer_source import ResidentLayers, StreamedLayers, layer_file, same_prefix
from ...convert.teacher import check_teacher, load_teacher
from ..layers.teacher_states import ENTRY_FILE, FINAL_FILE, teacher_id, write as write_teacher_states

SAVED_LAYERS_KEPT = "the layers saved before it are kept, and --resume continues from them"
STATES_DIR = "calibration-states"  # under the run dir, for states="disk" (files unlinked once mapped)
STATE_FRACTION = 0.5  # of the device's free memory the states may take (the rest: the layer, AdamW, activations)


def state_store(config: AdaptConfig, device: torch.device, run_dir: Path, state_bytes: int) -> StateStore:
    """Where the calibration states live: on disk when asked, on ``device`` when they fit, else (pinned) host memory.

    ``state_bytes`` is one ``[N, S, D]`` state tensor's size.
    """
    if config.sequential.states == "disk":
        return StateStore(run_dir / STATES_DIR)
    if device.type != "cuda":
        return StateStore(device=device)
    free, _total = torch.cuda.mem_get_info(device)
    if state_copies(config.sequential.window) * state_bytes <= STATE_FRACTION * free:
        return StateStore(device=device)
    return StateStore(pin=True)


class _Stop(Exception):
    """Raised inside the sequential training when ``stop_after_steps`` is reached."""


def partial_file(state_dir: Path, step: int, index: int | None = None) -> Path:
    """Where the training saved at ``step`` partway through a window keeps layer ``index``'s weights (``None``: the
    window's AdamW state). The step in the name keeps a save from overwriting the files the trainer state names."""
    return state_dir / f"partial-{step:08d}-{'optimizer' if index is None else f'layer-{index:05d}'}.safetensors"


def kept_states_file(state_dir: Path, rank: int) -> Path:
    """Where process ``rank`` keeps the states of its sequences entering the next layer to train, for a resume."""
    return state_dir / f"states-rank{rank:05d}.safetensors"


def _keep_states(state_dir: Path, rank: int, cache: StateCache) -> None:
    """Write the states ``cache`` holds entering its current layer (``StateCache.kept_states``), atomically, replacing
    those of the layer before: a resume reads them in place of the teacher's and the student's passes up to here."""
    file = kept_states_file(state_dir, rank)
    with disk_full_as_one_line("the training state", file, SAVED_LAYERS_KEPT), atomic_file(file) as tmp:
        save_safetensors({name: tensor.cpu() for name, tensor in cache.kept_states().items()}, tmp,
                         metadata={"layer": str(cache.layer)})


def _read_kept_states(state_dir: Path, rank: int, layer: int, tokens: torch.Tensor) -> dict[str, torch.Tensor] | None:
    """The states kept entering ``layer`` for this process's sequences ``tokens`` (None where none were kept there,
    or they were of other sequences: the resume computes them again)."""
    from ...checkpoint.tensor_files import open_safetensors

    file = kept_states_file(state_dir, rank)
    if not file.is_file():
        return None
    with open_safetensors(file) as handle:
        if (handle.metadata() or {}).get("layer") != str(layer):
            return None
    kept = read_tensors(dict.fromkeys(tensor_names(file), file))
    return kept if torch.equal(kept.pop("input_ids"), tokens) else None


def _remove_partial(state_dir: Path, keep_step: int | None = None) -> None:
    """Remove the files of saves partway through a window, but those of ``keep_step``."""
    for file in state_dir.glob("partial-*.safetensors"):
        if keep_step is None or not file.name.startswith(f"partial-{keep_step:08d}-"):
            file.unlink(missing_ok=True)


def adapt_sequential(
    config: AdaptConfig,
    weights: dict[str, float],
    checkpoint: str,
    out: Path,
    *,
    resume: bool,
    progress: Callable | None,
    say: Callable[[str], None],
    stop_after_steps: int | None,
    on_phase: PhaseProgress | None = None,
    deadline: float | None = None,
) -> AdaptResult:
    """Run the sequential training on ``checkpoint`` (checked by ``stage_run.preflight``) and write ``out``; ``on_phase(what,
    done, total)`` follows the chunks of the states computed before a layer's steps (``StateCache.phase``);
    ``deadline`` (a wall budget's, ``time.perf_counter()``'s clock, the main process's deciding): the layers' steps
    fit in the time up to it (``StepWatch``'s deadline)."""
    from accelerate.utils import set_seed

    from ...checkpoint.io import load_model, load_tokenizer
    from ...checkpoint.placement import this_launch
    from ...corpus.windows import pack_tokens

    run_dir = config.resolved_run_dir()
    state_dir = run_dir / STATE_DIR
    device, precision = config.parallelism.placement()
    launch = this_launch()
    if launch.several:  # data parallel over the launcher's processes, each on its own device
        from .. import process_group

        device = process_group.start(device)
        if not launch.main:  # one voice: the main process says the plan, the data and the pace
            say = _silent
        batch = config.training.step_rows(launch.world)  # the batch, where it is smaller than the processes
        if batch < launch.world:
            say(f"the sequential step's batch ({batch}) is split over {launch.world} processes (each its own "
                f"sequences): at least {launch.world - batch} wait each step (a larger batch_size uses them)")
    if precision.autocast is torch.float16:
        raise LadderizeError("the sequential stage trains in float32 or bfloat16 (float16 needs loss scaling); use --dtype bfloat16")
    precision.apply()
    set_seed(config.training.seed)
    stream = config.sequential.stream_layers and not config.scope.head_grouping
    tokenizer = load_tokenizer(checkpoint, "adaptation")
    teacher_path = config.objective.teacher_for(checkpoint)
    if stream:
        student, teacher = StreamedLayers(checkpoint, device=device), StreamedLayers(teacher_path, device=device)
        check_teacher(teacher_path, teacher.model.config, student.model.config)
    else:
        student_model = load_model(checkpoint, dtype=torch.float32)
        teacher_model = load_teacher(teacher_path, student_model)
    data = pack_tokens(config.training.data, tokenizer, config.training.seq_len, max_tokens=config.training.tokens)
    say(f"data: {counted(int(data.shape[0]), 'sequence')} of {config.training.seq_len} tokens from {config.training.data}")
    calibration_rows = int(data.shape[0])
    held_out = _held_out_rows(config, tokenizer, data)
    if held_out is None:
        say("no text beyond the calibration set: each layer's loss before and after is measured on calibration rows")
    else:
        data = torch.cat([data, held_out])
    if not stream:
        if config.scope.head_grouping:
            from ...convert.head_grouping import group_heads_for_spd

            if config.sequential.stream_layers:
                say("head grouping needs the student and the teacher whole: the sequential training holds them in memory")
            student_model.to(device)  # the maps and block errors on the device, then back to host memory
            teacher_model.to(device)
            student_model, orders = group_heads_for_spd(student_model, teacher_model, data[: min(calibration_rows, 8)])
            student_model.to("cpu")
            teacher_model.to("cpu")
            say(f"head grouping: {orders}")
        student, teacher = ResidentLayers(student_model, device), ResidentLayers(teacher_model, device)
    if not same_prefix(student, teacher, min(student.model.layout.converted_layers)):
        raise LadderizeError("--local-schedule sequential needs the layers below the first converted one identical to the teacher's")
    if resolve_compile(config.parallelism.compile, device):
        compile_layers([*student.model.model.layers, *teacher.model.model.layers], device)
        say(COMPILING)

    hidden = student.model.config.hidden_size
    held = len(owned_rows(launch, int(data.shape[0])))  # the sequences whose states this process holds
    store = state_store(config, device, run_dir, held * data.shape[1] * hidden * torch.empty((), dtype=torch.float32).element_size())
    if device.type != "cpu":
        say(f"sequential on {device} ({precision.name}); states in {store.where}")
    keep = None
    kept = config.objective.teacher_state_rows
    rows_kept = int(data.shape[0]) if kept is None else min(kept, int(data.shape[0]))
    if config.objective.teacher_states and rows_kept > 0:  # for a later kd or lm stage of the recipe (teacher_states.py)
        first, kept = min(student.model.layout.converted_layers), teacher_id(teacher_path)
        mine = data[owned_rows(launch, int(data.shape[0]))][:len(owned_rows(launch, rows_kept))]  # this process's of the rows kept

        say(f"the teacher's states of {counted(rows_kept, 'sequence')} are kept for a later stage ({config.objective.teacher_states})")

        def keep(name: str, tensors: dict[str, torch.Tensor]) -> None:
            write_teacher_states(Path(config.objective.teacher_states), name, mine, tensors, kept, first, launch.rank, launch.world)
    try:
        run, finished = _train_layers(config, out, student, teacher, data, int(data.shape[0]) - calibration_rows, store,
                                      state_dir, resume, progress, say, stop_after_steps, device, precision, launch, keep, on_phase,
                                      deadline)
    finally:
        shutil.rmtree(run_dir / STATES_DIR, ignore_errors=True)
    run.calibration_tokens = calibration_rows * config.training.seq_len
    run.stopped_early = not finished
    if run.calibration_tokens != config.training.tokens:
        say(f"--tokens {config.training.tokens:,} is the calibration set: {counted(calibration_rows, 'whole sequence')} "
            f"of {config.training.seq_len} tokens = {run.calibration_tokens:,} tokens")

    def write() -> None:  # the main process writes OUT and settles the run dir; the others wait on the file system
        if finished:  # else stopped early, as a kill would
            if stream:
                write_streamed_output(student, tokenizer, checkpoint, teacher_path, config, weights, run, out)
            else:
                write_output(student.model, tokenizer, checkpoint, teacher_path, config, weights, run, out)
        run.state_dir = finish_state(run_dir, state_dir, config.saving.keep_state or not finished)

    written_by_main(written_marker(out), write)
    return run


def _held_out_rows(config: AdaptConfig, tokenizer, calibration: torch.Tensor) -> torch.Tensor | None:
    """Up to a batch of sequences of the data that follow the calibration set (the per-layer table's evaluation
    batch), or ``None`` when the data has no more text (or packs differently when asked for more)."""
    from ...corpus.windows import pack_tokens

    rows = calibration.shape[0]
    training = config.training
    more = pack_tokens(training.data, tokenizer, training.seq_len, max_tokens=rows * training.seq_len + training.tokens_per_step)
    if more.shape[0] <= rows or not torch.equal(more[:rows], calibration):
        return None
    return more[rows:]


def _train_layers(
    config: AdaptConfig, out: Path, student: ResidentLayers | StreamedLayers, teacher: ResidentLayers | StreamedLayers,
    data: torch.Tensor, held_out: int, store: StateStore, state_dir: Path, resume: bool, progress, say: Callable[[str], None],
    stop_after_steps: int | None, device: torch.device, precision: TrainingPrecision, launch: LaunchRank,
    keep: Callable[[str, dict[str, torch.Tensor]], None] | None = None, on_phase: PhaseProgress | None = None,
    deadline: float | None = None,
) -> tuple[AdaptResult, bool]:
    """Train the converted layers in order; each is saved as it finishes, and a resumed run continues after the last saved.

    ``keep(file, tensors)``: stores the teacher's states entering the first converted layer, and those entering its
    final norm once its last layer has run, of this process's sequences (``teacher_states.py``).

    ``data``'s last ``held_out`` rows only measure each layer's loss before and after (``StateCache.eval_rows``).
    A batch holds at most the whole calibration set: a set smaller than ``--batch-size`` trains every sequence
    once per step, not copies of it (and the token count says so).
    """
    converted = student.model.layout.converted_layers
    first, last = min(converted), max(converted)
    num_train = data.shape[0] - held_out
    batch_size = config.training.step_rows(num_train)
    if batch_size < config.training.batch_size:
        say(f"the calibration set ({counted(num_train, 'sequence')}) is smaller than --batch-size {config.training.batch_size}: "
            f"a step trains {counted(batch_size, 'sequence')}")
    windows = {window[0]: window for window in layer_windows(converted, config.sequential.window)}
    epochs = window_epochs(converted, config.sequential.epochs, config.sequential.epochs_ramp, config.sequential.window)
    per_window = window_steps(epochs, num_train, batch_size)
    total_steps = sum(per_window.values())
    tokens_per_step = batch_size * config.training.seq_len
    step, train_s, cpu_s, curve, done = 0, 0.0, 0.0, [], -1
    saved = read_trainer_state(state_dir, config) if resume and state_dir.is_dir() else None
    partial = None  # a window's training saved partway: {"layer", "steps", "losses", "before"} (train_layer's start)
    if saved is not None:
        step, train_s, cpu_s, curve, done = saved["step"], saved["train_s"], saved["cpu_s"], saved["curve"], saved["layer_done"]
        partial = saved.get("partial")
        per_window.update({int(start): count for start, count in saved.get("window_steps", {}).items()})
        total_steps = sum(per_window.values())
        needed = [layer_file(state_dir, i) for i in converted if i <= done]
        if partial is not None:
            needed += [partial_file(state_dir, step, i) for i in windows[partial["layer"]]] + [partial_file(state_dir, step)]
        for file in needed:
            if not file.is_file():
                raise LadderizeError(f"cannot resume {state_dir.parent}: {file.name} is missing; pass --force to start over")
        for index in (i for i in converted if i <= done):
            student.use_trained(index, layer_file(state_dir, index))
        if partial is not None:
            for index in windows[partial["layer"]]:
                student.use_trained(index, partial_file(state_dir, step, index))
            say(f"resumed at step {partial['steps']} of layer {partial['layer']} (step {step})")
        else:
            say(f"resumed after layer {done} (step {step})")
    else:
        if resume:
            say(f"nothing to resume in {state_dir.parent}; starting a new run")
        barrier()  # every process has read the state dir before the main one clears it
        if launch.main:
            shutil.rmtree(state_dir, ignore_errors=True)  # layer files of a run that never finished a layer, or of a forced restart
        barrier()
    resumed_from = step
    planned_windows = dict(per_window)  # this attempt's plan: a window the deadline shortened regrows up to it
    started, cpu_started = time.perf_counter() - train_s, time.process_time() - cpu_s
    inputs = local_inputs_of(config)
    watch = StepWatch(config, say, deadline, device)  # saves partway, signals and the deadline, as a joint stage's

    def save_partial(group: list[int], layers: list[torch.nn.Module], progress: LayerProgress) -> None:
        """Save the window's training partway: its layers, AdamW's state, then the trainer state that names them."""
        if launch.main:
            for i, layer in zip(group, layers):
                _save_tensors(partial_file(state_dir, step, i), layer_tensors(layer, i))
            _save_tensors(partial_file(state_dir, step), progress.optimizer)
            write_trainer_state(state_dir, config, {
                "step": step, "tokens": step * tokens_per_step, "train_s": time.perf_counter() - started,
                "cpu_s": time.process_time() - cpu_started, "curve": curve, "layer_done": group[0] - 1,
                "window_steps": {str(k): v for k, v in per_window.items()},
                "partial": {"layer": group[0], "steps": progress.steps, "losses": progress.losses, "before": progress.before}})
            _remove_partial(state_dir, keep_step=step)
        barrier()
        watch.saved()

    def stopping() -> bool:
        return stop_after_steps is not None and stop_after_steps <= step < total_steps

    attempt = {"first": None, "steps": step, "said": False}  # this attempt's clock, for the deadline

    def time_up() -> bool:
        if not watch.time_up():
            return False
        if not attempt["said"]:
            attempt["said"] = True
            say(f"budget: the sequential stage's time is up at step {step:,} (layer {cache.layer}): the layer in "
                "training stops here, and each layer left trains one step, to keep the budget")
        return True

    def fit_windows(start: int) -> None:
        """Fit the windows from ``start`` on, in proportion, to the time left before ``deadline`` at the pace this
        attempt's steps so far ran (every second since its first window's training began, the next windows' states
        and the layer files included): shortened where the stage runs behind, grown back up to their planned steps
        (``planned_windows``, never past them) where the later windows run faster than the first did."""
        nonlocal total_steps
        if watch.ends.at is None:
            return
        left = [w for w in windows if w >= start and w > done]
        if attempt["first"] is None:  # the pace is counted from the first window's training on (the states cached)
            attempt["first"] = time.perf_counter()
            attempt["steps"] = step
        if attempt["said"]:
            fitted = dict.fromkeys(left, 1)
        else:
            fitted = watch.ends.fitted({w: planned_windows[w] for w in left}, time.perf_counter() - attempt["first"],
                                 step - attempt["steps"])
        if fitted != {w: per_window[w] for w in left}:
            unit = 'window' if config.sequential.window > 1 else 'layer'
            now, then = sum(fitted.values()), sum(per_window[w] for w in left)
            if not attempt["said"] and now < then:
                say(f"budget: the sequential stage runs behind its plan: the {counted(len(left), unit)} "
                    f"left train {now:,} steps instead of {then:,}, to end by its planned time")
            elif not attempt["said"] and now > then:
                say(f"budget: the sequential stage runs faster now: the {counted(len(left), unit)} left train {now:,} "
                    f"steps instead of {then:,} (at most the {sum(planned_windows[w] for w in left):,} planned)")
            per_window.update(fitted)
            total_steps = sum(per_window.values())

    def record(info) -> None:
        nonlocal step
        step += 1
        elapsed = time.perf_counter() - started
        curve.append({"step": step, "tokens": step * tokens_per_step, "train_s": round(elapsed, 3),
                      "cpu_s": round(time.process_time() - cpu_started, 3), "lr": info.lr, "layer": info.layer,
                      "loss_local": info.loss, "loss_total": info.loss})
        if progress is not None and launch.main:
            losses = {"local": info.loss, "total": info.loss}
            progress(StepInfo(step, total_steps, step * tokens_per_step, total_steps * tokens_per_step, losses, info.lr,
                             elapsed, step * tokens_per_step / max(elapsed, 1e-9), info.layer), student.model)
        if stopping() and info.step_in_layer < info.steps_per_layer:
            raise _Stop  # as a kill would; a layer's last step is saved first (below)

    mine = data[owned_rows(launch, int(data.shape[0]))] if launch.several else data
    kept = _read_kept_states(state_dir, launch.rank, done + 1, mine) if done >= first else None
    kept = kept if on_every_process(kept is not None, device) else None  # every process reads, or every process computes
    how = (f"one {'layer' if config.sequential.window == 1 else 'window'} at a time from safetensors" if isinstance(student, StreamedLayers)
           else "student and teacher whole in memory")
    low, high = per_window[first], per_window[max(windows)]
    unit = "layer" if config.sequential.window == 1 else f"window of {counted(config.sequential.window, 'layer')}"
    steps = f"{counted(low, 'step')} per {unit}" if low == high else f"{low:,} steps at layer {first} to {high:,} at layer {max(windows)}"
    say(f"sequential: {counted(len(converted), 'layer')} ({format_layer_ranges(converted)}), {steps} ({how}, states in "
        f"{store.where})" + ("" if kept is not None else f"; caching the states entering layer {first}"))
    phase = on_phase if on_phase is not None and launch.main else None  # the states' chunks, from the first one
    cache = StateCache(teacher, data, first, store, device, precision, held_out=held_out, progress=phase, launch=launch,
                       kept=kept, at=done + 1)
    if kept is not None:
        say(f"the states entering layer {done + 1} are read from {state_dir}: no layer below it runs again")
    elif done >= first:  # a resumed run moves the states through its finished layers first: two passes each
        cache.phase(f"recomputing the states through the finished layers {format_layer_ranges(list(range(first, done + 1)))}",
                    2 * (done + 1 - first))
    if keep is not None and kept is None:  # (a resume that read its states wrote these in its first attempt)
        keep(ENTRY_FILE, {"residual": cache.teacher_state[0], "stale": cache.teacher_state[1]})
    try:
        index = cache.layer
        while index <= last:
            group = windows[index] if index in windows and index > done else [index]  # a resume ends at a window's end
            with contextlib.ExitStack() as stack:  # the teacher's layers are given back before the student's are read
                teacher_outs = cache.teacher_outputs([stack.enter_context(teacher.layer(i)) for i in group])
            if keep is not None and group[-1] == last:
                layers_total = teacher.model.config.num_hidden_layers
                keep(FINAL_FILE, {"final": cache.through_teacher(teacher_outs[-1], range(last + 1, layers_total))[0]})
            with contextlib.ExitStack() as stack:
                layers = [stack.enter_context(student.layer(i)) for i in group]
                stepping = stack.enter_context(contextlib.ExitStack())  # the window's steps, which hold a signal
                if group[0] in converted and group[0] > done:
                    cache.phase(None)
                    start = None  # the window's training saved partway (its layers hold the saved weights)
                    if partial is not None and partial["layer"] == group[0]:
                        tensors = read_tensors(dict.fromkeys(tensor_names(partial_file(state_dir, step)), partial_file(state_dir, step)))
                        start = LayerProgress(partial["steps"], partial["losses"], partial["before"], tensors)
                        partial = None
                    if config.sequential.closed_form and start is None:  # one layer per group (validate_config); refit before training
                        say(refit_output_projections(cache, layers[0], teacher_outs[0], local_inputs=inputs, batch_size=batch_size,
                                                     launch=launch).describe())
                    stepping.enter_context(watch.holding())  # a Ctrl-C saves at the step's end, or after the window
                    if start is None:
                        fit_windows(group[0])
                    fit = train_layer(cache, layers, teacher_outs, local_inputs=inputs, epochs=epochs[group[0]], batch_size=batch_size,
                                      lr=config.optimizer.lr, min_lr_ratio=config.optimizer.min_lr_ratio,
                                      warmup_steps=config.optimizer.warmup_steps,
                                      max_grad_norm=config.optimizer.max_grad_norm, seed=config.training.seed, progress=record, launch=launch,
                                      start=start, save=lambda progress, group=group, layers=layers: save_partial(group, layers, progress),
                                      save_due=lambda: watch.after_step(step), steps=per_window[group[0]],
                                      time_up=time_up)
                    if len(fit.losses) != per_window[group[0]]:  # stopped by the deadline (time_up)
                        per_window[group[0]] = len(fit.losses)
                        total_steps = sum(per_window.values())
                    curve[-1].update(eval_before=fit.before, eval_after=fit.after, eval_held_out=fit.held_out)
                    if launch.main:
                        for i, layer in zip(group, layers):
                            _save_layer(state_dir, i, layer)
                        write_trainer_state(state_dir, config, {
                            "step": step, "tokens": step * tokens_per_step, "train_s": time.perf_counter() - started,
                            "cpu_s": time.process_time() - cpu_started, "curve": curve, "layer_done": group[-1],
                            "window_steps": {str(k): v for k, v in per_window.items()}})
                        _remove_partial(state_dir)
                    barrier()  # the layers' files are written before any process reads them
                    watch.saved()
                    for i in group:
                        student.use_trained(i, layer_file(state_dir, i))
                    if stopping():
                        raise _Stop
                stepping.close()  # a signal the steps held stops the run here, the window saved; the states' advance hears one at once
                for i, layer, teacher_out in zip(group, layers, teacher_outs):
                    if i < last:
                        cache.advance(layer, teacher_out)
                if group[-1] < last:
                    _keep_states(state_dir, launch.rank, cache)
            del teacher_outs
            index = group[-1] + 1
    except _Stop:
        watch.close()  # every process stops at this step: the vote in flight is finished, as the joint loop's
        return AdaptResult(out, step, step * tokens_per_step, time.perf_counter() - started, curve, resumed_from), False
    kept_states_file(state_dir, launch.rank).unlink(missing_ok=True)  # the stage is done: no resume reads them
    train_s = time.perf_counter() - started
    pace = _pace(student.model.config, windows, per_window, launch.world, device)
    return AdaptResult(out, step, step * tokens_per_step, train_s, curve, resumed_from,
                       throughput=pace.record(step * tokens_per_step, train_s)), True


def _pace(model_config, windows: dict[int, list[int]], per_window: dict[int, int], processes: int, device):
    """The stage's pace by its model FLOPs: a step of a window trains its layers forward and backward on the step's
    tokens, 6 x the window's parameters per token, averaged over the steps each window ran. The teacher's pass that
    caches the states and each layer's advance of them are not counted, so the MFU is that of the training alone."""
    from ..plan.cost import layer_parameters
    from ..plan.throughput import Throughput, peak_flops_per_s

    steps = sum(per_window.values())
    layers_per_step = sum(count * len(windows[start]) for start, count in per_window.items()) / max(1, steps)
    return Throughput(processes, round(6 * layer_parameters(model_config) * layers_per_step), peak_flops_per_s(device))


def _save_layer(state_dir: Path, index: int, layer: torch.nn.Module) -> None:
    """Write the trained layer's tensors (checkpoint names) to its file, atomically."""
    _save_tensors(layer_file(state_dir, index), layer_tensors(layer, index))


def _save_tensors(file: Path, tensors: dict[str, torch.Tensor]) -> None:
    """Write ``tensors`` (host copies) to a safetensors ``file``, atomically."""
    file.parent.mkdir(parents=True, exist_ok=True)
    with disk_full_as_one_line("the training state", file, SAVED_LAYERS_KEPT), atomic_file(file) as tmp:
        save_safetensors({name: tensor.cpu() for name, tensor in tensors.items()}, tmp)


def _silent(_message: str) -> None:
    """What a process other than the main one says: nothing."""
