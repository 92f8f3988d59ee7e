"""The replicated run of a joint stage (``trainer.Trainer`` drives it): one process, or every process
holding the whole student under a launcher (torch's DDP over the launch's process group: gloo on a CPU, NCCL on CUDA).

The run builds the models and wraps them; the step's precision (autocast), loss scaling, clip and optimizer step are
the stack every run shares (``optimizer_step.OptimizerStep``), and the loop divides each micro-batch's loss by the
accumulation itself. This run takes what needs the whole weights on every process (``strategy_choice.SETTINGS``): LoRA
(peft, merged into OUT, the adapter saved beside it), an EMA of the trained weights, head grouping before training,
interpolation towards the start, and ``--train all``. OUT is written by the main process from the whole model,
while the others wait on the file system.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import torch

from ...errors import LadderizeError
from .. import process_group
from ...model import LadderLlamaForCausalLM
from ...convert.teacher import load_teacher
from .compilation import compile_layers, recompute_activations
from ..plan.compile_policy import COMPILING, resolve_compile
from ..plan.config import AdaptConfig, AdaptResult, local_inputs_of, needs_teacher
from ..plan.cost import FlopCount
from .interpolation import toward_start
from .lora import ADAPTER_DIR, LoraSpec, add_lora, merge_lora, save_adapter
from ..objectives.losses import AdaptLoss
from ..objectives.registry import entries
from .output import write_output, written_marker
from .training_state import finish_state
from ..layers.layer_source import ResidentLayers, same_prefix


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
    optimizer state on every process (``trainer.Trainer`` calls it in this order: build, wrap, then each micro-batch
    ``synchronizing``, and ``write_out``; the step's precision, loss scaling, clip and AdamW step are the trainer's
    ``optimizer_step.OptimizerStep``)."""

    teacher_gathers = False  # each process runs its own teacher: a micro-batch takes stored states where it has them
    casts_parameters = False  # float32 parameters: the forward autocasts

    def __init__(self, config: AdaptConfig, weights: dict[str, float], checkpoint: str):
        from ...checkpoint.placement import this_launch

        self.config, self.weights, self.checkpoint = config, weights, checkpoint
        parallelism = config.parallelism
        if os.environ.get("ACCELERATE_USE_FSDP", "").lower() in {"true", "1", "yes"}:
            raise LadderizeError("an Accelerate FSDP config runs the sharded training (--shard fsdp; "
                                 "adapt/plan/accelerate_config.py), not this replicated one: launch it without the FSDP config")
        device, self.precision = parallelism.placement()
        if this_launch().by_launcher:  # the one process group (gloo on a CPU, NCCL on CUDA), on this process's device
            device = process_group.start(device)
        elif device.type == "cuda" and device.index is not None:
            torch.cuda.set_device(device)
        self.device = device
        launch = this_launch()
        self.rank, self.world = launch.rank, launch.world
        self.precision.apply()
        self.peft_model = None

    def build(self, data, say: Callable[[str], None]) -> None:
        """Load the student and (where an objective needs it) the teacher whole, pick the trained parameters, and
        build the loss."""
        from ...checkpoint.io import load_model

        config, weights, checkpoint = self.config, self.weights, self.checkpoint
        scope, objective = config.scope, config.objective
        student = load_model(checkpoint, dtype=torch.float32)
        with_teacher = needs_teacher(config, weights)
        self.teacher_path = objective.teacher_for(checkpoint, needed=with_teacher)
        teacher = load_teacher(self.teacher_path, student) if with_teacher else None
        if scope.head_grouping:  # before ``wrap``, on the run's device
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

    def wrap(self) -> None:
        """The loss module on the run's device; over several processes wrapped in DDP, which averages the gradients
        (an all-reduce in buckets, overlapping the backward)."""
        from torch.nn.parallel import DistributedDataParallel

        self.state_module.to(self.device)
        self.loss_module = self.state_module
        if self.world > 1:
            # training every parameter with no objective over the LM head leaves the unconverted layers unused
            unused = self.config.scope.train == "all" and not any(objective.head for objective in entries(self.weights))
            index = [self.device.index] if self.device.type == "cuda" else None
            self.loss_module = DistributedDataParallel(self.state_module, device_ids=index,
                                                       output_device=index[0] if index else None,
                                                       find_unused_parameters=unused)

    def synchronizing(self, last: bool):
        """The context of a micro-batch's forward and backward: DDP's gradient all-reduce only on the last one."""
        return self.loss_module.no_sync() if self.world > 1 and not last else contextlib.nullcontext()

    def write_out(self, result: AdaptResult, out: Path, tokenizer, state_dir: Path) -> None:
        """OUT from the whole student, by the main process while the others wait on the file system
        (``process_group.written_by_main``): LoRA merged (its adapter beside), interpolated towards the start where
        asked; then the training state removed unless kept."""
        config = self.config

        def write() -> None:
            final = self.state_module.student
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

        process_group.written_by_main(written_marker(out), write)
