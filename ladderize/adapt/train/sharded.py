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
- **One step** is ``trainer.Trainer.train_step``: each rank reads its rows of the global batch, FSDP2 averages the
  gradients (reduce-scatter) on the last micro-batch only; the precision's parameters are FSDP2's policy (the trained
  layers gathered in the compute dtype, gradients reduced in float32), and the loss scaling, the clip over the sharded
  gradients and AdamW's step are the stack every run shares (``optimizer_step.OptimizerStep``).
- **The training state** is the joint stages' one (``training_state.save_joint_state``): every rank writes its own
  shards with torch's distributed checkpoint; on another process count DCP reshards it.
- **OUT**: each trained layer is gathered whole (one layer at a time) and kept by the process it is given (round
  robin), which writes it to a layer file once the gathers end; the main process assembles OUT from the checkpoint with
  those layers (``output.write_streamed_output``) while the others wait on the file system, not in a collective
  (``process_group.written_by_main``).

LoRA, EMA, head grouping, interpolation and ``--train all`` keep the replicated path (``replicated.py``, DDP):
``strategy_choice.choose_strategy`` decides, for the plan and the run alike. Compiled decoder layers (``--compile``) are compiled before they are sharded, torchtitan's way.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import torch

from ...errors import LadderizeError
from .. import process_group
from .compilation import compile_layers, recompute_activations
from .fsdp import head_gathered
from ..plan.compile_policy import COMPILING, resolve_compile
from ..plan.config import AdaptConfig, AdaptResult, local_inputs_of, needs_teacher
from ..plan.cost import FlopCount
from ..objectives.losses import AdaptLoss
from .training_state import finish_state


class ShardedRun:
    """A joint stage sharded over the launched processes with FSDP2 (``trainer.Trainer`` drives it):
    each process holds 1/processes of the trained layers, their gradients and AdamW state, and of the frozen teacher."""

    teacher_gathers = True  # the teacher's units gather across the ranks: they run it together or not at all
    casts_parameters = True  # FSDP2's MixedPrecisionPolicy gathers the trained layers in the compute dtype

    def __init__(self, config: AdaptConfig, weights: dict[str, float], checkpoint: str):
        from ...checkpoint.placement import this_launch
        from ..layers.layer_source import map_large_allocations

        map_large_allocations()  # a step's gathered weights and gradients go back to the OS when freed
        self.config, self.weights, self.checkpoint = config, weights, checkpoint
        parallelism = config.parallelism
        device, self.precision = parallelism.placement()
        self.device = process_group.start(device)
        launch = this_launch()
        self.rank, self.world = launch.rank, launch.world
        self.precision.apply()
        self.compute = self.precision.autocast or torch.float32

    def build(self, data, say: Callable[[str], None]) -> None:
        """Build student and teacher without weights, shard each decoder layer, then read this rank's rows; the
        frozen parts both checkpoints hold identical are kept once, the teacher's."""
        from ...checkpoint.io import load_config
        from ...convert.teacher import check_teacher

        config, weights, checkpoint, device, compute = self.config, self.weights, self.checkpoint, self.device, self.compute
        objective = config.objective
        student_config = load_config(checkpoint)
        with_teacher = needs_teacher(config, weights)
        self.teacher_path = objective.teacher_for(checkpoint) if with_teacher else None
        teacher_config = load_config(self.teacher_path) if self.teacher_path else None
        if teacher_config is not None:
            check_teacher(self.teacher_path, teacher_config, student_config)
        self.converted = student_config.layout.converted_layers
        self.first = first = min(self.converted)
        same = (_identical_parts(checkpoint, self.teacher_path, first, self.rank, self.world, device)
                if self.teacher_path else {})
        self.share_prefix = same.get("prefix", False)
        compiled = resolve_compile(config.parallelism.compile, device)
        teacher = (_sharded_model(teacher_config, self.teacher_path, compute, device, trained=(), compiled=compiled)
                   if self.teacher_path else None)
        mixed = compute if compute != torch.float32 else None
        self.student = _sharded_model(student_config, checkpoint, torch.float32, device, trained=self.converted,
                                      mixed=mixed, compiled=compiled,
                                      shared=_teacher_pieces(teacher, student_config, first, same) if teacher else None)
        if compiled:
            say(COMPILING)
        self.loss_module = AdaptLoss(self.student, teacher, weights, local_inputs_of(config), objective.kd_temperature,
                                     self.share_prefix, objective.kd_divergence, objective.kd_top_k, compiled,
                                     gather_heads=head_gathered)
        if config.parallelism.activation_checkpointing:  # the trained layers' activations recomputed in the backward
            recompute_activations(self.student)
        _shard_root(self.loss_module, mixed)
        self.state_module = self.loss_module
        self.params = [p for p in self.loss_module.parameters() if p.requires_grad]  # the shards, after fully_shard
        self.flops = FlopCount.for_stage(student_config, self.converted, weights, share_prefix=self.share_prefix)

    def wrap(self) -> None:
        """Nothing: every unit was sharded as it was built."""

    def synchronizing(self, last: bool):
        """The context of a micro-batch's forward and backward: FSDP2's reduce-scatter only on the last one."""
        self.loss_module.set_requires_gradient_sync(last)
        return contextlib.nullcontext()

    def write_out(self, result: AdaptResult, out: Path, tokenizer, state_dir: Path) -> None:
        """OUT from the trained layers gathered one at a time (``_write_out``); the training state removed unless
        kept."""
        _write_out(self.student, self.converted, self.checkpoint, tokenizer, self.teacher_path, self.config,
                   self.weights, result, out, state_dir)


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

    from ...checkpoint.architectures import FINAL_NORM_TENSOR, LM_HEAD
    from ...checkpoint.tensor_files import tensor_shapes
    from ..layers.layer_source import EMBEDDING, layer_of, tensor_files

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

    from ...checkpoint.architectures import FINAL_NORM_TENSOR, LM_HEAD, layer_prefix
    from ...model import LadderLlamaForCausalLM
    from .fsdp import teacher_units
    from ..layers.layer_source import EMBEDDING, fill_module, tensor_files

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


def _write_out(student, converted: list[int], checkpoint: str, tokenizer, teacher_path: str | None,
               config: AdaptConfig, weights: dict[str, float], result: AdaptResult, out: Path, state_dir: Path) -> None:
    """OUT: every trained layer gathered whole (one at a time) and kept by the process it is given (``_writer``), each
    process then writing its own layers' files; the main process assembles OUT from them and the rest of
    ``checkpoint`` while the others wait on the file system (``process_group.written_by_main``), so no process waits in
    a collective while another writes."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    from ...checkpoint.atomic import atomic_file
    from ...checkpoint.architectures import layer_prefix
    from ...checkpoint.placement import this_launch
    from ..layers.layer_source import StreamedLayers, layer_file
    from .output import write_streamed_output, written_marker

    launch = this_launch()
    rank, world = launch.rank, launch.world
    layers_dir = state_dir.parent / ".sharded-layers"
    if rank == 0:
        shutil.rmtree(layers_dir, ignore_errors=True)
        layers_dir.mkdir(parents=True)
    dist.barrier()
    files = {index: layer_file(layers_dir, index) for index in converted}

    def save(index: int, tensors: dict[str, torch.Tensor]) -> None:
        from safetensors.torch import save_file

        with atomic_file(files[index]) as tmp:
            save_file(tensors, str(tmp))

    mine: dict[int, dict[str, torch.Tensor]] = {}  # the gathered layers this process writes, held until the gathers end
    for position, index in enumerate(converted):
        tensors = {}
        for key, value in student.model.layers[index].state_dict().items():
            full = value.full_tensor() if isinstance(value, DTensor) else value
            if _writer(position, world) == rank:
                tensors[f"{layer_prefix(index)}{key}"] = full.detach().to("cpu", torch.float32).contiguous()
        if world == 1:
            save(index, tensors)  # no other process to keep waiting: one layer held at a time
        elif tensors:
            mine[index] = tensors
    for index in list(mine):
        save(index, mine.pop(index))

    def assemble() -> None:
        waited = time.monotonic()
        while not all(file.is_file() for file in files.values()):  # the other processes' layer files
            if time.monotonic() - waited > process_group.WRITE_WAIT_S:
                raise LadderizeError(f"the layer files in {layers_dir} are not all written")
            time.sleep(process_group.POLL_S)
        whole = StreamedLayers(checkpoint, dtype=torch.float32)
        for index, file in files.items():
            whole.use_trained(index, file)
        write_streamed_output(whole, tokenizer, checkpoint, teacher_path, config, weights, result, out)
        shutil.rmtree(layers_dir, ignore_errors=True)
        result.state_dir = finish_state(state_dir.parent, state_dir, config.saving.keep_state)

    process_group.written_by_main(written_marker(out), assemble)


def _writer(position: int, world: int) -> int:
    """The process that writes the ``position``-th trained layer's file: round robin over the processes."""
    return position % world
