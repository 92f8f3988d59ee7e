"""Sequential layer-local distillation: converted layers trained one after another on cached states.

The ``local`` objective can be run two ways:

- ``joint`` (``joint.py``): every converted layer trains at every step, each on the
  states of the current batch.
- ``sequential`` (this module's pieces, run by ``sequential_run.py``): the layers are
  trained in order, bottom to top, each for ``epochs`` passes over a fixed calibration set,
  before the next one starts. The states entering the current layer are computed once per
  layer for the whole set and cached, so a training step runs one layer forward and
  backward and nothing else: no embedding, no frozen prefix, no LM head.

With ``local_inputs="student"`` (the default here) layer k is fed the student's own states,
produced by layers that are already adapted, and learns to reproduce the teacher's residual
stream after each of its modules (see ``objectives.layer_error``); it therefore also
corrects the drift that the layers below it leave. With ``"teacher"`` it is fed the
teacher's states and matches the teacher's module updates (block-local).

Memory: the modules in use (one layer, or the embedding while the first states are
computed; ``layer_source.py``) and four ``[N, S, D]`` state pairs (teacher and student, in and
out) of the calibration set, in the model's dtype, in memory or on disk (``state_store.py``).
"""

from __future__ import annotations

import gc
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from .data import batch_order
from .objectives import layer_error
from .state_store import StateStore
from .residual_states import State, attention_kwargs

if TYPE_CHECKING:
    from .layer_source import ResidentLayers, StreamedLayers

    LayerSource = ResidentLayers | StreamedLayers

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
    """The (teacher, student) states of the calibration set entering the current layer.

    ``teacher`` is a layer source (``layer_source.py``): the cache asks it for the embedding and
    the layers below ``first``, one module at a time, to compute the first states. The states
    come from ``store`` (memory or disk, ``state_store.py``) and are computed ``CHUNK`` sequences at
    a time, in the same chunks whatever the source.
    """

    def __init__(self, teacher: LayerSource, data: torch.Tensor, first: int, store: StateStore | None = None):
        self.teacher, self.data = teacher, data
        self.store = store or StateStore()
        self._kwargs: dict[int, dict] = {}
        self.layer = first
        with torch.no_grad():
            with teacher.embedding() as embed_tokens:
                embeds = self._map(lambda _none, rows: (embed_tokens(data[rows]),) * 2, None)
            self.dtype = embeds[0].dtype
            for index in range(first):
                with teacher.layer(index) as layer:
                    embeds = self._through(layer, embeds)
        self.teacher_state = embeds
        self.student_state = embeds  # the layers below ``first`` are shared, frozen and identical

    def kwargs(self, batch: int) -> dict:
        """Attention kwargs for ``batch`` full-length sequences (equal for every such batch)."""
        if batch not in self._kwargs:
            self._kwargs[batch] = attention_kwargs(self.teacher.model, batch, self.data.shape[1], self.dtype)
        return self._kwargs[batch]

    def _map(self, fn: Callable[[State | None, slice], State], state: State | None) -> State:
        outs: State | None = None
        for start in range(0, self.data.shape[0], CHUNK):
            rows = slice(start, min(start + CHUNK, self.data.shape[0]))
            part = None if state is None else (state[0][rows], state[1][rows])
            new = fn(part, rows)
            if outs is None:
                outs = tuple(self.store.empty((self.data.shape[0], *t.shape[1:]), t.dtype) for t in new)
            for out, tensor in zip(outs, new):
                out[rows] = tensor
        return outs

    def _through(self, layer: torch.nn.Module, state: State) -> State:
        """``layer`` (the current one, of the teacher or the student) applied to ``state``, chunk by chunk."""
        return self._map(lambda s, rows: layer(s[0], s[1], **self.kwargs(rows.stop - rows.start)), state)

    @torch.no_grad()
    def teacher_output(self, teacher_layer: torch.nn.Module) -> State:
        """The teacher's states leaving the current layer (``teacher_layer``)."""
        return self._through(teacher_layer, self.teacher_state)

    @torch.no_grad()
    def advance(self, student_layer: torch.nn.Module, teacher_out: State) -> None:
        """Move both state sets past the current layer (the student through its adapted ``student_layer``)."""
        self.student_state = self._through(student_layer, self.student_state)
        self.teacher_state = teacher_out
        self.layer += 1


def train_layer(
    cache: StateCache,
    layer: torch.nn.Module,
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
    progress: Callable[[LayerStep], None] | None = None,
    autocast: torch.dtype | None = None,
) -> list[float]:
    """Train the student's current layer (``layer``, a ``LadderDecoderLayer``) on the cached states; return its losses per step.

    ``autocast`` (``--mixed-precision bf16``): the forward pass and the loss run under ``torch.autocast`` to that dtype."""
    from .lr_curve import warmup_cosine

    index = cache.layer
    mode = layer.mode
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
        with torch.autocast(inputs[0].device.type, dtype=autocast or torch.float32, enabled=autocast is not None):
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
        if progress is not None:
            progress(LayerStep(index, step + 1, total, losses[-1], current_lr))
    for param in params:
        param.requires_grad_(False)
        param.grad = None
    # torch's optimizer and scheduler hold each other in reference cycles: collect them now, or the
    # layer's AdamW state (twice the layer) waits for the cyclic garbage collector, layer after layer
    del optimizer, scheduler
    gc.collect()
    return losses
