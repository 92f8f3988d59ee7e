"""Sequential layer-local distillation: converted layers trained one after another on cached states.

The ``local`` objective can be run two ways:

- ``joint`` (``trainer.py``): every converted layer trains at every step, each on the
  states of the current batch.
- ``sequential`` (this module): the layers are trained in order, bottom to top, each for
  ``epochs`` passes over a fixed calibration set, before the next one starts. The states
  entering the current layer are computed once per layer for the whole set and kept in
  memory, so a training step runs one layer forward and backward and nothing else: no
  embedding, no frozen prefix, no LM head.

With ``local_inputs="student"`` (the default here) layer k is fed the student's own states,
produced by layers that are already adapted, and learns to reproduce the teacher's residual
stream after each of its modules (see ``objectives.layer_error``); it therefore also
corrects the drift that the layers below it leave. With ``"teacher"`` it is fed the
teacher's states and matches the teacher's module updates (block-local).

Memory: four ``[N, S, D]`` state pairs (teacher and student, in and out) of the calibration
set, in the model's dtype.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..model import LadderLlamaForCausalLM
from .data import batch_order
from .objectives import layer_error
from .stream import State, embed, run_layers

CHUNK = 4  # sequences per no-grad forward when (re)computing the cached states


@dataclass
class LayerStep:
    """One optimizer step of the sequential schedule."""

    layer: int
    step_in_layer: int
    steps_per_layer: int
    loss: float
    lr: float


def steps_per_layer(num_sequences: int, epochs: float, batch_size: int) -> int:
    """Optimizer steps each converted layer takes: ``epochs`` passes over the calibration set."""
    return max(1, math.ceil(epochs * num_sequences / batch_size))


def layer_summary(curve: list[dict]) -> list[dict]:
    """Per trained layer of a sequential curve: its steps and its loss before and after training.

    ``before`` is the loss of the layer's first step (computed before its first update, so
    it is the unadapted layer's error on that batch); ``after`` is its last step's loss.
    """
    layers: dict[int, dict] = {}
    for record in curve:
        layer = record.get("layer")
        if layer is None:
            continue
        loss = record.get("loss_local", record.get("loss_total"))
        entry = layers.setdefault(layer, {"layer": layer, "steps": 0, "before": loss, "after": loss})
        entry["steps"] += 1
        entry["after"] = loss
    return [layers[k] for k in sorted(layers)]


def layer_rows(num_sequences: int, layer: int, step: int, batch_size: int, seed: int) -> torch.Tensor:
    """Calibration rows of ``step`` within ``layer``'s training: a pure function, so resume is exact."""
    rows = []
    for position in range(step * batch_size, (step + 1) * batch_size):
        epoch, offset = divmod(position, num_sequences)
        rows.append(batch_order(num_sequences, layer * 1_000 + epoch, seed)[offset])
    return torch.stack(rows)


class StateCache:
    """The (teacher, student) states of the calibration set entering the current layer."""

    def __init__(self, teacher: LadderLlamaForCausalLM, student: LadderLlamaForCausalLM, data: torch.Tensor, first: int):
        self.teacher, self.student, self.data = teacher, student, data
        self._kwargs: dict[int, dict] = {}
        self.layer = first
        with torch.no_grad():
            prefix = self._map(lambda _none, rows: run_layers(teacher, *embed(teacher, data[rows]), 0, first), None)
        self.teacher_state = prefix
        self.student_state = prefix  # the layers below ``first`` are shared, frozen and identical

    def kwargs(self, batch: int) -> dict:
        """Attention kwargs for ``batch`` full-length sequences (equal for every such batch)."""
        if batch not in self._kwargs:
            self._kwargs[batch] = embed(self.teacher, self.data[:batch])[1]
        return self._kwargs[batch]

    def _map(self, fn: Callable[[State | None, torch.Tensor], State], state: State | None) -> State:
        outs = []
        for start in range(0, self.data.shape[0], CHUNK):
            rows = torch.arange(start, min(start + CHUNK, self.data.shape[0]))
            part = None if state is None else (state[0][rows], state[1][rows])
            outs.append(fn(part, rows))
        return torch.cat([o[0] for o in outs]), torch.cat([o[1] for o in outs])

    def _through(self, model: LadderLlamaForCausalLM, state: State) -> State:
        """``model``'s current layer applied to ``state``, chunk by chunk."""
        return self._map(lambda s, rows: run_layers(model, s, self.kwargs(len(rows)), self.layer, self.layer + 1), state)

    @torch.no_grad()
    def teacher_output(self) -> State:
        """The teacher's states leaving the current layer."""
        return self._through(self.teacher, self.teacher_state)

    @torch.no_grad()
    def advance(self, teacher_out: State) -> None:
        """Move both state sets past the current layer (the student through its adapted layer)."""
        self.student_state = self._through(self.student, self.student_state)
        self.teacher_state = teacher_out
        self.layer += 1


def train_layer(
    cache: StateCache,
    teacher_out: State,
    *,
    local_inputs: str,
    epochs: float,
    batch_size: int,
    lr: float,
    min_lr_ratio: float,
    warmup_steps: int,
    max_grad_norm: float,
    seed: int,
    on_step: Callable[[LayerStep], None] | None = None,
) -> list[float]:
    """Train the student's current layer on the cached states; return its losses per step."""
    from .lr_schedule import warmup_cosine

    index = cache.layer
    layer = cache.student.model.layers[index]
    mode = cache.student.layout.modes[index]
    params = list(layer.parameters())
    for param in params:
        param.requires_grad_(True)
    optimizer = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    total = steps_per_layer(cache.data.shape[0], epochs, batch_size)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(total, warmup_steps, min_lr_ratio))
    inputs = cache.student_state if local_inputs == "student" else cache.teacher_state
    torch.manual_seed(seed * 1_000 + index)  # dropout-free, but keep any randomness per layer
    losses = []
    for step in range(total):
        rows = layer_rows(cache.data.shape[0], index, step, batch_size, seed)
        t_in = (cache.teacher_state[0][rows], cache.teacher_state[1][rows])
        t_out = (teacher_out[0][rows], teacher_out[1][rows])
        s_out = layer(inputs[0][rows], inputs[1][rows], **cache.kwargs(len(rows)))
        loss = layer_error(mode, t_in, s_out, t_out, local_inputs)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
        current_lr = scheduler.get_last_lr()[0]
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
        if on_step is not None:
            on_step(LayerStep(index, step + 1, total, losses[-1], current_lr))
    for param in params:
        param.requires_grad_(False)
    return losses
