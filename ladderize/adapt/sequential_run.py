"""The sequential schedule as an adapt run: one layer at a time, each trained layer written out at once.

1. Layer sources (``layer_source.py``): by default ``StreamedLayers``, a weightless model of
   the student and of the teacher whose modules are read from their safetensors while in
   use. ``stream_layers=False``, or head grouping (which permutes heads of both models at
   once), loads both whole instead (``ResidentLayers``). The numbers are the same.
2. The calibration states entering the first converted layer: the teacher's embedding, then
   its layers below (frozen and shared with the student), one module at a time. States live
   in memory or in memory-mapped files in the run dir (``states="disk"``, ``state_store.py``).
3. For each layer from the first converted to the last: the teacher's layer gives the
   target states and is given back; the student's layer is trained if converted (and not
   finished before a resume), written to ``RUN/state/layer-NNNNN.safetensors`` at once,
   moves the student's states past it, and is given back.
4. OUT: assembled tensor by tensor from the checkpoint and the layer files
   (``output.write_streamed_output``), or saved from the model held whole.

Peak memory, streamed: one layer's weights, gradients and AdamW state (4 copies of a layer),
plus the states, plus one output shard at the end; the model's depth does not enter.

Resume: ``trainer_state.json`` names the last finished layer. A resumed run reads the
finished layers from their files, recomputes the states through them, and trains the next
layer from its start: a layer's training is a pure function of its input states, its
weights and (layer, seed), so the result equals an uninterrupted run's bit for bit.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import torch

from ..model.shards import save_safetensors
from ..errors import LadderizeError
from .config import AdaptConfig, AdaptResult, StepInfo, local_inputs_of
from .output import layer_tensors, write_output, write_streamed_output
from .run_dir import STATE_DIR, finish_state, read_trainer_state, write_trainer_state
from .layer_training import StateCache, steps_per_layer, train_layer
from .state_store import StateStore
from .layer_source import ResidentLayers, StreamedLayers, same_prefix
from .teacher import check_teacher, load_teacher, resolve_teacher

STATES_DIR = "calibration-states"  # under the run dir, for states="disk" (files unlinked once mapped)


class _Stop(Exception):
    """Raised inside the sequential schedule when ``stop_after_steps`` is reached."""


def layer_file(state_dir: Path, index: int) -> Path:
    """Where finished layer ``index`` is written."""
    return state_dir / f"layer-{index:05d}.safetensors"


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
) -> AdaptResult:
    """Run the sequential local schedule on ``checkpoint`` (checked by ``run.adapt``) and write ``out``."""
    from accelerate.utils import set_seed

    from ..model.checkpoint import load_model, load_tokenizer
    from .data import pack_tokens

    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise LadderizeError("--local-schedule sequential runs in one process; use the joint schedule under accelerate launch")
    run_dir = config.resolved_run_dir()
    state_dir = run_dir / STATE_DIR
    set_seed(config.seed)
    stream = config.stream_layers and not config.head_grouping
    tokenizer = load_tokenizer(checkpoint, "adaptation")
    teacher_path = resolve_teacher(checkpoint, config.teacher)
    if stream:
        student, teacher = StreamedLayers(checkpoint), StreamedLayers(teacher_path)
        check_teacher(teacher_path, teacher.model.config, student.model.config)
    else:
        student_model = load_model(checkpoint, dtype=torch.float32)
        teacher_model = load_teacher(teacher_path, student_model)
    data = pack_tokens(config.data, tokenizer, config.seq_len, max_tokens=config.tokens)
    say(f"data: {data.shape[0]:,} sequences of {config.seq_len} tokens from {config.data}")
    if not stream:
        if config.head_grouping:
            from .head_grouping import group_heads_for_spd

            if config.stream_layers:
                say("head grouping needs the student and the teacher whole: the sequential schedule holds them in memory")
            student_model, orders = group_heads_for_spd(student_model, teacher_model, data[: min(len(data), 8)])
            say(f"head grouping: {orders}")
        student, teacher = ResidentLayers(student_model), ResidentLayers(teacher_model)
    if not same_prefix(student, teacher, min(student.model.layout.converted_layers)):
        raise LadderizeError("--local-schedule sequential needs the layers below the first converted one identical to the teacher's")

    store = StateStore(run_dir / STATES_DIR if config.states == "disk" else None)
    try:
        run, finished = _train_layers(config, out, student, teacher, data, store, state_dir, resume, progress, say, stop_after_steps)
    finally:
        shutil.rmtree(run_dir / STATES_DIR, ignore_errors=True)
    run.calibration_tokens = int(data.numel())
    if run.calibration_tokens != config.tokens:
        say(f"--tokens {config.tokens:,} is the calibration set: {data.shape[0]} whole sequence(s) of {config.seq_len} tokens "
            f"= {run.calibration_tokens:,} tokens")
    if finished:  # else stopped early, as a kill would
        if stream:
            write_streamed_output(student, tokenizer, checkpoint, teacher_path, config, weights, run, out)
        else:
            write_output(student.model, tokenizer, checkpoint, teacher_path, config, weights, run, out)
    run.state_dir = finish_state(run_dir, state_dir, config.keep_state or not finished)
    return run


def _train_layers(
    config: AdaptConfig, out: Path, student: ResidentLayers | StreamedLayers, teacher: ResidentLayers | StreamedLayers,
    data: torch.Tensor, store: StateStore, state_dir: Path, resume: bool, progress, say: Callable[[str], None],
    stop_after_steps: int | None,
) -> tuple[AdaptResult, bool]:
    """Train the converted layers in order; each is saved as it finishes, and a resumed run continues after the last saved."""
    converted = student.model.layout.converted_layers
    first, last = min(converted), max(converted)
    per_layer = steps_per_layer(data.shape[0], config.epochs, config.batch_size)
    total_steps = per_layer * len(converted)
    tokens_per_step = config.batch_size * config.seq_len
    step, train_s, cpu_s, curve, done = 0, 0.0, 0.0, [], -1
    saved = read_trainer_state(state_dir, config) if resume and state_dir.is_dir() else None
    if saved is not None:
        step, train_s, cpu_s, curve, done = saved["step"], saved["train_s"], saved["cpu_s"], saved["curve"], saved["layer_done"]
        for index in (i for i in converted if i <= done):
            if not layer_file(state_dir, index).is_file():
                raise LadderizeError(f"cannot resume {state_dir.parent}: {layer_file(state_dir, index).name} is missing; pass --force to start over")
            student.use_trained(index, layer_file(state_dir, index))
        say(f"resumed after layer {done} (step {step})")
    else:
        if resume:
            say(f"nothing to resume in {state_dir.parent}; starting a new run")
        shutil.rmtree(state_dir, ignore_errors=True)  # layer files of a run that never finished a layer, or of a forced restart
    resumed_from = step
    started, cpu_started = time.perf_counter() - train_s, time.process_time() - cpu_s
    inputs = local_inputs_of(config)

    def stopping() -> bool:
        return stop_after_steps is not None and stop_after_steps <= step < total_steps

    def record(info) -> None:
        nonlocal step
        step += 1
        elapsed = time.perf_counter() - started
        curve.append({"step": step, "tokens": step * tokens_per_step, "train_s": round(elapsed, 3),
                      "cpu_s": round(time.process_time() - cpu_started, 3), "lr": info.lr, "layer": info.layer,
                      "loss_local": info.loss, "loss_total": info.loss})
        if progress is not None:
            losses = {"local": info.loss, "total": info.loss}
            progress(StepInfo(step, total_steps, step * tokens_per_step, total_steps * tokens_per_step, losses, info.lr,
                             elapsed, step * tokens_per_step / max(elapsed, 1e-9), info.layer), student.model)
        if stopping() and info.step_in_layer < info.steps_per_layer:
            raise _Stop  # as a kill would; a layer's last step is saved first (below)

    how = "one layer at a time from safetensors" if isinstance(student, StreamedLayers) else "student and teacher whole in memory"
    say(f"sequential: layers {', '.join(map(str, converted))}, {per_layer} steps each ({how}, states in "
        f"{'memory-mapped files' if store.on_disk else 'memory'}); caching the states entering layer {first}")
    cache = StateCache(teacher, data, first, store)
    try:
        for index in range(first, last + 1):
            with teacher.layer(index) as teacher_layer:
                teacher_out = cache.teacher_output(teacher_layer)
            with student.layer(index) as layer:
                if index in converted and index > done:
                    train_layer(cache, layer, teacher_out, local_inputs=inputs, epochs=config.epochs, batch_size=config.batch_size,
                                lr=config.lr, min_lr_ratio=config.min_lr_ratio, warmup_steps=config.warmup_steps,
                                max_grad_norm=config.max_grad_norm, seed=config.seed, progress=record,
                                autocast=torch.bfloat16 if config.mixed_precision == "bf16" else None)
                    _save_layer(state_dir, index, layer)
                    student.use_trained(index, layer_file(state_dir, index))
                    write_trainer_state(state_dir, config, {
                        "step": step, "tokens": step * tokens_per_step, "train_s": time.perf_counter() - started,
                        "cpu_s": time.process_time() - cpu_started, "curve": curve, "layer_done": index})
                    if stopping():
                        raise _Stop
                if index < last:
                    cache.advance(layer, teacher_out)
            del teacher_out
    except _Stop:
        return AdaptResult(out, step, step * tokens_per_step, time.perf_counter() - started, curve, resumed_from), False
    return AdaptResult(out, step, step * tokens_per_step, time.perf_counter() - started, curve, resumed_from), True


def _save_layer(state_dir: Path, index: int, layer: torch.nn.Module) -> None:
    """Write the trained layer's tensors (checkpoint names) to its file, atomically."""
    state_dir.mkdir(parents=True, exist_ok=True)
    file = layer_file(state_dir, index)
    tmp = file.with_name(f".{file.name}.tmp")
    save_safetensors(layer_tensors(layer, index), tmp)
    os.replace(tmp, file)
