"""The joint training, built on Accelerate: every trained parameter updated at every step, checkpoints and exact resume.

One process on CPU by default; under a launcher the same code runs DDP (the replicated strategy,
``strategy.choose_strategy``; sharding is ``sharded.py``'s, an Accelerate FSDP config included:
``accelerate_config``) with mixed precision, gradient accumulation and activation checkpointing. ``--batch-size`` is
the global batch of an optimizer step; each process reads its rows of it from a deterministic batch order (a pure
function of the step and the seed, ``batches.StepSplit``), so a resumed run replays exactly the batches an
uninterrupted run would have seen, and a step trains the same sequences on any process count. The training state is
saved every ``save_every`` optimizer steps (``run_dir.save_accelerate_state``). Losses stay on
the device and are read when logged (``loss_log``: every 10 steps on CUDA, every step on a CPU).
"""

from __future__ import annotations

import math
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import torch

from ..errors import LadderizeError, holding_interrupts
from ..model import LadderLlamaForCausalLM
from ..progress import counted
from ..corpus.windows import token_windows
from ..corpus.token_store import build_reporter, is_store
from ..convert.teacher import load_teacher, resolve_teacher
from .compilation import COMPILING, adamw, compile_layers, recompute_activations, resolve_compile
from .config import AdaptConfig, AdaptResult, StepInfo, local_inputs_of, needs_teacher
from .batches import StepSplit
from .cost import FlopCount
from .throughput import Throughput, peak_flops_per_s, plan_line
from .interpolation import toward_start
from .weight_ema import WeightEMA
from .lora import ADAPTER_DIR, LoraSpec, add_lora, merge_lora, save_adapter
from .loss_log import PendingLosses, TrainingLog, log_every as log_interval
from .lr_curve import warmup_cosine
from .objectives import STORED_TEACHER_OBJECTIVES, AdaptLoss
from .output import write_output
from .training_state import DCP_DIR, STATE_DIR, SaveClock, finish_state, read_trainer_state, save_accelerate_state
from .layer_source import ResidentLayers, same_prefix
from .teacher_states import read as read_teacher_states, teacher_id


def select_trainable(model: LadderLlamaForCausalLM, scope: str, spec: LoraSpec) -> list[torch.nn.Parameter]:
    """Freeze the model except the parameters ``scope`` trains; return those."""
    converted = model.layout.converted_layers
    if scope == "all":
        model.requires_grad_(True)
        return [p for p in model.parameters()]
    if not converted:
        raise LadderizeError(f"the checkpoint has no converted layers; --train {scope} has nothing to train (use --train all)")
    if scope == "lora":
        return add_lora(model, converted, spec)[1]
    model.requires_grad_(False)
    params = []
    for index in converted:
        for param in model.model.layers[index].parameters():
            param.requires_grad_(True)
            params.append(param)
    return params


def _prefix_shared(student: LadderLlamaForCausalLM, teacher: LadderLlamaForCausalLM | None, scope: str) -> bool:
    """Whether the layers below the first converted one are frozen and identical in student and teacher."""
    if teacher is None or scope == "all" or not student.layout.converted_layers:
        return False
    return same_prefix(ResidentLayers(student), ResidentLayers(teacher), min(student.layout.converted_layers))


def adapt_joint(
    config: AdaptConfig,
    weights: dict[str, float],
    checkpoint: str,
    out: Path,
    *,
    resume: bool,
    progress: Callable[[StepInfo, LadderLlamaForCausalLM], None] | None,
    say: Callable[[str], None],
    stop_after_steps: int | None,
    save_at_stop: bool = False,
    deadline: float | None = None,
) -> AdaptResult:
    """Run the joint training on ``checkpoint`` (checked by ``run.adapt``) and write ``out``.

    ``deadline`` (``time.perf_counter()``'s clock, one process): a wall budget's stage stops at the first step that
    ends past it, says so, and writes OUT from there.

    ``stop_after_steps`` ends the run there as a kill would; ``save_at_stop`` (``--max-steps``) saves the state
    of that step first, so that ``--resume`` continues from it."""
    from accelerate import Accelerator
    from accelerate.utils import DistributedDataParallelKwargs, set_seed

    from ..checkpoint.io import load_model, load_tokenizer

    from ..checkpoint.placement import resolve_device, training_precision

    run_dir = config.resolved_run_dir()
    state_dir = run_dir / STATE_DIR
    device = resolve_device(config.device)  # under accelerate launch the Accelerator's device wins (below)
    if _launched():  # the one process group, on this process's device, before Accelerate looks for one
        from . import process_group

        device = process_group.start(device)
    elif device.type == "cuda" and device.index is not None:
        torch.cuda.set_device(device)  # Accelerate's single-process device is the current CUDA device
    precision = training_precision(config.dtype, device, config.mixed_precision)
    precision.apply()
    _fresh_single_process_state(precision.mixed_precision, cpu=device.type == "cpu")
    if os.environ.get("ACCELERATE_USE_FSDP", "").lower() in {"true", "1", "yes"}:
        raise LadderizeError("an Accelerate FSDP config runs the sharded training (--shard fsdp; "
                             "adapt/accelerate_config.py), not this replicated one: launch it without the FSDP config")
    # training every parameter with only the local objective leaves the unconverted layers unused
    unused = config.train == "all" and not ({"lm", "kd"} & set(weights))
    accelerator = Accelerator(
        kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=unused)],
        gradient_accumulation_steps=config.grad_accum,
        mixed_precision=precision.mixed_precision,
        cpu=device.type == "cpu",  # --device cpu, or a CPU-only machine: torchrun / accelerate launch then give gloo DDP
    )
    set_seed(config.seed)

    student = load_model(checkpoint, dtype=torch.float32)
    tokenizer = load_tokenizer(checkpoint, "adaptation")
    with_teacher = needs_teacher(config, weights)
    teacher_path = resolve_teacher(checkpoint, config.teacher) if with_teacher else config.teacher
    teacher = load_teacher(teacher_path, student) if with_teacher else None

    world = accelerator.num_processes
    if not accelerator.is_main_process:  # one voice: the main process says the plan, the data and the pace
        say = _silent
    split = StepSplit(config.batch_size, world, config.grad_accum)
    sequences_per_step = config.batch_size
    tokens_per_step = sequences_per_step * config.seq_len
    total_steps = max(1, math.ceil(config.tokens / tokens_per_step))
    if total_steps * tokens_per_step != config.tokens:
        say(f"--tokens {config.tokens:,} rounds up to {total_steps * tokens_per_step:,}: a step trains {sequences_per_step} "
            f"sequence(s) x {config.seq_len} tokens (--batch-size x --seq-len)")
    say(plan_line(total_steps * tokens_per_step, total_steps, split, config.seq_len))
    data = token_windows(config.data, tokenizer, config.seq_len, max_tokens=total_steps * tokens_per_step,
                         progress=build_reporter(say, config.data), say=say)
    where = data.stores[0].path.parent if len(data.stores) > 1 else data.stores[0].path
    stored = "" if is_store(config.data) else f" (token store {where})"
    say(f"data: {counted(len(data), 'sequence')} of {config.seq_len} tokens from {config.data}{stored}")
    if len(data) < sequences_per_step:
        say(f"the data holds fewer sequences than a step trains ({sequences_per_step}): every step repeats them, "
            f"so the {total_steps * tokens_per_step:,} tokens trained count {counted(len(data) * config.seq_len, 'distinct token')}")

    if config.head_grouping:  # before ``prepare``, on the Accelerator's device
        from ..convert.head_grouping import group_heads_for_spd

        student.to(accelerator.device)
        teacher.to(accelerator.device)
        student, orders = group_heads_for_spd(student, teacher, data.head(8))
        say(f"head grouping: {orders}")

    spec = LoraSpec(rank=config.lora_rank, alpha=config.lora_alpha)
    peft_model = None
    if config.train == "lora":  # peft wraps the target linears of ``student`` in place
        peft_model, params = add_lora(student, student.layout.converted_layers, spec, base=checkpoint)
    else:
        params = select_trainable(student, config.train, spec)
    share_prefix = _prefix_shared(student, teacher, config.train)
    flops = FlopCount.for_stage(student.config, student.layout.converted_layers or list(range(student.config.num_hidden_layers)),
                                weights, share_prefix=share_prefix, scope=config.train)
    pace = Throughput(world, flops.per_token, peak_flops_per_s(accelerator.device))
    compiled = resolve_compile(config.compile, accelerator.device)
    if compiled:
        compile_layers([*student.model.layers, *(teacher.model.layers if teacher is not None else [])], accelerator.device)
        say(COMPILING)
    loss_module = AdaptLoss(student, teacher, weights, local_inputs_of(config), config.kd_temperature, share_prefix,
                            config.kd_divergence, config.kd_top_k, compiled)
    if config.activation_checkpointing:  # the trained layers' activations recomputed in the backward
        recompute_activations(student)
    if teacher is not None:
        teacher.to(accelerator.device)
    stored = None
    if config.teacher_states and share_prefix and set(weights) <= STORED_TEACHER_OBJECTIVES:  # teacher_states.py
        stored, found = read_teacher_states(Path(config.teacher_states), len(data), data.head, teacher_id(teacher_path),
                                            loss_module.first)
        if found:
            say(found)

    optimizer = adamw(params, lr=config.lr, weight_decay=config.weight_decay, betas=(0.9, 0.95))
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, warmup_cosine(total_steps, config.warmup_steps, config.min_lr_ratio)
    )
    loss_module, optimizer = accelerator.prepare(loss_module, optimizer)
    accelerator.register_for_checkpointing(scheduler)
    ema = WeightEMA(params, config.ema) if config.ema else None  # from the weights training starts from
    keep_ema = ema.save if ema is not None else None

    step, tokens_done, train_s, cpu_s, curve, resumed_from = 0, 0, 0.0, 0.0, [], 0
    saved = read_trainer_state(state_dir, config) if resume and state_dir.is_dir() else None
    if saved is not None and (state_dir / DCP_DIR).is_dir():
        raise LadderizeError(f"cannot resume {run_dir}: its state was saved sharded (FSDP2); resume it under the "
                             "launcher it ran under, or with --shard fsdp (or --force to start over)")
    if saved is not None:
        accelerator.load_state(str(state_dir))
        if ema is not None:
            ema.load(state_dir)
        step, tokens_done, train_s, curve = saved["step"], saved["tokens"], saved["train_s"], saved["curve"]
        cpu_s = saved.get("cpu_s", 0.0)
        resumed_from = step
        say(f"resumed from step {step} ({tokens_done} tokens)")
    elif resume:
        say(f"nothing to resume in {run_dir}; starting a new run")

    model = accelerator.unwrap_model(loss_module).student
    loss_module.train()
    rank = accelerator.process_index
    saved_step, clock = step, SaveClock(config, say)
    log_every = log_interval(accelerator.device)
    pending = PendingLosses((lambda t: accelerator.reduce(t, reduction="mean")) if world > 1 else None)
    log = TrainingLog(pending, curve, train_s=train_s, total_steps=total_steps, tokens_per_step=tokens_per_step,
                      pace=pace, say=say, report=(lambda info: progress(info, model))
                      if accelerator.is_main_process and progress is not None else None)
    with holding_interrupts():  # a Ctrl-C or SIGTERM saves the state at its step's end, then stops (SaveClock)
        while step < total_steps:
            if stop_after_steps is not None and step >= stop_after_steps:
                pending.flush(curve)
                if save_at_stop and saved_step != step:
                    save_accelerate_state(accelerator, state_dir, config, step, tokens_done, train_s, cpu_s, curve, keep_ema)
                return AdaptResult(out, step, tokens_done, train_s, curve, resumed_from, state_dir=state_dir if state_dir.exists() else None,
                                   stopped_early=True, throughput=pace.record(tokens_done, train_s))
            started, cpu_started = time.perf_counter(), time.process_time()
            sums: dict[str, torch.Tensor] = {}
            for micro in range(config.grad_accum):
                rows, weight = split.rows(len(data), step, micro, rank, config.seed)
                batch = data.rows(rows).to(accelerator.device)
                kept = stored.rows(rows, accelerator.device) if stored is not None else None
                with accelerator.accumulate(loss_module):
                    losses = loss_module(batch, kept)
                    if weight != 1:  # an uneven part: its share of the global batch's mean (batches.StepSplit)
                        losses = {name: value * weight for name, value in losses.items()}
                    accelerator.backward(losses["total"])
                    if accelerator.sync_gradients and config.max_grad_norm > 0:
                        accelerator.clip_grad_norm_(params, config.max_grad_norm)
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                for name, value in losses.items():
                    sums[name] = sums.get(name, 0.0) + value.detach().float() / config.grad_accum
            if ema is not None:
                ema.update()
            lr = scheduler.get_last_lr()[0]
            scheduler.step()
            step += 1
            tokens_done += tokens_per_step
            logged = step % log_every == 0 or step == total_steps
            if logged and accelerator.device.type == "cuda":
                torch.cuda.synchronize(accelerator.device)  # the clock counts the device's work where the losses are read
            train_s += time.perf_counter() - started
            cpu_s += time.process_time() - cpu_started
            log.step_ended(step, tokens_done, train_s, cpu_s, lr, sums, logged)
            if deadline is not None and world == 1 and step < total_steps and time.perf_counter() >= deadline:
                say(f"budget: the stage's time is up after step {step:,} of {total_steps:,}: it stops here "
                    f"({counted(tokens_done, 'token')} trained) to keep the budget")
                total_steps = log.total_steps = step
            if step == total_steps or ((logged or clock.by_steps) and clock.due(step, accelerator.device)):
                pending.flush(curve)
                save_accelerate_state(accelerator, state_dir, config, step, tokens_done, train_s, cpu_s, curve, keep_ema)
                saved_step = step
                clock.saved()

    accelerator.wait_for_everyone()
    result = AdaptResult(out, step, tokens_done, train_s, curve, resumed_from, throughput=pace.record(tokens_done, train_s))
    if ema is not None:  # after the last state was saved: a kept state holds the trained weights and their average
        ema.write_into()
    if accelerator.is_main_process:
        final = accelerator.unwrap_model(loss_module).student
        adapter = None
        if peft_model is not None:
            adapter = run_dir / f".{ADAPTER_DIR}.tmp"
            shutil.rmtree(adapter, ignore_errors=True)
            save_adapter(peft_model, adapter)
            final = merge_lora(peft_model)
        if config.interpolate != 1:
            final = toward_start(final, checkpoint, config.interpolate)
        write_output(final, tokenizer, checkpoint, teacher_path, config, weights, result, out, adapter=adapter)
        result.state_dir = finish_state(run_dir, state_dir, config.keep_state)
    accelerator.wait_for_everyone()
    return result


def _silent(_message: str) -> None:
    """What a process other than the main one says: nothing."""


def _fresh_single_process_state(mixed_precision: str, cpu: bool) -> None:
    """Accelerate keeps one state per process and refuses another precision or device later: a single-process run
    (a second stage, a test, the demo) that asks for other ones starts from a fresh state. Launched runs keep theirs."""
    from accelerate.state import AcceleratorState, DistributedType

    if _launched() or not AcceleratorState._shared_state:
        return
    state = AcceleratorState()
    if state.distributed_type != DistributedType.NO:
        return
    if state.mixed_precision != mixed_precision or (state.device.type == "cpu") != cpu:
        AcceleratorState._reset_state(reset_partial_state=True)


def _launched() -> bool:
    """Whether a launcher (torchrun, accelerate launch) started this process: then the Accelerator places it."""
    import os

    return "LOCAL_RANK" in os.environ
