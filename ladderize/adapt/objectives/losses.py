"""The adaptation objectives: ``lm``, ``kd`` and ``local``, combinable with weights.

- ``lm``: next-token cross-entropy of the student.
- ``kd``: KL(teacher || student) over the vocabulary, per token (temperature ``kd_temperature``);
  ``kd_divergence="reverse"`` takes KL(student || teacher) instead, which is mode-seeking: the
  student puts its mass on the teacher's likeliest tokens rather than spreading it over all of
  the teacher's alternatives.
- ``local``: block- or module-local distillation; needs no LM head and backpropagates
  through one layer at a time.

  For an **SPD** layer it is the SPD paper's block-to-block MSE: the block, fed the
  teacher's input ``X`` of that layer, must reproduce the teacher's output.

  For a **ladder** layer (our analogue) each module is distilled on its own. The ladder
  attention module k reads ``norm(r_{k-2})`` instead of ``norm(r_{k-1})``; fed the teacher's
  own ``(r_{k-1}, r_{k-2})`` it must produce the update the dense module made from
  ``r_{k-1}``. The MLP module likewise, from the teacher's ``r_{k-1}`` (the layer's input)
  instead of the post-attention state. Matching each module's update separately keeps
  the attention and MLP errors from cancelling in the sum.

  Every error is divided by the mean square of the teacher's update (a relative squared
  error), so layers whose residual updates differ in scale weigh the same.

  ``local_inputs="student"`` feeds each converted layer the student's own (detached)
  states instead and matches the teacher's residual stream after each module; the layer
  then also learns to correct the drift of the layers below it.

  ``local_inputs="stack"`` (deep supervision; joint stages) is the same error on the student's own
  states with the graph kept through the stack: one pass of the student gives every layer's
  error and, with ``kd`` or ``lm``, the head's loss, and each layer's error also trains the
  layers below it.

``lm`` and ``kd`` hold two ``[B, S, V]`` tensors, the student's logits and their gradient:
``blockwise_head_losses`` computes each loss and its gradient a block of tokens at a time
(``LOGIT_BLOCK_BYTES`` of float32 logits per block, ``BlockwiseLoss``), and the teacher's
logits exist one block at a time. At SmolLM2's 49,152-token vocabulary a 2 x 512 batch has
200 MB of logits per tensor; computed whole, the kd loss and its backward allocated about a
dozen such tensors per step, each mapped fresh from the kernel.

Each objective is an entry of ``registry.OBJECTIVES`` (an ``Objective``): what it reads of the student and
the teacher (declared in the registry, which imports no torch), and its loss (implemented here, ``implement``). The teacher's pass and the loss (``AdaptLoss``), the FLOP count and the memory estimate (``cost.py``), and
which stages can read the teacher's stored states (``teacher_states.py``) read an entry's traits, never its name
(docs/architecture.md, "Adding an objective").
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ...errors import LadderizeError
from ...model import LadderLlamaForCausalLM
from ...model.layout import LayerMode
from ...checkpoint.placement import inductor_options
from ...convert.residual_states import State, attention_kwargs, embed, logits_from, run_layers
from .registry import (DIVERGENCES, LOCAL_INPUTS, TEACHER_FINAL, TEACHER_LAYERS, check_top_k, entries, implement,
                                 logit_block_rows)

BlockLoss = Callable[[torch.Tensor, slice], torch.Tensor]  # one block's summed loss from its float32 logits and rows
# keeps the heads of the models it is given gathered inside its block, where a strategy shards them (FSDP2's
# ``train/fsdp.head_gathered``); None where no head is sharded
GatherHeads = Callable[..., contextlib.AbstractContextManager[None]]


@dataclass
class LossInputs:
    """What an objective's loss reads for one batch: the loss module (the models and the objectives' settings), the
    tokens, the teacher's pass, and the student's residual stream entering its final norm where an objective reads it."""

    module: AdaptLoss
    input_ids: torch.Tensor
    teacher: TeacherPass | None
    final: torch.Tensor | None = None


def relative_sq_error(prediction: torch.Tensor, target: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``mean((prediction - target)^2) / mean(scale^2)`` with the denominator treated as a constant."""
    denominator = scale.detach().float().pow(2).mean().clamp_min(1e-12)
    return (prediction.float() - target.float()).pow(2).mean() / denominator


@dataclass
class TeacherPass:
    """What the teacher computed for one batch: per-layer inputs and outputs, and its last residual stream."""

    inputs: dict[int, tuple[torch.Tensor, torch.Tensor]]  # layer -> (residual, stale) entering it
    outputs: dict[int, tuple[torch.Tensor, torch.Tensor]]  # layer -> (residual, stale) leaving it
    final: torch.Tensor | None  # [B, S, D] entering the final norm (kd only)


class AdaptLoss(nn.Module):
    """Student plus a frozen teacher; ``forward(input_ids)`` returns each objective's loss.

    The student is the only registered submodule, so DDP or FSDP2 wraps and
    synchronises exactly the trained model; the teacher stays a plain frozen attribute.
    When the layers below the first converted one are frozen and identical in both models,
    the teacher's prefix states are reused for the student (computed once).
    """

    def __init__(
        self,
        student: LadderLlamaForCausalLM,
        teacher: LadderLlamaForCausalLM | None,
        weights: dict[str, float],
        local_inputs: str = "teacher",
        kd_temperature: float = 1.0,
        share_prefix: bool = False,
        kd_divergence: str = "forward",
        kd_top_k: int = 0,
        compiled: bool = False,
        gather_heads: GatherHeads | None = None,
    ):
        super().__init__()
        self.gather_heads = gather_heads
        self.compiled = compiled  # the kd loss's blocks through torch.compile (compilation.py; the layers are compiled apart)
        if local_inputs not in LOCAL_INPUTS:
            raise LadderizeError(f"local inputs must be one of {', '.join(LOCAL_INPUTS)}, got {local_inputs!r}")
        self.entries = entries(weights)
        if missing := [objective.name for objective in self.entries if not objective.implemented]:
            raise LadderizeError(f"objective {', '.join(missing)} is declared without a loss (registry.implement)")
        comparing = [objective.name for objective in self.entries if objective.needs_teacher]
        if comparing and teacher is None:
            raise LadderizeError(f"objective{'s' if len(comparing) > 1 else ''} {' and '.join(comparing)} "
                                 f"need{'' if len(comparing) > 1 else 's'} a teacher model")
        self.student = student
        object.__setattr__(self, "teacher", teacher)  # not a submodule: never wrapped, never trained
        self.weights = dict(weights)
        self.local_inputs = local_inputs
        self.kd_temperature = kd_temperature
        if kd_divergence not in DIVERGENCES:
            raise LadderizeError(f"kd divergence must be one of {', '.join(DIVERGENCES)}, got {kd_divergence!r}")
        self.kd_divergence = kd_divergence
        check_top_k(kd_top_k, kd_divergence)
        self.kd_top_k = kd_top_k
        layout = student.layout
        self.converted = layout.converted_layers
        for objective in self.entries:
            if not self.converted and objective.teacher == TEACHER_LAYERS:
                raise LadderizeError(f"the checkpoint has no converted layers: objective {objective.name} has nothing to distil")
        self.modes = layout.modes
        self.first = min(self.converted) if self.converted else student.config.num_hidden_layers
        self.share_prefix = share_prefix and teacher is not None

    def forward(self, input_ids: torch.Tensor, stored: tuple[torch.Tensor, ...] | None = None) -> dict[str, torch.Tensor]:
        """``stored``: the teacher's ``(residual, stale)`` entering the first converted layer and its final residual
        stream for these sequences (``teacher_states.py``), in place of running the teacher; only with the shared
        prefix and with objectives that need of the teacher no more than those states (``Objective.reads_stored_teacher``;
        not ``local``, which needs its states at every converted layer)."""
        want_final = any(objective.teacher == TEACHER_FINAL for objective in self.entries)
        if stored is not None:
            if not self.share_prefix or not all(objective.reads_stored_teacher for objective in self.entries):
                raise LadderizeError("stored teacher states need the shared prefix and no local objective")
            teacher = self._stored_states(input_ids, stored)
        else:
            teacher = self._teacher_states(input_ids, want_final) if self.teacher is not None else None
        inputs = LossInputs(self, input_ids, teacher)
        losses: dict[str, torch.Tensor] = {}
        reads_final = any(objective.reads_final for objective in self.entries)
        layers = self.student.config.num_hidden_layers
        stop = layers if reads_final or not self.converted else max(self.converted) + 1
        for objective in self.entries:  # a loss along the student's own pass (deep supervision): one pass gives both
            if objective.pass_loss is not None and (along := objective.pass_loss(inputs, stop)) is not None:
                stream, losses[objective.name] = along
                if reads_final and inputs.final is None:
                    inputs.final = stream
        if reads_final and inputs.final is None:
            inputs.final = self._student_final(input_ids, teacher)
        heads = {objective.name: functools.partial(objective.block_loss, inputs)
                 for objective in self.entries if objective.head}
        if heads:
            gathered = (self.teacher,) if any(objective.teacher_head for objective in self.entries) else ()
            losses.update(blockwise_head_losses(self.student, inputs.final, heads, gathered, self.gather_heads))
        for objective in self.entries:
            if objective.name not in losses:
                losses[objective.name] = objective.loss(inputs)
        losses["total"] = sum(self.weights[objective.name] * losses[objective.name] for objective in self.entries)
        return losses

    @torch.no_grad()
    def _teacher_states(self, input_ids: torch.Tensor, want_final: bool) -> TeacherPass:
        """The teacher's pass: its states at each converted layer where an objective compares them (``TEACHER_LAYERS``),
        else only the state entering the first converted layer (the student's start with a shared prefix); its final
        stream where ``want_final``."""
        teacher = self.teacher
        state, attn_kwargs = embed(teacher, input_ids)
        inputs, outputs = {}, {}
        every_layer = any(objective.teacher == TEACHER_LAYERS for objective in self.entries)
        last = teacher.config.num_hidden_layers if want_final else max(self.converted) + 1
        for index in range(last):
            if index in self.converted and (every_layer or index == self.first):
                inputs[index] = state
            state = run_layers(teacher, state, attn_kwargs, index, index + 1)
            if every_layer and index in self.converted:
                outputs[index] = state
        self._teacher_kwargs = attn_kwargs
        return TeacherPass(inputs, outputs, state[0] if want_final else None)

    def _stored_states(self, input_ids: torch.Tensor, stored: tuple[torch.Tensor, ...]) -> TeacherPass:
        residual, stale, final = stored
        self._teacher_kwargs = attention_kwargs(self.teacher, *input_ids.shape, residual.dtype, residual.device)
        return TeacherPass({self.first: (residual, stale)}, {}, final)

    def _student_start(self, input_ids: torch.Tensor, teacher: TeacherPass | None):
        """The student's state entering its first converted layer, and its attention kwargs."""
        if self.share_prefix and teacher is not None and self.first in teacher.inputs:
            return teacher.inputs[self.first], self._teacher_kwargs, self.first
        state, attn_kwargs = embed(self.student, input_ids)
        return state, attn_kwargs, 0

    def _student_final(self, input_ids: torch.Tensor, teacher: TeacherPass | None) -> torch.Tensor:
        """The student's residual stream entering its final norm, ``[B, S, D]``."""
        state, attn_kwargs, start = self._student_start(input_ids, teacher)
        return run_layers(self.student, state, attn_kwargs, start, self.student.config.num_hidden_layers)[0]

    def _student_errors(self, input_ids: torch.Tensor, teacher: TeacherPass, stop: int,
                        cut_graph: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """The student's own pass from its first converted layer (or its embedding) to layer ``stop``: its residual
        stream leaving layer ``stop - 1`` and the mean error of its converted layers against the teacher's states.

        ``cut_graph``: each layer's inputs are detached and the unconverted layers run without grad, so a layer learns
        from its own error only (``local_inputs="student"``); else the graph is kept through the stack and each error
        also trains the layers below it (``"stack"``, deep supervision)."""
        state, attn_kwargs, start = self._student_start(input_ids, teacher)
        layers, total = self.student.model.layers, 0.0
        for index in range(start, stop):
            if cut_graph:
                state = (state[0].detach(), state[1].detach())
            with torch.no_grad() if cut_graph and index not in self.converted else contextlib.nullcontext():
                out = layers[index](state[0], state[1], **attn_kwargs)
            if index in self.converted:
                total = total + layer_error(self.modes[index], teacher.inputs[index], out, teacher.outputs[index], "student")
            state = out
        return state[0], total / len(self.converted)

    def _local_loss(self, input_ids: torch.Tensor, teacher: TeacherPass) -> torch.Tensor:
        if self.local_inputs == "teacher":
            layers, total, attn_kwargs = self.student.model.layers, 0.0, self._teacher_kwargs
            for index in self.converted:
                t_in, t_out = teacher.inputs[index], teacher.outputs[index]
                s_out = layers[index](t_in[0], t_in[1], **attn_kwargs)
                total = total + layer_error(self.modes[index], t_in, s_out, t_out, self.local_inputs)
            return total / len(self.converted)
        # student inputs: run the student from its first converted layer, cutting the graph between layers
        if not self.share_prefix:
            raise LadderizeError("local distillation on the student's own states needs the layers below the converted ones frozen (--train converted or lora)")
        return self._student_errors(input_ids, teacher, max(self.converted) + 1, cut_graph=True)[1]


def update_sums(mode: LayerMode, t_in: State, t_out: State) -> torch.Tensor:
    """The sums of squares (float32, ``[2]`` where the layer syncs its attention, else ``[1]``) of the teacher's updates
    that ``layer_error``'s relative errors divide by, over the rows of ``t_in``/``t_out``: summed over the processes
    that hold a batch's rows, they are ``layer_error``'s ``shared`` sums."""
    if mode.syncs_attention:
        scales = (t_out[1] - t_in[0], t_out[0] - t_out[1])
    else:
        scales = (t_out[0] - t_in[0],)
    return torch.stack([scale.detach().float().pow(2).sum() for scale in scales])


def layer_error(mode: LayerMode, t_in: State, s_out: State, t_out: State, local_inputs: str,
                shared: tuple[torch.Tensor, int] | None = None) -> torch.Tensor:
    """Relative squared error of one layer: per module where the layer syncs its attention, else per block.

    ``t_in``/``t_out`` are the teacher's ``(residual, stale)`` entering and leaving the layer,
    ``s_out`` the student's leaving it. With teacher inputs the student's module *updates* are
    compared; with student inputs, its residual stream after each module.

    ``shared``: ``t_in``, ``s_out`` and ``t_out`` hold only this process's rows of a batch whose other rows other
    processes hold (data parallelism); ``(sums, total)`` are the whole batch's ``update_sums`` (summed over the
    processes) and its element count. The result is these rows' share of the batch's error,
    ``sum((prediction - target)^2) / total / (sum / total)`` per term, so the shares of all processes sum to the
    error of the batch.
    """
    if shared is not None:
        sums, total = shared
        denominators = (sums / total).clamp_min(1e-12)
        if mode.syncs_attention:
            if local_inputs == "teacher":
                pairs = ((s_out[1] - t_in[0], t_out[1] - t_in[0]), (s_out[0] - s_out[1], t_out[0] - t_out[1]))
            else:
                pairs = ((s_out[1], t_out[1]), (s_out[0], t_out[0]))
        else:
            pairs = ((s_out[0], t_out[0]),)
        return sum((p.float() - t.float()).pow(2).sum() / total / d for (p, t), d in zip(pairs, denominators))

    if mode.syncs_attention:
        # the returned stale state of a synced layer is its post-attention residual
        attn_update = t_out[1] - t_in[0]
        mlp_update = t_out[0] - t_out[1]
        if local_inputs == "teacher":
            s_attn = s_out[1] - t_in[0]
            s_mlp = s_out[0] - s_out[1]
            return relative_sq_error(s_attn, attn_update, attn_update) + relative_sq_error(s_mlp, mlp_update, mlp_update)
        return relative_sq_error(s_out[1], t_out[1], attn_update) + relative_sq_error(s_out[0], t_out[0], mlp_update)
    update = t_out[0] - t_in[0]
    return relative_sq_error(s_out[0], t_out[0], update)


def kd_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float = 1.0,
            divergence: str = "forward", top_k: int = 0) -> torch.Tensor:
    """Mean per-token KL(teacher || student) at ``temperature`` (scaled by T^2 as usual).

    ``divergence="reverse"``: KL(student || teacher). ``top_k``: the teacher's distribution over its
    ``top_k`` likeliest tokens, renormalized, against the student's over the whole vocabulary.
    """
    vocab = student_logits.shape[-1]
    s = F.log_softmax(student_logits.float().reshape(-1, vocab) / temperature, dim=-1)
    teacher_rows = teacher_logits.float().reshape(-1, vocab) / temperature
    if 0 < top_k < vocab:
        top, index = teacher_rows.topk(top_k, dim=-1)
        t = F.log_softmax(top, dim=-1)
        return (t.exp() * (t - s.gather(-1, index))).sum() / s.shape[0] * temperature**2
    t = F.log_softmax(teacher_rows, dim=-1)
    if divergence == "reverse":
        s, t = t, s  # kl_div(input, target) is KL(target || input)
    return F.kl_div(s, t, log_target=True, reduction="batchmean") * temperature**2


@functools.lru_cache(maxsize=None)
def compiled_kd_loss(device_type: str) -> Callable[..., torch.Tensor]:
    """``kd_loss`` through ``torch.compile`` for ``device_type`` (one graph per block shape and setting), compiled
    once a process."""
    return torch.compile(kd_loss, dynamic=False, options=inductor_options(device_type))


def blockwise_kd(logits: torch.Tensor, teacher_logits: Callable[[slice], torch.Tensor], temperature: float = 1.0,
                 divergence: str = "forward", top_k: int = 0, compiled: bool = False) -> torch.Tensor:
    """``kd_loss`` of the student's ``[rows, V]`` logits, ``logit_block_rows`` rows at a time (``BlockwiseLoss``);
    ``teacher_logits(part)`` gives the teacher's logits of those rows (computed without grad, one block at a time).
    ``compiled``: each block's loss and gradient through ``torch.compile`` (``compiled_kd_loss``)."""
    kd_block = _kd_block_loss(teacher_logits, temperature, divergence, top_k, compiled, logits.device.type)
    return BlockwiseLoss.apply(logits, kd_block, logit_block_rows(logits.shape[-1])) / logits.shape[0]


def _kd_block_loss(teacher_logits: Callable[[slice], torch.Tensor], temperature: float, divergence: str, top_k: int,
                   compiled: bool, device_type: str) -> Callable[[torch.Tensor, slice], torch.Tensor]:
    """One block's summed kd loss from the student's float32 logits of rows ``part`` (the teacher's computed then)."""
    loss_of = compiled_kd_loss(device_type) if compiled else kd_loss

    def kd_block(block: torch.Tensor, part: slice) -> torch.Tensor:
        with torch.no_grad():
            teacher_block = teacher_logits(part)
        return loss_of(block, teacher_block, temperature, divergence, top_k) * block.shape[0]

    return kd_block


def lm_block_loss(input_ids: torch.Tensor) -> BlockLoss:
    """One block's summed next-token cross-entropy; the last position of every sequence predicts nothing."""
    targets = F.pad(input_ids[:, 1:], (0, 1), value=-100).reshape(-1)
    return lambda block, part: F.cross_entropy(block, targets[part], ignore_index=-100, reduction="sum")


def teacher_kd_block_loss(teacher: LadderLlamaForCausalLM, teacher_final: torch.Tensor, temperature: float,
                          divergence: str, top_k: int, compiled: bool, device_type: str) -> BlockLoss:
    """One block's summed kd loss against the teacher's logits of the same rows, computed from its final stream then
    (with its head gathered where it is sharded: called inside ``blockwise_head_losses``)."""
    teacher_normed = teacher.model.norm(teacher_final.reshape(-1, teacher_final.shape[-1]))
    teacher_head = frozen_head(teacher.lm_head)
    return _kd_block_loss(lambda part: teacher_head(teacher_normed[part]), temperature, divergence, top_k, compiled,
                          device_type)


def blockwise_head_losses(student: LadderLlamaForCausalLM, final: torch.Tensor,
                          heads: dict[str, Callable[[], tuple[BlockLoss, int]]],
                          gathered: tuple[LadderLlamaForCausalLM, ...] = (),
                          gather_heads: GatherHeads | None = None) -> dict[str, torch.Tensor]:
    """Each of ``heads``' losses over the student's logits from its last residual stream ``final``: ``heads[name]()``
    gives one block's summed loss and the count the sum divides by; ``gathered``: other models whose heads the losses
    run, kept gathered with the student's by ``gather_heads`` where a strategy shards them.

    Each loss runs ``logit_block_rows`` tokens at a time. A plain ``nn.Linear`` student head runs inside the blocks too
    (``BlockwiseHeadLoss``), so the student's ``[B*S, V]`` logits never exist whole; any other head computes them once
    and the blocks read them (``BlockwiseLoss``).
    """
    batch, seq, _ = final.shape
    rows = batch * seq
    with contextlib.ExitStack() as stack:
        # a sharded head (the teacher's, or the student's where it is the teacher's): gathered once, not once per block
        if gather_heads is not None:
            stack.enter_context(gather_heads(*gathered, student))
        built = {name: build() for name, build in heads.items()}
        block_losses = tuple(block_loss for block_loss, _ in built.values())
        head = student.lm_head
        if type(head) is nn.Linear and head.bias is None:
            normed = student.model.norm(final).reshape(rows, -1)
            totals = BlockwiseHeadLoss.apply(normed, head.weight, block_losses,
                                             logit_block_rows(head.weight.shape[0], final.device.type))
        else:
            logits = logits_from(student, final).reshape(rows, -1)  # [B*S, V]
            block_rows = logit_block_rows(logits.shape[-1], final.device.type)
            totals = [BlockwiseLoss.apply(logits, block_loss, block_rows) for block_loss in block_losses]
    return {name: totals[index] / count for index, (name, (_, count)) in enumerate(built.items())}


class BlockwiseHeadLoss(torch.autograd.Function):
    """``[sum over row blocks of loss(rows[block] @ weight.T, block) for loss in block_losses]``: the LM head and
    its losses a block of rows at a time.

    Forward computes each block's logits (in autocast's dtype where it is on, float32 for the losses), every loss
    and its gradient with respect to the block, and from it the gradients of the rows and, when the head trains,
    of its weight; backward only scales them. Memory is one block's logits, the rows' gradient per loss and the
    weight's: the ``[rows, V]`` logits never exist whole (at a 128K vocabulary and 32K tokens a step they would
    take 8 GiB in bf16, their gradient as much again).
    """

    @staticmethod
    def forward(ctx, rows: torch.Tensor, weight: torch.Tensor, block_losses, block_rows: int) -> torch.Tensor:
        device = rows.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else rows.dtype
        with torch.no_grad():
            w = weight.detach().to(dtype)
            x = rows.detach().to(dtype)
        want_rows, want_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        row_grads = [torch.zeros_like(rows) for _ in block_losses] if want_rows else []
        weight_grads = [torch.zeros_like(weight, dtype=torch.float32) for _ in block_losses] if want_weight else []
        totals = torch.zeros(len(block_losses), dtype=torch.float32, device=rows.device)
        for start in range(0, rows.shape[0], block_rows):
            part = slice(start, start + block_rows)
            with torch.no_grad():
                logits = F.linear(x[part], w)
            block = logits.float().requires_grad_(want_rows or want_weight)
            for index, block_loss in enumerate(block_losses):
                with torch.enable_grad():
                    loss = block_loss(block, part)
                totals[index] += loss.detach()
                if want_rows or want_weight:
                    grad = torch.autograd.grad(loss, block)[0].to(dtype)
                    with torch.no_grad():
                        if want_rows:
                            row_grads[index][part] = (grad @ w).to(rows.dtype)
                        if want_weight:
                            weight_grads[index] += (grad.t() @ x[part]).float()
        ctx.save_for_backward(*row_grads, *weight_grads)
        ctx.counts = (len(row_grads), len(weight_grads), weight.dtype)
        return totals

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        saved = ctx.saved_tensors
        n_rows, n_weight, weight_dtype = ctx.counts
        rows_grad = sum(g * grad_output[i].to(g.dtype) for i, g in enumerate(saved[:n_rows])) if n_rows else None
        weight_grad = (sum(g * grad_output[i] for i, g in enumerate(saved[n_rows:n_rows + n_weight])).to(weight_dtype)
                       if n_weight else None)
        return rows_grad, weight_grad, None, None


def frozen_head(head: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """A frozen LM head as a function of the normed rows, its weight cast once to autocast's dtype: autocast casts a
    weight that needs no gradient again at every call (on SmolLM2, 28M parameters for every block of 128 tokens;
    the same bits, once). A head that is not a plain ``nn.Linear`` (sharded, adapted) is called as it is."""
    weight = getattr(head, "weight", None)
    device = weight.device.type if weight is not None else "cpu"
    if type(head) is not nn.Linear or hasattr(weight, "placements") or not torch.is_autocast_enabled(device):
        return head
    dtype = torch.get_autocast_dtype(device)
    weight, bias = weight.to(dtype), None if head.bias is None else head.bias.to(dtype)
    return lambda rows: F.linear(rows, weight, bias)


class BlockwiseLoss(torch.autograd.Function):
    """``sum over row blocks of block_loss(logits[block].float(), block)``, its gradient computed block by block.

    Forward runs each block's loss and its gradient with respect to the block (autograd on
    a float32 copy of ``block_rows`` rows) and keeps the gradient; backward only scales it.
    So the loss's temporaries exist one block at a time and nothing is recomputed: the
    ``[rows, V]`` tensors are the logits and their gradient.
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, block_loss, block_rows: int) -> torch.Tensor:
        wants_grad = ctx.needs_input_grad[0]
        grad = torch.empty_like(logits) if wants_grad else None
        total = logits.new_zeros((), dtype=torch.float32)
        for start in range(0, logits.shape[0], block_rows):
            part = slice(start, start + block_rows)
            block = logits[part].detach().float().requires_grad_(wants_grad)
            with torch.enable_grad():
                loss = block_loss(block, part)
            if wants_grad:
                grad[part] = torch.autograd.grad(loss, block)[0]
            total += loss.detach()
        ctx.save_for_backward(grad)
        return total

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        (grad,) = ctx.saved_tensors
        return grad * grad_output.to(grad.dtype), None, None


def _lm_block(inputs: LossInputs) -> tuple[BlockLoss, int]:
    batch, seq = inputs.input_ids.shape
    return lm_block_loss(inputs.input_ids), batch * (seq - 1)


def _kd_block(inputs: LossInputs) -> tuple[BlockLoss, int]:
    module, final = inputs.module, inputs.final
    return (teacher_kd_block_loss(module.teacher, inputs.teacher.final, module.kd_temperature, module.kd_divergence,
                                  module.kd_top_k, module.compiled, final.device.type), final.shape[0] * final.shape[1])


def _local_loss(inputs: LossInputs) -> torch.Tensor:
    return inputs.module._local_loss(inputs.input_ids, inputs.teacher)


def _local_along_the_stack(inputs: LossInputs, stop: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``local_inputs="stack"``: the error of every converted layer along the student's own pass, the graph kept."""
    if inputs.module.local_inputs != "stack":
        return None
    return inputs.module._student_errors(inputs.input_ids, inputs.teacher, stop, cut_graph=False)


implement("lm", block_loss=_lm_block)
implement("kd", block_loss=_kd_block)
implement("local", loss=_local_loss, pass_loss=_local_along_the_stack)
