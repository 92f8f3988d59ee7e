"""The joint training sharded over the launched processes with FSDP2: the default under torchrun or accelerate launch.

A model that does not fit one device whole (Llama-3.1-8B's kd stage: fp32 student, teacher, gradients and AdamW,
about 106 GB) trains here, torchtitan's way, each piece a plain torch call:

- **Build, shard, then read.** Student and teacher are built on the meta device; every decoder layer is one FSDP2
  unit (``fully_shard``) sharded there, then each rank reads only its own rows of each of the layer's tensors from the
  safetensors (``fill_shards``: ``safe_open``'s slices), and the
  student's own embedding, final norm and LM head (those that are not the teacher's) one more (the root,
  ``AdaptLoss``): host and device memory per rank are the models over the ranks, plus one unit.
- **Only the converted layers train.** The optimizer (fused AdamW) holds their shards; the frozen teacher runs in
  the compute dtype (bf16 where the training autocasts), and what both checkpoints hold identical is held once, the
  teacher's (``_teacher_pieces``): the layers below the first converted one, run once for both (``AdaptLoss`` with
  ``share_prefix``), the embedding, the final norm and the LM head.
- **Host memory** is the shards and what a step gathers: glibc maps every block of a MiB or more on its own
  (``layer_source.map_large_allocations``), so that the gathered weights and gradients a step frees leave the
  process.
- **One step** is the joint training's step (``joint.py``): each rank reads its rows of the deterministic batch
  order, FSDP2 averages the gradients (reduce-scatter), gradient sync waits for the last micro-batch, and the clip
  measures the global norm of the sharded gradients. Losses stay on the device and are read when logged
  (every ``log_every`` steps on CUDA, every step on a CPU), so a step does not wait for the host.
- **The training state** is what training changes: the trained parameters and their AdamW state, each rank writing
  its own shard with torch's distributed checkpoint (``torch.distributed.checkpoint``), beside
  ``trainer_state.json``; saved a minute into the run, then every ``save_minutes`` (every ``save_every`` steps
  instead where set), and at a stop. A resume on the same process count continues bit for bit; on another count
  DCP reshards the state and the run continues from the tokens trained.
- **OUT**: each trained layer is gathered whole (one layer at a time) and written by the main process to a layer
  file, and OUT is assembled from the checkpoint with those layers (``output.write_streamed_output``).

LoRA, EMA, head grouping, interpolation and ``--train all`` keep the replicated path (``joint.py``, DDP):
``strategy.choose_strategy`` decides, for the plan and the run alike. Compiled decoder layers (``--compile``) are compiled before they are sharded, torchtitan's way.
"""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import torch

from ..errors import LadderizeError, holding_interrupts
from ..progress import counted
from . import process_group
from .compilation import COMPILING, adamw, compile_layers, recompute_activations, resolve_compile
from .config import AdaptConfig, AdaptResult, StepInfo, local_inputs_of, needs_teacher
from .cost import FlopCount
from ..corpus.token_store import build_reporter, is_store
from ..corpus.windows import token_windows
from .batches import StepSplit
from .loss_log import PendingLosses, TrainingLog, log_every as log_interval
from .lr_curve import warmup_cosine
from .objectives import STORED_TEACHER_OBJECTIVES, AdaptLoss
from .throughput import Throughput, peak_flops_per_s, plan_line
from .training_state import DCP_DIR, STATE_DIR, SaveClock, finish_state, read_trainer_state, write_trainer_state


def adapt_sharded(
    config: AdaptConfig,
    weights: dict[str, float],
    checkpoint: str,
    out: Path,
    *,
    resume: bool,
    progress: Callable[[StepInfo, torch.nn.Module], None] | None,
    say: Callable[[str], None],
    stop_after_steps: int | None,
    save_at_stop: bool = False,
) -> AdaptResult:
    """Run the joint training on ``checkpoint`` sharded with FSDP2 over the launched processes, and write ``out``."""
    import torch.distributed as dist

    from ..checkpoint.io import load_config, load_tokenizer
    from ..checkpoint.placement import resolve_device, training_precision
    from ..convert.teacher import check_teacher, resolve_teacher
    from .layer_source import map_large_allocations

    map_large_allocations()  # a step's gathered weights and gradients go back to the OS when freed
    device = process_group.start(resolve_device(config.device))  # auto: cuda:$LOCAL_RANK where torch sees CUDA
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank != 0:
        say = _silent
    run_dir = config.resolved_run_dir()
    state_dir = run_dir / STATE_DIR
    precision = training_precision(config.dtype, device, config.mixed_precision)
    precision.apply()
    torch.manual_seed(config.seed)
    compute = precision.autocast or torch.float32

    student_config = load_config(checkpoint)
    with_teacher = needs_teacher(config, weights)
    teacher_path = resolve_teacher(checkpoint, config.teacher) if with_teacher else None
    teacher_config = load_config(teacher_path) if teacher_path else None
    if teacher_config is not None:
        check_teacher(teacher_path, teacher_config, student_config)
    converted = student_config.layout.converted_layers
    first = min(converted)
    same = _identical_parts(checkpoint, teacher_path, first, rank, world, device) if teacher_path else {}
    share = same.get("prefix", False)

    compiled = resolve_compile(config.compile, device)
    teacher = (_sharded_model(teacher_config, teacher_path, compute, device, trained=(), compiled=compiled)
               if teacher_path else None)
    student = _sharded_model(student_config, checkpoint, torch.float32, device, trained=converted,
                             mixed=compute if compute != torch.float32 else None, compiled=compiled,
                             shared=_teacher_pieces(teacher, student_config, first, same) if teacher else None)
    if compiled:
        say(COMPILING)
    loss_module = AdaptLoss(student, teacher, weights, local_inputs_of(config), config.kd_temperature, share,
                            config.kd_divergence, config.kd_top_k, compiled)
    if config.activation_checkpointing:  # the trained layers' activations recomputed in the backward
        recompute_activations(student)
    _shard_root(loss_module, compute if compute != torch.float32 else None)
    params = [p for p in loss_module.parameters() if p.requires_grad]  # the sharded ones, after fully_shard
    tokenizer = load_tokenizer(checkpoint, "adaptation")

    pace = Throughput(world, FlopCount.for_stage(student_config, converted, weights, share_prefix=share).per_token,
                      peak_flops_per_s(device))
    split = StepSplit(config.batch_size, world, config.grad_accum)
    tokens_per_step = config.batch_size * config.seq_len
    total_steps = max(1, math.ceil(config.tokens / tokens_per_step))
    say(plan_line(total_steps * tokens_per_step, total_steps, split, config.seq_len)
        + f", sharded over {counted(world, 'process', 'processes')} (FSDP2)")
    data = token_windows(config.data, tokenizer, config.seq_len, max_tokens=total_steps * tokens_per_step,
                         progress=build_reporter(say, config.data), say=say)
    where = data.stores[0].path.parent if len(data.stores) > 1 else data.stores[0].path
    stored = "" if is_store(config.data) else f" (token store {where})"
    say(f"data: {counted(len(data), 'sequence')} of {config.seq_len} tokens from {config.data}{stored}")
    kept = None
    if config.teacher_states and share and set(weights) <= STORED_TEACHER_OBJECTIVES:
        from .teacher_states import read as read_teacher_states, teacher_id

        kept, found = read_teacher_states(Path(config.teacher_states), len(data), data.head, teacher_id(teacher_path), first)
        if found:
            say(found)

    optimizer = adamw(params, lr=config.lr, weight_decay=config.weight_decay, betas=(0.9, 0.95))  # fused: no temporaries
    step, tokens_done, train_s, cpu_s, curve, resumed_from = 0, 0, 0.0, 0.0, [], 0
    saved = _read_state(state_dir, config) if resume and state_dir.is_dir() else None
    if saved is not None:
        _load_dcp(state_dir, loss_module, optimizer)
        step, tokens_done, train_s, cpu_s, curve = (saved["step"], saved["tokens"], saved["train_s"],
                                                    saved.get("cpu_s", 0.0), saved["curve"])
        resumed_from = step
        if saved.get("processes", world) != world:  # resharded: the same global batch goes on from the tokens trained
            total_steps = step + max(1, math.ceil((config.tokens - tokens_done) / tokens_per_step))
            say(f"resumed on {counted(world, 'process', 'processes')} a run saved on {saved['processes']}: "
                f"{total_steps - step} step(s) of {tokens_per_step:,} tokens left")
        say(f"resumed from step {step} ({tokens_done:,} tokens)")
    elif resume:
        say(f"nothing to resume in {run_dir}; starting a new run")
    for group in optimizer.param_groups:  # the schedule's base rate is the run's, not the one a loaded state carries
        group["initial_lr"] = config.lr
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(total_steps, config.warmup_steps,
                                                                           config.min_lr_ratio), last_epoch=step - 1)

    log_every = log_interval(device)
    pending = PendingLosses(_mean_over_ranks if world > 1 else None)
    loss_module.train()
    saved_step, clock = step, SaveClock(config, say)
    log = TrainingLog(pending, curve, train_s=train_s, total_steps=total_steps, tokens_per_step=tokens_per_step,
                      pace=pace, say=say,
                      report=(lambda info: progress(info, student)) if rank == 0 and progress is not None else None)

    def save() -> None:
        pending.flush(curve)
        _save_state(state_dir, config, loss_module, optimizer, {"step": step, "tokens": tokens_done, "train_s": train_s,
                                                               "cpu_s": cpu_s, "curve": curve, "processes": world})

    with holding_interrupts():  # a Ctrl-C or SIGTERM saves the state at its step's end, then stops (SaveClock)
        while step < total_steps:
            if stop_after_steps is not None and step >= stop_after_steps:
                if save_at_stop and saved_step != step:
                    save()
                pending.flush(curve)
                dist.barrier()
                return AdaptResult(out, step, tokens_done, train_s, curve, resumed_from,
                                   state_dir=state_dir if state_dir.exists() else None, stopped_early=True,
                                   throughput=pace.record(tokens_done, train_s))
            started, cpu_started = time.perf_counter(), time.process_time()
            sums: dict[str, torch.Tensor] = {}
            for micro in range(config.grad_accum):
                rows, weight = split.rows(len(data), step, micro, rank, config.seed)
                batch = data.rows(rows).to(device, non_blocking=True)
                teacher_rows = None
                if kept is not None and _all_stored(kept.num_rows, len(data), step, micro, split, config.seed):
                    teacher_rows = kept.rows(rows, device)  # else the teacher runs, on every rank (its units gather)
                loss_module.set_requires_gradient_sync(micro == config.grad_accum - 1)
                losses = loss_module(batch, teacher_rows)
                if weight != 1:  # an uneven part: its share of the global batch's mean (batches.StepSplit)
                    losses = {name: value * weight for name, value in losses.items()}
                (losses["total"] / config.grad_accum).backward()
                for name, value in losses.items():
                    sums[name] = sums.get(name, 0.0) + value.detach() / config.grad_accum
            if config.max_grad_norm > 0:
                clip_sharded(params, config.max_grad_norm)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            lr = scheduler.get_last_lr()[0]
            scheduler.step()
            step += 1
            tokens_done += tokens_per_step
            logged = step % log_every == 0 or step == total_steps
            if logged and device.type == "cuda":
                torch.cuda.synchronize(device)  # the clock counts the device's work where the losses are read
            train_s += time.perf_counter() - started
            cpu_s += time.process_time() - cpu_started
            log.step_ended(step, tokens_done, train_s, cpu_s, lr, sums, logged)
            if (logged or clock.by_steps) and step < total_steps and clock.due(step, device):  # time is read where losses are
                save()
                saved_step = step
                clock.saved()

    pending.flush(curve)
    result = AdaptResult(out, step, tokens_done, train_s, curve, resumed_from, throughput=pace.record(tokens_done, train_s))
    _write_out(loss_module.student, converted, checkpoint, tokenizer, teacher_path, config, weights, result, out, state_dir)
    if rank == 0:
        result.state_dir = finish_state(run_dir, state_dir, config.keep_state)
    dist.barrier()
    return result


def _mean_over_ranks(tensor: torch.Tensor) -> torch.Tensor:
    """The mean of ``tensor`` over the process group's ranks (an all-reduce every rank joins)."""
    import torch.distributed as dist

    dist.all_reduce(tensor)
    return tensor / dist.get_world_size()


def _all_stored(stored_rows: int, num_sequences: int, step: int, micro: int, split: StepSplit, seed: int) -> bool:
    """Whether every rank's rows of this micro-batch have stored teacher states: the ranks run the sharded teacher
    together or not at all (its units gather across them), and each computes the others' rows itself."""
    return all(max(split.rows(num_sequences, step, micro, r, seed)[0]) < stored_rows for r in range(split.processes))


def clip_sharded(params: list[torch.nn.Parameter], max_norm: float) -> torch.Tensor:
    """Clip the gradients of ``params`` (DTensor shards or plain tensors) to the global 2-norm ``max_norm``."""
    from torch.distributed.tensor import DTensor

    grads = [p.grad for p in params if p.grad is not None]
    total = torch.nn.utils.get_total_norm(grads, 2.0)
    if isinstance(total, DTensor):  # each rank's norm of its shards: the full tensor is the global norm
        total = total.full_tensor()
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return total


def _silent(_message: str) -> None:
    """What a process other than the main one says: nothing."""


def _rows(full_rows: int, rank: int, world: int) -> slice:
    """The rows of dim 0 that FSDP2's ``Shard(0)`` gives ``rank`` (``torch.chunk``'s split)."""
    size = -(-full_rows // world)
    start = min(rank * size, full_rows)
    return slice(start, min(start + size, full_rows))


def _read_rows(file: Path, name: str, rows: slice) -> torch.Tensor:
    """Rows ``rows`` of dim 0 of tensor ``name`` in ``file`` (a scalar whole), read without the rest."""
    from safetensors import safe_open

    with safe_open(str(file), framework="pt") as handle:
        part = handle.get_slice(name)
        return part[rows] if part.get_shape() else handle.get_tensor(name)


def fill_shards(module: torch.nn.Module, prefix: str, file_of: Callable[[str], Path], device: torch.device) -> None:
    """Give ``module``, sharded by ``fully_shard`` on the meta device, its tensors on ``device``: each rank reads only its
    own rows of each sharded parameter (``prefix`` + its name, from ``file_of(name)``) with ``safe_open``'s slices, a
    tensor that is not sharded whole; each in the dtype the module holds it in."""
    from torch.distributed.tensor import DTensor

    module.to_empty(device=device)
    with torch.no_grad():
        for name, tensor in module.state_dict().items():
            local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
            if isinstance(tensor, DTensor):
                if [type(p).__name__ for p in tensor.placements] != ["Shard"] or tensor.placements[0].dim != 0:
                    raise LadderizeError(f"{prefix + name}: expected FSDP2's dim-0 shards, got {tensor.placements}")
                mesh = tensor.device_mesh
                rows = _rows(tensor.shape[0], mesh.get_local_rank(), mesh.size())
            else:
                rows = slice(None)
            local.copy_(_read_rows(file_of(prefix + name), prefix + name, rows))


def _identical_parts(student_path: str, teacher_path: str, first: int, rank: int, world: int,
                     device: torch.device) -> dict[str, bool]:
    """Which frozen parts the two checkpoints hold identical: ``prefix`` (the embedding and the layers below
    ``first``: ``layer_source.same_prefix``'s question), ``norm`` (the final norm) and ``head`` (an untied LM head).
    Each rank compares its own rows only, and the ranks agree (one all-reduce)."""
    import torch.distributed as dist

    from ..checkpoint.architectures import FINAL_NORM_TENSOR, LM_HEAD
    from ..checkpoint.tensor_files import tensor_shapes
    from .layer_source import EMBEDDING, layer_of, tensor_files

    mine, theirs = tensor_files(student_path), tensor_files(teacher_path)
    parts = {"prefix": [n for n in theirs if n.startswith(EMBEDDING) or 0 <= layer_of(n) < first],
             "norm": [FINAL_NORM_TENSOR], "head": [LM_HEAD]}
    named = {n for names in parts.values() for n in names if n in theirs}
    shapes = {name: shape for file in set(theirs[n] for n in named) for name, shape in tensor_shapes(file).items()}

    def identical(names: list[str]) -> bool:
        if not all(n in mine and n in theirs for n in names):
            return False
        for name in names:
            rows = _rows(shapes[name][0], rank, world) if shapes[name] else slice(None)
            a, b = _read_rows(mine[name], name, rows), _read_rows(theirs[name], name, rows)
            if a.shape != b.shape or not torch.equal(a.float(), b.float()):
                return False
        return True

    flags = torch.tensor([1 if identical(names) else 0 for names in parts.values()], device=device)
    dist.all_reduce(flags, op=dist.ReduceOp.MIN)
    return dict(zip(parts, (bool(flag) for flag in flags.tolist())))


def _teacher_pieces(teacher, student_config, first: int, same: dict[str, bool]) -> dict[str, torch.nn.Module]:
    """The teacher's modules the student uses as its own, by name: the frozen parts both checkpoints hold identical
    (``_identical_parts``), kept once. A tied LM head is its embedding's: shared with it, where both models tie."""
    pieces: dict[str, torch.nn.Module] = {}
    if same.get("prefix"):
        pieces.update({f"model.layers.{index}": teacher.model.layers[index] for index in range(first)})
    tied = bool(getattr(student_config, "tie_word_embeddings", False))
    if same.get("prefix") and tied == bool(getattr(teacher.config, "tie_word_embeddings", False)):
        pieces["model.embed_tokens"] = teacher.model.embed_tokens
        if tied:
            pieces["lm_head"] = teacher.lm_head
    if same.get("norm"):
        pieces["model.norm"] = teacher.model.norm
    if same.get("head") and not tied:
        pieces["lm_head"] = teacher.lm_head
    return pieces


def _sharded_model(config, path: str, dtype: torch.dtype, device: torch.device, trained, mixed: torch.dtype | None = None,
                   shared: dict[str, torch.nn.Module] | None = None, compiled: bool = False):
    """The model at ``path``, each decoder layer an FSDP2 unit: built without weights; each layer is sharded, then
    filled with this rank's rows from its safetensors (in ``dtype``; ``fill_shards``), so that no rank holds a layer
    whole; the embedding, final norm and LM head are read whole, one at a time.

    ``trained``: the layers that keep gradients, their compute dtype ``mixed`` (FSDP2's mixed precision); ``shared``:
    modules taken from another model as they are, by name (``_teacher_pieces``: the teacher's frozen prefix, final
    norm and head where identical), never read again. ``compiled``: each decoder layer's forward is compiled
    (``compilation.compile_layers``) before it is sharded, so that FSDP2's gathers stay outside its graph. A frozen model (the teacher, no ``trained``) also shards its
    embedding, norm and head, each a unit of its own (a tied head with its embedding; ``fsdp.teacher_units``); a
    student's stay whole until the loss module, their unit, is sharded (``_shard_root``).
    """
    from accelerate import init_empty_weights
    from torch.distributed.fsdp import fully_shard

    from ..checkpoint.architectures import FINAL_NORM_TENSOR, LM_HEAD, layer_prefix
    from ..model import LadderLlamaForCausalLM
    from .fsdp import teacher_units
    from .layer_source import EMBEDDING, fill_module, tensor_files

    with init_empty_weights():  # parameters on the meta device, buffers (rotary frequencies) computed
        model = LadderLlamaForCausalLM(config)
    model.tie_weights()  # a tied head is its embedding's weight (not tied on the meta device)
    model.requires_grad_(False)
    model.model.rotary_emb.to(device)
    files = tensor_files(path)
    shared = shared or {}
    for name, module in shared.items():
        model.set_submodule(name, module)

    def file_of(name: str) -> Path:
        if name not in files:
            raise LadderizeError(f"checkpoint {path} is missing tensor {name}")
        return files[name]

    def fill(module: torch.nn.Module, prefix: str) -> None:
        if prefix.removesuffix(".") not in shared:
            fill_module(module, prefix, file_of, dtype, device)

    tied = model.lm_head.weight is model.model.embed_tokens.weight
    fill(model.model.embed_tokens, EMBEDDING)
    fill(model.model.norm, FINAL_NORM_TENSOR.removesuffix("weight"))
    if tied and "lm_head" not in shared:
        model.lm_head.weight = model.model.embed_tokens.weight
    elif not tied:
        fill(model.lm_head, LM_HEAD.removesuffix("weight"))
    for index, layer in enumerate(model.model.layers):
        if layer_prefix(index).removesuffix(".") in shared:  # the teacher's own layer, identical and frozen
            continue
        layer.to(dtype=dtype)  # on the meta device: its floating parameters' dtype, nothing read
        layer.requires_grad_(index in trained)
        if compiled:
            compile_layers([layer], device)
        fully_shard(layer, mp_policy=_policy(mixed if index in trained else None), reshard_after_forward=True)
        fill_shards(layer, layer_prefix(index), file_of, device)
    if not trained:
        for unit in teacher_units(model):
            if unit not in model.model.layers:
                fully_shard(unit, reshard_after_forward=True)
        model.eval()
    return model


def _policy(mixed: torch.dtype | None):
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=mixed, reduce_dtype=torch.float32) if mixed else MixedPrecisionPolicy()


def _shard_root(loss_module: AdaptLoss, mixed: torch.dtype | None) -> None:
    """The student's embedding, final norm and LM head: one FSDP2 unit whose forward is the loss module's."""
    from torch.distributed.fsdp import fully_shard

    fully_shard(loss_module, mp_policy=_policy(mixed), reshard_after_forward=True)


def _read_state(state_dir: Path, config: AdaptConfig) -> dict | None:
    """The saved trainer state of a sharded run (``None``: nothing saved yet); a replicated run's is refused."""
    saved = read_trainer_state(state_dir, config)
    if saved is not None and not (state_dir / DCP_DIR).is_dir():
        raise LadderizeError(f"cannot resume {state_dir.parent}: its state was saved by the replicated training; "
                             "resume it with --shard ddp (or --force to start over)")
    return saved


def _trained_state(loss_module: AdaptLoss, optimizer: torch.optim.Optimizer) -> dict:
    """The state DCP saves: the trained parameters (sharded) and their optimizer state."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    model_state, optim_state = get_state_dict(loss_module, optimizer, options=StateDictOptions(ignore_frozen_params=True))
    return {"model": model_state, "optim": optim_state}


def _save_state(state_dir: Path, config: AdaptConfig, loss_module: AdaptLoss, optimizer, payload: dict) -> None:
    """Replace ``state_dir`` with the trained shards (every rank writes its own) and ``trainer_state.json``."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from ..checkpoint.atomic import replace_directory

    tmp = state_dir.parent / f".{state_dir.name}.tmp"
    if dist.get_rank() == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    dcp.save(_trained_state(loss_module, optimizer), checkpoint_id=str(tmp / DCP_DIR))
    dist.barrier()
    if dist.get_rank() == 0:
        write_trainer_state(tmp, config, payload)
        replace_directory(tmp, state_dir)
    dist.barrier()


def _load_dcp(state_dir: Path, loss_module: AdaptLoss, optimizer) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    state = _trained_state(loss_module, optimizer)
    dcp.load(state, checkpoint_id=str(state_dir / DCP_DIR))
    set_state_dict(loss_module, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
                   options=StateDictOptions(ignore_frozen_params=True, strict=False))


def _write_out(student, converted: list[int], checkpoint: str, tokenizer, teacher_path: str | None,
               config: AdaptConfig, weights: dict[str, float], result: AdaptResult, out: Path, state_dir: Path) -> None:
    """OUT: every trained layer gathered whole (one at a time) into a layer file, then assembled with the rest of
    ``checkpoint`` by the main process."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    from ..checkpoint.atomic import atomic_file
    from ..checkpoint.architectures import layer_prefix
    from .layer_source import StreamedLayers
    from .output import write_streamed_output
    from .sequential_run import layer_file

    rank = dist.get_rank()
    layers_dir = state_dir.parent / ".sharded-layers"
    if rank == 0:
        shutil.rmtree(layers_dir, ignore_errors=True)
        layers_dir.mkdir(parents=True)
    dist.barrier()
    files = {}
    for index in converted:
        tensors = {}
        for key, value in student.model.layers[index].state_dict().items():
            full = value.full_tensor() if isinstance(value, DTensor) else value
            tensors[f"{layer_prefix(index)}{key}"] = full.detach().to("cpu", torch.float32).contiguous()
        files[index] = layer_file(layers_dir, index)
        if rank == 0:
            from safetensors.torch import save_file

            with atomic_file(files[index]) as tmp:
                save_file(tensors, str(tmp))
    dist.barrier()
    if rank == 0:
        whole = StreamedLayers(checkpoint, dtype=torch.float32)
        for index, file in files.items():
            whole.use_trained(index, file)
        write_streamed_output(whole, tokenizer, checkpoint, teacher_path, config, weights, result, out)
        shutil.rmtree(layers_dir, ignore_errors=True)
    dist.barrier()
