"""The replicated run of a joint stage (``trainer.Trainer`` drives it): one process, or every process
holding the whole student under a launcher (DDP), built on Accelerate.

Accelerate gives the device, DDP (gloo on a CPU, NCCL on CUDA), mixed precision (autocast, and a loss scaler under
fp16) and the gradient synchronisation; the loop divides each micro-batch's loss by the accumulation itself. This run
takes what needs the whole weights on every process (``strategy.SETTINGS``): LoRA (peft, merged into OUT, the adapter
saved beside it), an EMA of the trained weights, head grouping before training, interpolation towards the start,
and ``--train all``. OUT is written by the main process from the whole model.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ...errors import LadderizeError
from ...model import LadderLlamaForCausalLM
from ...convert.teacher import load_teacher, resolve_teacher
from .compilation import compile_layers, recompute_activations
from ..plan.compile_policy import COMPILING, resolve_compile
from ..plan.config import AdaptConfig, AdaptResult, local_inputs_of, needs_teacher
from ..plan.cost import FlopCount
from .interpolation import toward_start
from .weight_ema import WeightEMA
from .lora import ADAPTER_DIR, LoraSpec, add_lora, merge_lora, save_adapter
from ..objectives.losses import AdaptLoss
from ..objectives.registry import entries
from .output import write_output
from .training_state import finish_state
from ..sequential.layer_source import ResidentLayers, same_prefix


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


class ReplicatedRun:
    """A joint stage on one process or replicated over the launched ones: the whole student, teacher, gradients and
    optimizer state on every process (``trainer.Trainer`` calls it in this order: build, prepare, then each
    step's ``synchronizing``/``backward``, ``clip``, ``optimizer_step``, and ``write_out``)."""

    teacher_gathers = False  # each process runs its own teacher: a micro-batch takes stored states where it has them

    def __init__(self, config: AdaptConfig, weights: dict[str, float], checkpoint: str):
        from accelerate import Accelerator
        from accelerate.utils import DistributedDataParallelKwargs, set_seed

        from ...checkpoint.placement import resolve_device, this_launch, training_precision

        self.config, self.weights, self.checkpoint = config, weights, checkpoint
        parallelism = config.parallelism
        device = resolve_device(parallelism.device)  # under accelerate launch the Accelerator's device wins (below)
        if this_launch().by_launcher:  # the one process group, on this process's device, before Accelerate looks for one
            from .. import process_group

            device = process_group.start(device)
        elif device.type == "cuda" and device.index is not None:
            torch.cuda.set_device(device)  # Accelerate's single-process device is the current CUDA device
        precision = training_precision(parallelism.dtype, device, parallelism.mixed_precision)
        precision.apply()
        _fresh_single_process_state(precision.mixed_precision, cpu=device.type == "cpu")
        if os.environ.get("ACCELERATE_USE_FSDP", "").lower() in {"true", "1", "yes"}:
            raise LadderizeError("an Accelerate FSDP config runs the sharded training (--shard fsdp; "
                                 "adapt/plan/accelerate_config.py), not this replicated one: launch it without the FSDP config")
        # training every parameter with no objective over the LM head leaves the unconverted layers unused
        unused = config.scope.train == "all" and not any(objective.head for objective in entries(weights))
        self.accelerator = Accelerator(
            kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=unused)],
            mixed_precision=precision.mixed_precision,
            cpu=device.type == "cpu",  # --device cpu, or a CPU-only machine: torchrun / accelerate launch give gloo DDP
        )
        set_seed(config.training.seed)
        self.device = self.accelerator.device
        self.rank, self.world = self.accelerator.process_index, self.accelerator.num_processes
        self.ema: WeightEMA | None = None
        self.peft_model = None

    def build(self, data, say: Callable[[str], None]) -> None:
        """Load the student and (where an objective needs it) the teacher whole, pick the trained parameters, and
        build the loss."""
        from ...checkpoint.io import load_model

        config, weights, checkpoint = self.config, self.weights, self.checkpoint
        scope, objective = config.scope, config.objective
        student = load_model(checkpoint, dtype=torch.float32)
        with_teacher = needs_teacher(config, weights)
        self.teacher_path = resolve_teacher(checkpoint, objective.teacher) if with_teacher else objective.teacher
        teacher = load_teacher(self.teacher_path, student) if with_teacher else None
        if scope.head_grouping:  # before ``prepare``, on the Accelerator's device
            from ...convert.head_grouping import group_heads_for_spd

            student.to(self.device)
            teacher.to(self.device)
            student, orders = group_heads_for_spd(student, teacher, data.head(8))
            say(f"head grouping: {orders}")
        spec = LoraSpec(rank=scope.lora_rank, alpha=scope.lora_alpha)
        if scope.train == "lora":  # peft wraps the target linears of ``student`` in place
            self.peft_model, self.params = add_lora(student, student.layout.converted_layers, spec, base=checkpoint)
        else:
            self.params = select_trainable(student, scope.train, spec)
        self.share_prefix = _prefix_shared(student, teacher, scope.train)
        self.flops = FlopCount.for_stage(student.config, student.layout.converted_layers
                                         or list(range(student.config.num_hidden_layers)),
                                         weights, share_prefix=self.share_prefix, scope=scope.train)
        compiled = resolve_compile(config.parallelism.compile, self.device)
        if compiled:
            compile_layers([*student.model.layers, *(teacher.model.layers if teacher is not None else [])], self.device)
            say(COMPILING)
        self.state_module = AdaptLoss(student, teacher, weights, local_inputs_of(config), objective.kd_temperature,
                                      self.share_prefix, objective.kd_divergence, objective.kd_top_k, compiled)
        self.first = self.state_module.first
        if config.parallelism.activation_checkpointing:  # the trained layers' activations recomputed in the backward
            recompute_activations(student)
        if teacher is not None:
            teacher.to(self.device)
        self.student = student
        self.loss_module = self.state_module

    def prepare(self, optimizer: torch.optim.Optimizer) -> None:
        """Hand the loss and the optimizer to Accelerate (DDP, autocast, the loss scaler); start the EMA from the
        weights training starts from."""
        self.loss_module, self.optimizer = self.accelerator.prepare(self.state_module, optimizer)
        self.ema = WeightEMA(self.params, self.config.scope.ema) if self.config.scope.ema else None

    def synchronizing(self, last: bool):
        """The context of a micro-batch's forward and backward: DDP's gradient all-reduce only on the last one."""
        return contextlib.nullcontext() if last else self.accelerator.no_sync(self.loss_module)

    def backward(self, loss: torch.Tensor) -> None:
        self.accelerator.backward(loss)

    def clip(self, max_norm: float) -> None:
        self.accelerator.clip_grad_norm_(self.params, max_norm)

    def optimizer_step(self) -> None:
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.ema is not None:
            self.ema.update()

    def extra_state(self) -> dict[str, Any]:
        """What the state holds besides the trained parameters and AdamW, as stateful objects: fp16's loss scaler and
        the EMA's average."""
        extra: dict[str, Any] = {}
        if self.accelerator.scaler is not None:
            extra["scaler"] = self.accelerator.scaler
        if self.ema is not None:
            extra["ema"] = self.ema
        return extra

    def barrier(self) -> None:
        self.accelerator.wait_for_everyone()

    def write_out(self, result: AdaptResult, out: Path, tokenizer, state_dir: Path) -> None:
        """OUT from the whole student, by the main process: the EMA's weights where kept, LoRA merged (its adapter
        beside), interpolated towards the start where asked; then the training state removed unless kept."""
        accelerator, config = self.accelerator, self.config
        accelerator.wait_for_everyone()
        if self.ema is not None:  # after the last state was saved: a kept state holds the trained weights and their average
            self.ema.write_into()
        if accelerator.is_main_process:
            final = accelerator.unwrap_model(self.loss_module).student
            adapter = None
            if self.peft_model is not None:
                adapter = state_dir.parent / f".{ADAPTER_DIR}.tmp"
                shutil.rmtree(adapter, ignore_errors=True)
                save_adapter(self.peft_model, adapter)
                final = merge_lora(self.peft_model)
            if config.scope.interpolate != 1:
                final = toward_start(final, self.checkpoint, config.scope.interpolate)
            write_output(final, tokenizer, self.checkpoint, self.teacher_path, config, self.weights, result, out,
                         adapter=adapter)
            result.state_dir = finish_state(state_dir.parent, state_dir, config.saving.keep_state)
        accelerator.wait_for_everyone()


def _fresh_single_process_state(mixed_precision: str, cpu: bool) -> None:
    """Accelerate keeps one state per process and refuses another precision or device later: a single-process run
    (a second stage, a test, the demo) that asks for other ones starts from a fresh state. Launched runs keep theirs."""
    from accelerate.state import AcceleratorState, DistributedType

    from ...checkpoint.placement import this_launch

    if this_launch().by_launcher or not AcceleratorState._shared_state:
        return
    state = AcceleratorState()
    if state.distributed_type != DistributedType.NO:
        return
    if state.mixed_precision != mixed_precision or (state.device.type == "cpu") != cpu:
        AcceleratorState._reset_state(reset_partial_state=True)
