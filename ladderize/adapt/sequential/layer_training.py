"""Sequential layer-local distillation: converted layers trained one after another on cached states.

The ``local`` objective can be run two ways:

- ``joint`` (``replicated.py``): every converted layer trains at every step, each on the
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
out) of the calibration set (under data parallelism: of this process's sequences, ``LaunchRank``), in the
model's dtype, in memory or on disk (``state_store.py``).

Device: the layer in use computes on the cache's ``device`` (``placement.resolve_device``) at
the run's training precision (``placement.training_precision``: fp32 weights, bf16 autocast and
TF32 on CUDA by default). The states live on that device when they fit, else in pinned host
memory or on disk, and the rows a step or a chunk needs are copied to the device, non-blocking.
"""

from __future__ import annotations

import contextlib
import gc
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ...checkpoint.placement import LaunchRank
from ...convert.residual_states import State, attention_kwargs
from ..train.compilation import adamw
from ..train.optimizer_step import OptimizerStep
from ..plan.batches import batch_order
from ..objectives.losses import layer_error, update_sums
from ..process_group import sum_over_processes
from ..plan.sequential_schedule import steps_per_layer
from .state_store import StateStore

if TYPE_CHECKING:
    from ...checkpoint.placement import TrainingPrecision
    from ..layers.layer_source import ResidentLayers, StreamedLayers

    LayerSource = ResidentLayers | StreamedLayers

CHUNK = 4  # sequences per no-grad forward when (re)computing the cached states


def owned_rows(launch: LaunchRank, count: int) -> torch.Tensor:
    """The indices, among ``count`` sequences, of those this process owns in a data-parallel sequential stage.

    Each process owns the sequences whose index modulo ``world`` is its ``rank`` (the held-out rows after the
    calibration set too), and computes and holds their states only, through every layer. A step's batch is trained
    by each process on the rows of it that it owns; the sums of squares of the teacher's updates that the relative
    errors divide by are summed over the processes first, so each process's loss is its rows' share of the batch's
    (``objectives.layer_error``'s ``shared``), and the gradients and losses summed over the processes
    (``process_group.sum_over_processes``) are one process's on the whole batch: every process takes the step one
    process would.
    """
    return torch.arange(launch.rank, max(count, launch.rank), launch.world)


@dataclass
class LayerStep:
    """One optimizer step of the sequential training."""

    layer: int
    step_in_layer: int
    steps_per_layer: int
    loss: float
    lr: float


@dataclass
class LayerProgress:
    """A window's training after ``steps`` of its steps, what continues it exactly: the losses so far, the evaluation
    loss before its first step, and AdamW's state (``optimizer_tensors``). The weights are the window's own."""

    steps: int
    losses: list[float]
    before: float
    optimizer: dict[str, torch.Tensor]


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """An optimizer's per-parameter state as named tensors (``PARAM.KEY``, host memory), for a safetensors file."""
    return {f"{index}.{key}": (value if torch.is_tensor(value) else torch.tensor(value)).detach().cpu().contiguous()
            for index, entry in optimizer.state_dict()["state"].items() for key, value in entry.items()}


def load_optimizer_tensors(optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor]) -> None:
    """Give ``optimizer`` the per-parameter state ``optimizer_tensors`` wrote (its parameter groups stay its own)."""
    state: dict[int, dict[str, torch.Tensor]] = {}
    for name, value in tensors.items():
        index, key = name.split(".", 1)
        state.setdefault(int(index), {})[key] = value
    optimizer.load_state_dict({"state": state, "param_groups": optimizer.state_dict()["param_groups"]})


@dataclass
class LayerFit:
    """One layer's training: the loss of every step, and the loss on one fixed evaluation batch before and after."""

    losses: list[float]
    before: float
    after: float
    held_out: bool  # the evaluation batch was held out of training (else: calibration rows)


def layer_summary(curve: list[dict]) -> list[dict]:
    """Per trained layer of a sequential curve: its steps and its loss before and after training.

    ``before`` and ``after`` are the layer's local loss on one fixed evaluation batch (``eval_rows`` of
    ``StateCache``: held-out sequences when the data has them), measured before its first update and after
    its last (``eval_before``/``eval_after`` on the layer's last curve entry); ``held_out`` says whether that
    batch was held out. Curves written before that record fall back to the first and last step's loss.
    """
    layers: dict[int, dict] = {}
    for record in curve:
        layer = record.get("layer")
        if layer is None:
            continue
        loss = record.get("loss_local", record.get("loss_total"))
        entry = layers.setdefault(layer, {"layer": layer, "steps": 0, "before": loss, "after": loss, "held_out": None})
        entry["steps"] += 1
        entry["after"] = loss
        if "eval_before" in record:
            entry.update(before=record["eval_before"], after=record["eval_after"], held_out=record.get("eval_held_out"))
    return [layers[k] for k in sorted(layers)]


def layer_rows(num_sequences: int, layer: int, step: int, batch_size: int, seed: int) -> torch.Tensor:
    """Calibration rows of ``step`` within ``layer``'s training: a pure function, so resume is exact."""
    rows = []
    for position in range(step * batch_size, (step + 1) * batch_size):
        epoch, offset = divmod(position, num_sequences)
        rows.append(batch_order(num_sequences, layer * 1_000 + epoch, seed)[offset])
    return torch.stack(rows)


STATE_PARTS = ("residual", "stale")  # a state: the residual stream, and the one a ladder module reads one module late


class StateCache:
    """The (teacher, student) states of the calibration set entering the current layer.

    ``teacher`` is a layer source (``layer_source.py``): the cache asks it for the embedding and
    the layers below ``first``, one module at a time, to compute the first states. The states
    come from ``store`` (memory or disk, ``state_store.py``) and are computed ``CHUNK`` sequences at
    a time, in the same chunks whatever the source.

    ``progress(label, chunks done, chunks in all)`` follows a phase's chunks (``phase``), from the first states on.

    Under data parallelism (``launch``) the cache holds the states of this process's sequences only
    (``owned_rows``); ``self.data`` is their tokens, and ``local(rows)`` finds rows of the whole set among them.
    """

    def __init__(self, teacher: LayerSource, data: torch.Tensor, first: int, store: StateStore | None = None,
                 device: torch.device | str = "cpu", precision: TrainingPrecision | None = None, held_out: int = 0,
                 progress: Callable[[str, int, int], None] | None = None, launch: LaunchRank = LaunchRank(),
                 kept: dict[str, torch.Tensor] | None = None, at: int | None = None):
        self.progress = progress
        self._phase: tuple[str, int] | None = None  # (label, chunks in all) of the phase reported
        self._chunks = 0
        # the first ``num_train`` rows are the calibration set; the ``held_out`` rows after them only evaluate
        self.num_train = data.shape[0] - held_out
        self.num_rows = data.shape[0]
        self.held_out = held_out > 0
        self.launch = launch
        self.rows = owned_rows(launch, data.shape[0]) if launch.several else torch.arange(data.shape[0])
        self._local = torch.full((data.shape[0],), -1, dtype=torch.long)
        self._local[self.rows] = torch.arange(len(self.rows))
        self.teacher, self.data = teacher, (data[self.rows] if launch.several else data)
        self.store = store or StateStore()
        self.device = torch.device(device)
        self.precision = precision
        self._kwargs: dict[int, dict] = {}
        if kept is not None:  # the states a resumed run kept entering layer ``at`` (``kept_states``): nothing runs
            self.layer = at
            self.teacher_state = tuple(self._stored(kept[f"teacher_{part}"]) for part in STATE_PARTS)
            self.student_state = tuple(self._stored(kept[f"student_{part}"]) for part in STATE_PARTS)
            self.dtype = self.teacher_state[0].dtype
            return
        self.layer = first
        self.phase(f"caching the teacher's states entering layer {first}", first + 1)  # the embedding, the layers below
        with torch.no_grad():
            with teacher.embedding() as embed_tokens:
                embeds = self._map(lambda _none, rows: (embed_tokens(self.on_device(self.data[rows])),) * 2, None)
            self.dtype = embeds[0].dtype
            for index in range(first):
                with teacher.layer(index) as layer:
                    embeds = self._through(layer, embeds)
        self.teacher_state = embeds
        self.student_state = embeds  # the layers below ``first`` are shared, frozen and identical
        self.phase(None)

    def kept_states(self) -> dict[str, torch.Tensor]:
        """Both state sets entering the current layer, and this process's tokens, by name (what a resume reads back
        in place of computing them again: ``kept``)."""
        states = {f"{who}_{part}": tensor for who, state in (("teacher", self.teacher_state), ("student", self.student_state))
                  for part, tensor in zip(STATE_PARTS, state)}
        return {**states, "input_ids": self.data}

    def _stored(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` copied into the store (memory, pinned memory or a file, as the computed states would be)."""
        held = self.store.empty(tuple(tensor.shape), tensor.dtype)
        held.copy_(tensor)
        return held

    def phase(self, label: str | None, passes: int = 0) -> None:
        """Report the chunks of the next ``passes`` passes over the data as ``label`` (``None``: report nothing)."""
        total = passes * math.ceil(self.data.shape[0] / CHUNK)
        self._phase, self._chunks = (None if label is None or self.progress is None else (label, total)), 0
        if self._phase is not None:
            self.progress(label, 0, total)

    def eval_rows(self, batch_size: int) -> torch.Tensor:
        """The fixed batch a layer's loss is measured on before and after its training: the held-out rows
        (up to ``batch_size``), else the first ``batch_size`` calibration rows."""
        start, stop = (self.num_train, self.num_rows) if self.held_out else (0, self.num_train)
        return torch.arange(start, min(stop, start + batch_size))

    def local(self, rows: torch.Tensor) -> torch.Tensor:
        """This process's indices in the cached states of those of ``rows`` (of the whole set) it holds, in order."""
        found = self._local[rows]
        return found[found >= 0]

    def kwargs(self, batch: int) -> dict:
        """Attention kwargs for ``batch`` full-length sequences (equal for every such batch), on the device."""
        if batch not in self._kwargs:
            self._kwargs[batch] = attention_kwargs(self.teacher.model, batch, self.data.shape[1], self.dtype, self.device)
        return self._kwargs[batch]

    def on_device(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` on the training device (a non-blocking copy from pinned memory; itself when already there)."""
        return tensor.to(self.device, non_blocking=True)

    def rows_on_device(self, tensor: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """``tensor[rows]`` on the training device. From pinned host memory the rows are gathered into a pinned
        buffer first, so the copy does not block (the caching host allocator keeps the buffer until it is done)."""
        if self.store.pin:
            gathered = torch.empty((len(rows), *tensor.shape[1:]), dtype=tensor.dtype, pin_memory=True)
            torch.index_select(tensor, 0, rows, out=gathered)
            return gathered.to(self.device, non_blocking=True)
        return self.on_device(tensor[rows])

    def autocast(self):
        """The training precision's autocast context on the device (nothing for plain fp32)."""
        return self.precision.context(self.device) if self.precision is not None else contextlib.nullcontext()

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
            if self._phase is not None and self._chunks < self._phase[1]:
                self._chunks += 1
                self.progress(self._phase[0], self._chunks, self._phase[1])
        return outs

    def _through(self, layer: torch.nn.Module, state: State) -> State:
        """``layer`` (the current one, of the teacher or the student) applied to ``state``, chunk by chunk."""
        def run(s: State, rows: slice) -> State:
            with self.autocast():
                return layer(self.on_device(s[0]), self.on_device(s[1]), **self.kwargs(rows.stop - rows.start))

        return self._map(run, state)

    @torch.no_grad()
    def teacher_output(self, teacher_layer: torch.nn.Module) -> State:
        """The teacher's states leaving the current layer (``teacher_layer``)."""
        return self._through(teacher_layer, self.teacher_state)

    @torch.no_grad()
    def through_teacher(self, state: State, indices: range) -> State:
        """``state`` moved through the teacher's layers ``indices`` in order, one layer read at a time."""
        for index in indices:
            with self.teacher.layer(index) as layer:
                state = self._through(layer, state)
        return state

    @torch.no_grad()
    def teacher_outputs(self, teacher_layers: list[torch.nn.Module]) -> list[State]:
        """The teacher's states leaving each of ``teacher_layers``, the current layer and those after it in order."""
        outs = [self.teacher_output(teacher_layers[0])]
        for layer in teacher_layers[1:]:
            outs.append(self._through(layer, outs[-1]))
        return outs

    @torch.no_grad()
    def advance(self, student_layer: torch.nn.Module, teacher_out: State) -> None:
        """Move both state sets past the current layer (the student through its adapted ``student_layer``)."""
        self.student_state = self._through(student_layer, self.student_state)
        self.teacher_state = teacher_out
        self.layer += 1


def train_layer(
    cache: StateCache,
    layers: list[torch.nn.Module],
    targets: list[State],
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
    launch: LaunchRank = LaunchRank(),
    start: LayerProgress | None = None,
    save: Callable[[LayerProgress], None] | None = None,
    save_due: Callable[[], bool] = lambda: False,
    steps: int | None = None,
    time_up: Callable[[], bool] = lambda: False,
) -> LayerFit:
    """Train the student's current window on the cached states: its losses per step, and its loss on the fixed
    evaluation batch (``StateCache.eval_rows``) before and after.

    ``layers``: consecutive ``LadderDecoderLayer``s from the current one (usually one); ``targets``: the teacher's
    states leaving each (``StateCache.teacher_outputs``). The layers train together, each fed the one below's
    output of the same step, and the loss is the mean of their layer errors.
    Under data parallelism (``launch``) each process runs the rows of every batch it holds (``LaunchRank``) and the
    gradients are summed.

    ``start``: continue a training saved partway (the layers hold its weights). ``save(progress)`` runs after a step
    before the window's last when ``save_due()`` says so (on every process: ``save_due`` decides for all of them).
    ``steps``: the window's steps, where a wall budget shortened them (default: ``epochs`` over the calibration set);
    ``time_up()``: checked after each step (on every process: collective under a launcher), true when the stage's time
    is up: the window stops there.
    """
    from ..plan.lr_curve import warmup_cosine

    index = cache.layer
    params = [param for module in layers for param in module.parameters()]
    for param in params:
        param.requires_grad_(True)
    optimizer = adamw(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    stack = OptimizerStep(optimizer, params, params[0].device)  # the forward autocasts itself (cache.autocast)
    total = steps if steps is not None else steps_per_layer(cache.num_train, epochs, batch_size)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(total, warmup_steps, min_lr_ratio))
    teacher_inputs = [cache.teacher_state, *targets[:-1]]
    torch.manual_seed(seed * 1_000 + index)  # dropout-free, but keep any randomness per layer

    def loss_on(rows: torch.Tensor) -> torch.Tensor:
        """The window's error on ``rows`` (one process)."""
        own = rows
        error, s_out = 0.0, None
        for module, t_in_all, t_out_all in zip(layers, teacher_inputs, targets):
            t_in = (cache.rows_on_device(t_in_all[0], rows), cache.rows_on_device(t_in_all[1], rows))
            t_out = (cache.rows_on_device(t_out_all[0], rows), cache.rows_on_device(t_out_all[1], rows))
            if s_out is None or local_inputs == "teacher":  # the window's input; block-local: every layer the teacher's
                source = cache.student_state if local_inputs == "student" else t_in_all
                s_out = (cache.rows_on_device(source[0], own), cache.rows_on_device(source[1], own))
            with cache.autocast():
                s_out = module(s_out[0], s_out[1], **cache.kwargs(len(own)))
                error = error + layer_error(module.mode, t_in, s_out, t_out, local_inputs)
        return error / len(layers)

    def share_on(rows: torch.Tensor) -> torch.Tensor | None:
        """Under data parallelism: the window's error on the rows of batch ``rows`` this process holds, as their
        share of the batch's (the teacher's update sums summed over the processes); ``None`` where it holds none."""
        own = cache.local(rows)
        on = cache.rows_on_device
        teacher = [((on(t_in[0], own), on(t_in[1], own)), (on(t_out[0], own), on(t_out[1], own)))
                   for t_in, t_out in zip(teacher_inputs, targets)]
        sums = [update_sums(module.mode, t_in, t_out) for module, (t_in, t_out) in zip(layers, teacher)]
        summed = torch.cat(sums)
        sum_over_processes([summed])  # every process joins, with or without rows
        if len(own) == 0:
            return None
        total = len(rows) * math.prod(teacher[0][1][0].shape[1:])
        error, s_out, offset = 0.0, None, 0
        for module, (t_in, t_out), t_in_all, part_sums in zip(layers, teacher, teacher_inputs, sums):
            shared = (summed[offset:offset + len(part_sums)], total)
            offset += len(part_sums)
            if s_out is None or local_inputs == "teacher":
                source = cache.student_state if local_inputs == "student" else t_in_all
                s_out = (on(source[0], own), on(source[1], own))
            with cache.autocast():
                s_out = module(s_out[0], s_out[1], **cache.kwargs(len(own)))
                error = error + layer_error(module.mode, t_in, s_out, t_out, local_inputs, shared=shared)
        return error / len(layers)

    def measured(rows: torch.Tensor) -> float:
        """The window's error on the evaluation batch ``rows`` (summed over the processes' shares)."""
        if not launch.several:
            return loss_on(rows).item()
        share = share_on(rows)
        total = torch.zeros((), device=params[0].device) if share is None else share.detach().float().reshape(())
        sum_over_processes([total])
        return total.item()

    evaluation = cache.eval_rows(batch_size)
    if start is not None:
        with warnings.catch_warnings():  # the schedule moved to the saved step: no optimizer step comes first
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step", category=UserWarning)
            for _ in range(start.steps):
                scheduler.step()
        load_optimizer_tensors(optimizer, start.optimizer)
        before, losses = start.before, list(start.losses)
    else:
        with torch.no_grad():
            before = measured(evaluation)
        losses = []
    for step in range(len(losses), total):
        rows = layer_rows(cache.num_train, index, step, batch_size, seed)
        loss = loss_on(rows) if not launch.several else share_on(rows)
        if loss is None:  # this process holds none of the batch's rows: it adds nothing
            loss = torch.zeros((), device=params[0].device)
        else:
            stack.backward(loss)
        if launch.several:  # the batch's gradient and loss: the sum of the parts' (every rank sums every tensor)
            for param in params:
                if param.grad is None:
                    param.grad = torch.zeros_like(param)
            sum_over_processes([param.grad for param in params])
            loss = loss.detach().clone()
            sum_over_processes([loss])
        if max_grad_norm > 0:
            stack.clip(max_grad_norm)
        current_lr = scheduler.get_last_lr()[0]
        stack.step()  # AdamW's step, the gradients dropped
        scheduler.step()
        losses.append(loss.item())
        if progress is not None:
            progress(LayerStep(index, step + 1, total, losses[-1], current_lr))
        if step + 1 < total and time_up():
            break
        if save is not None and step + 1 < total and save_due():
            save(LayerProgress(step + 1, list(losses), before, optimizer_tensors(optimizer)))
    for param in params:
        param.requires_grad_(False)
        param.grad = None
    with torch.no_grad():
        after = measured(evaluation)
    # torch's optimizer and scheduler hold each other in reference cycles: collect them now, or the
    # layer's AdamW state (twice the layer) waits for the cyclic garbage collector, layer after layer
    del optimizer, scheduler, stack
    gc.collect()
    return LayerFit(losses, before, after, cache.held_out)
