"""The joint training: one ``Trainer`` (set-up, resume, ``train_step``, the loop that logs, saves, stops and writes
out) over a parallelism strategy.

``strategy_choice.choose_strategy`` picks how the stage runs on its launch (an entry of ``strategies.STRATEGIES``), and the
loop drives the run its entry names (``run_class``):

- one process or replicated over the processes (``replicated.ReplicatedRun``: DDP under a launcher; LoRA, EMA, head
  grouping, interpolation, ``--train all``);
- sharded over the processes (``sharded.ShardedRun``: FSDP2, each rank reading its rows of each tensor).

A run builds the models, their loss and trained parameters, and owns what differs: how the model is wrapped, when
the gradients are averaged over the processes, and the write-out of OUT. Everything else is here, once:

- **The step** is one stack for every run (``optimizer_step.OptimizerStep``): the forward's autocast, fp16's loss
  scaling, the clip over the global gradient norm, AdamW's step, and the EMA of the trained weights where a stage keeps
  one.
- **The batch** is global: ``--batch-size`` sequences per optimizer step on any process count, split over the
  processes and accumulated over ``--grad-accum`` micro-batches (``batches.StepSplit``); each process reads its rows
  of a deterministic batch order (a pure function of the seed and the step), so a recipe trains the same sequences
  on 1 or 8 processes, and a resumed run replays the batches an uninterrupted one would have seen.
- **The training state** is torch's distributed checkpoint (``training_state.save_joint_state``): the trained
  parameters and their optimizer state, every process writing its shards, saved when the stage's
  ``step_watch.StepWatch`` says (a minute in, then every ``save_minutes``, or every ``save_every`` steps) and at an
  interrupt's step: a Ctrl-C or SIGTERM is heard at every step's end (under a launcher one step later, agreed by every
  process). A resume on the same process count continues bit for bit; on another, from the tokens trained. The
  learning-rate schedule is a function of the step.
- **Losses** stay on the device and are read when logged (``loss_log``: every 10 steps on CUDA, every step on a CPU),
  averaged over the processes; only the main process speaks.
- **A wall budget's deadline** stops the stage at the first step that ends past it (under a launcher, the first logged
  one, by the main process's clock).
"""

from __future__ import annotations

import importlib
import math
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol

import torch
from accelerate.utils import set_seed

from ...checkpoint.placement import TrainingPrecision
from ...progress import counted
from .. import process_group
from ..plan.batches import StepSplit
from ..plan.strategies import StrategyEntry
from .compilation import adamw
from .optimizer_step import OptimizerStep
from .weight_ema import WeightEMA
from ..plan.config import AdaptConfig, AdaptResult, StepInfo
from .loss_log import PendingLosses, TrainingLog, log_every as log_interval
from ..plan.lr_curve import warmup_cosine
from ..objectives.registry import entries
from ..plan.throughput import Throughput, peak_flops_per_s, plan_line
from .step_watch import StepWatch
from .training_state import STATE_DIR, load_joint_state, read_joint_state, save_joint_state


class JointRun(Protocol):
    """What a strategy's run gives the loop (``replicated.ReplicatedRun``, ``sharded.ShardedRun``). Built on the process's
    device, in its training precision; after ``build``: the loss module the steps call, the module whose trained
    parameters the state holds, those parameters, the student (for progress reports), the teacher's path, whether the
    prefix is shared and the first converted layer (for stored teacher states), and the step's FLOPs. ``wrap`` readies
    the loss module for the launch (DDP, or nothing where every unit was sharded as it was built), ``synchronizing`` is
    a micro-batch's context (the gradients averaged over the processes on the last one only). The step around them is
    the loop's (``optimizer_step.OptimizerStep``)."""

    device: torch.device
    rank: int
    world: int
    precision: TrainingPrecision
    casts_parameters: bool  # the parameters reach the forward in the compute dtype: no autocast
    teacher_gathers: bool  # stored teacher states are used only where every rank's rows have them
    loss_module: torch.nn.Module
    state_module: torch.nn.Module
    params: list[torch.nn.Parameter]
    student: torch.nn.Module
    teacher_path: str | None
    share_prefix: bool
    first: int
    flops: Any

    def build(self, data: Any, say: Callable[[str], None]) -> None: ...
    def wrap(self) -> None: ...
    def synchronizing(self, last: bool) -> AbstractContextManager: ...
    def write_out(self, result: AdaptResult, out: Path, tokenizer: Any, state_dir: Path) -> None: ...


def run_class(entry: StrategyEntry) -> type[JointRun]:
    """The run class a strategy's entry names (``module:Class``), imported."""
    module, _, name = entry.run.partition(":")
    return getattr(importlib.import_module(module), name)


def train_joint(
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
    deadline: float | None = None,
) -> AdaptResult:
    """Run a joint stage on ``checkpoint`` (checked by ``stage_run.adapt``) with the strategy its launch gets, and write
    ``out`` (``Trainer``).

    ``stop_after_steps`` ends the run there as a kill would; ``save_at_stop`` (``--max-steps``) saves the state of that
    step first, so that ``--resume`` continues from it. ``deadline`` (``time.perf_counter()``'s clock; the main
    process's decides): the stage stops at the first step that ends past it (under a launcher, the first logged one),
    says so, and writes OUT from there."""
    trainer = Trainer(config, weights, checkpoint, out, resume=resume, progress=progress, say=say, deadline=deadline)
    return trainer.train(stop_after_steps=stop_after_steps, save_at_stop=save_at_stop)


class Trainer:
    """A joint stage's training on this process: the strategy's run (its model parts and loss), AdamW and the stack
    around its step (``OptimizerStep``: precision, fp16's loss scaler, the clip), the EMA where a stage keeps one, the
    learning-rate schedule and where the training stands (``step``, ``tokens_done``, the clocks and the loss curve;
    the data's position is the step: the batch order is a function of the seed and the step). ``save`` writes all of
    it as one distributed checkpoint (``training_state.save_joint_state``), which a resumed trainer loads before its
    first step; ``train_step`` is one optimizer step, ``train`` the loop around it (the save clock, the interrupt vote,
    the deadline) and the write-out."""

    def __init__(self, config: AdaptConfig, weights: dict[str, float], checkpoint: str, out: Path, *, resume: bool,
                 progress: Callable[[StepInfo, torch.nn.Module], None] | None, say: Callable[[str], None],
                 deadline: float | None = None):
        from ...checkpoint.io import load_tokenizer
        from ...checkpoint.placement import this_launch
        from ...corpus.token_store import build_reporter, is_store
        from ...corpus.windows import token_windows
        from ..plan.strategy_choice import choose_strategy

        self.config, self.out = config, out
        strategy = choose_strategy(config, this_launch().world)
        run: JointRun = run_class(strategy.entry)(config, weights, checkpoint)  # the process group and the device first
        self.run, self.device, self.rank, self.world = run, run.device, run.rank, run.world
        set_seed(config.training.seed)
        if self.rank != 0:  # one voice: the main process says the plan, the data and the pace
            say = _silent
        self.say = say
        self.run_dir = config.resolved_run_dir()
        self.state_dir = self.run_dir / STATE_DIR
        self.tokenizer = load_tokenizer(checkpoint, "adaptation")

        training = self.training = config.training  # the text, a step's batch and the tokens in all
        self.split = training.split(self.world)
        self.split.check()  # the Python API's backstop: the plan refuses it before any weight loads
        self.tokens_per_step = training.tokens_per_step
        self.total_steps = training.steps
        planned_tokens = self.total_steps * self.tokens_per_step
        if planned_tokens != training.tokens:
            say(f"--tokens {training.tokens:,} rounds up to {planned_tokens:,}: a step trains "
                f"{self.split.batch_size} sequence(s) x {training.seq_len} tokens (--batch-size x --seq-len)")
        on = f", {strategy.describe()}" if strategy.processes > 1 or strategy.shards else ""  # one process: nothing to add
        say(plan_line(planned_tokens, self.total_steps, self.split, training.seq_len) + on)
        data = self.data = token_windows(training.data, self.tokenizer, training.seq_len, max_tokens=planned_tokens,
                                         progress=build_reporter(say, training.data), say=say)
        where = data.stores[0].path.parent if len(data.stores) > 1 else data.stores[0].path
        kept_in = "" if is_store(training.data) else f" (token store {where})"
        say(f"data: {counted(len(data), 'sequence')} of {training.seq_len} tokens from {training.data}{kept_in}")
        if len(data) < self.split.batch_size:
            say(f"the data holds fewer sequences than a step trains ({self.split.batch_size}): every step repeats them, "
                f"so the {planned_tokens:,} tokens trained count {counted(len(data) * training.seq_len, 'distinct token')}")

        run.build(data, say)
        self.stored = None
        if config.objective.teacher_states and run.share_prefix and all(o.reads_stored_teacher for o in entries(weights)):
            from ..layers.teacher_states import read as read_teacher_states, teacher_id

            self.stored, found = read_teacher_states(Path(config.objective.teacher_states), len(data), data.head,
                                                     teacher_id(run.teacher_path), run.first)
            if found:
                say(found)
        self.pace = Throughput(self.world, run.flops.per_token, peak_flops_per_s(self.device))
        run.wrap()
        self.optimizer = adamw(run.params, lr=config.optimizer.lr, weight_decay=config.optimizer.weight_decay,
                               betas=(0.9, 0.95))  # fused
        self.optimizer_step = OptimizerStep(self.optimizer, run.params, self.device, run.precision,
                                            casts_parameters=run.casts_parameters, sharded=strategy.shards)
        self.ema = WeightEMA(run.params, config.scope.ema) if config.scope.ema else None  # from the starting weights

        self.step, self.tokens_done, self.train_s, self.cpu_s, self.curve, self.resumed_from = 0, 0, 0.0, 0.0, [], 0
        if resume:
            self._restore()
        for group in self.optimizer.param_groups:  # the schedule's base rate is the run's, not one a loaded state carries
            group["initial_lr"] = config.optimizer.lr
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, warmup_cosine(self.total_steps, config.optimizer.warmup_steps, config.optimizer.min_lr_ratio),
            last_epoch=self.step - 1)
        self.pending = PendingLosses(_mean_over_ranks if self.world > 1 else None)
        run.loss_module.train()
        report = (lambda info: progress(info, run.student)) if self.rank == 0 and progress is not None else None
        self.log = TrainingLog(self.pending, self.curve, train_s=self.train_s, total_steps=self.total_steps,
                               tokens_per_step=self.tokens_per_step, pace=self.pace, say=say, report=report)
        self.deadline = deadline  # the main process's clock decides for every process (StepWatch)

    def _restore(self) -> None:
        """Load the run dir's saved state, where there is one: the trained parameters, AdamW, the run's stateful
        extras, and where the training stood. On another process count the same global batch goes on from the tokens
        trained."""
        saved = read_joint_state(self.state_dir, self.config) if self.state_dir.is_dir() else None
        if saved is None:
            self.say(f"nothing to resume in {self.run_dir}; starting a new run")
            return
        load_joint_state(self.state_dir, self.run.state_module, self.optimizer, self.extra_state())
        self.step, self.tokens_done, self.train_s, self.cpu_s, self.curve = (
            saved["step"], saved["tokens"], saved["train_s"], saved.get("cpu_s", 0.0), saved["curve"])
        self.resumed_from = self.step
        if saved.get("processes", self.world) != self.world:
            left = max(1, math.ceil((self.training.tokens - self.tokens_done) / self.tokens_per_step))
            self.total_steps = self.step + left
            self.say(f"resumed on {counted(self.world, 'process', 'processes')} a run saved on {saved['processes']}: "
                     f"{left} step(s) of {self.tokens_per_step:,} tokens left")
        self.say(f"resumed from step {self.step} ({self.tokens_done:,} tokens)")

    def save(self) -> None:
        """The training state as it stands, every process writing its shards."""
        self.pending.flush(self.curve)
        save_joint_state(self.state_dir, self.config, self.run.state_module, self.optimizer,
                         {"step": self.step, "tokens": self.tokens_done, "train_s": self.train_s, "cpu_s": self.cpu_s,
                          "curve": self.curve, "processes": self.world}, extra=self.extra_state())

    def extra_state(self) -> dict[str, Any]:
        """The stateful objects the state holds besides the trained parameters and AdamW: fp16's loss scaler and the
        EMA's average, where the run has them."""
        extra = {"scaler": self.optimizer_step.scaler, "ema": self.ema}
        return {name: value for name, value in extra.items() if value is not None}

    def train_step(self) -> tuple[dict[str, Any], float]:
        """One optimizer step: each micro-batch's forward and backward on this process's rows of the global batch
        (stored teacher states where its rows have them), the clip, AdamW and the schedule. Returns the step's losses
        (on the device, averaged over the micro-batches) and the learning rate it trained at."""
        run, training, split, data = self.run, self.training, self.split, self.data
        sums: dict[str, Any] = {}
        for micro in range(training.grad_accum):
            rows = split.rows(len(data), self.step, micro, self.rank, training.seed)
            batch = data.rows(rows).to(self.device, non_blocking=True)
            teacher_rows = None
            if self.stored is not None and (not run.teacher_gathers or _all_stored(
                    self.stored.num_rows, len(data), self.step, micro, split, training.seed)):
                teacher_rows = self.stored.rows(rows, self.device)  # else the teacher runs
            with run.synchronizing(micro == training.grad_accum - 1):
                losses = self.optimizer_step.forward(run.loss_module, batch, teacher_rows)
                self.optimizer_step.backward(losses["total"] / training.grad_accum)
            for name, value in losses.items():
                sums[name] = sums.get(name, 0.0) + value.detach().float() / training.grad_accum
        if self.config.optimizer.max_grad_norm > 0:
            self.optimizer_step.clip(self.config.optimizer.max_grad_norm)
        self.optimizer_step.step()  # AdamW's step, the gradients dropped
        if self.ema is not None:
            self.ema.update()
        lr = self.scheduler.get_last_lr()[0]
        self.scheduler.step()
        self.step += 1
        self.tokens_done += self.tokens_per_step
        return sums, lr

    def train(self, *, stop_after_steps: int | None = None, save_at_stop: bool = False) -> AdaptResult:
        """Train to the stage's last step (or ``stop_after_steps``, or the deadline), saving by the clock and at an
        interrupt, then write OUT."""
        config, run, device, log = self.config, self.run, self.device, self.log
        saved_step, watch = self.step, StepWatch(config, self.say, self.deadline, device)
        log_every = log_interval(device)
        with watch.holding():  # a Ctrl-C or SIGTERM saves the state at its step's end, then stops
            while self.step < self.total_steps:
                if stop_after_steps is not None and self.step >= stop_after_steps:
                    if save_at_stop and saved_step != self.step:
                        self.save()
                    self.pending.flush(self.curve)
                    watch.close()
                    process_group.barrier()
                    return AdaptResult(self.out, self.step, self.tokens_done, self.train_s, self.curve,
                                       self.resumed_from, state_dir=self.state_dir if self.state_dir.exists() else None,
                                       stopped_early=True, throughput=self.pace.record(self.tokens_done, self.train_s))
                started, cpu_started = time.perf_counter(), time.process_time()
                sums, lr = self.train_step()
                step = self.step
                logged = step % log_every == 0 or step == self.total_steps
                if logged and device.type == "cuda":
                    torch.cuda.synchronize(device)  # the clock counts the device's work where the losses are read
                self.train_s += time.perf_counter() - started
                self.cpu_s += time.process_time() - cpu_started
                log.step_ended(step, self.tokens_done, self.train_s, self.cpu_s, lr, sums, logged)
                if step < self.total_steps and (self.world == 1 or logged) and watch.time_up():
                    self.say(f"budget: the stage's time is up after step {step:,} of {self.total_steps:,}: it stops "
                             f"here ({counted(self.tokens_done, 'token')} trained) to keep the budget")
                    self.total_steps = log.total_steps = step
                final = step == self.total_steps
                due = watch.after_step(step, last=final, read_clock=logged)  # time is read where losses are
                if (due and not final) or (final and (config.saving.keep_state or (due and watch.stopping))):
                    self.save()
                    saved_step = step
                    watch.saved()

        self.pending.flush(self.curve)
        if self.stored is not None:
            self.say(f"stored teacher states: {self.stored.rows_read(device):,} of the {self.stored.written:,} "
                     "sequences written were read")
        result = AdaptResult(self.out, self.step, self.tokens_done, self.train_s, self.curve, self.resumed_from,
                             throughput=self.pace.record(self.tokens_done, self.train_s))
        if self.ema is not None:  # after the last save: a kept state holds the trained weights and their average
            self.ema.write_into()
        run.write_out(result, self.out, self.tokenizer, self.state_dir)
        return result


def _mean_over_ranks(tensor: torch.Tensor) -> torch.Tensor:
    """The mean of ``tensor`` over the process group's ranks (an all-reduce every rank joins)."""
    import torch.distributed as dist

    from ...checkpoint.placement import this_launch

    dist.all_reduce(tensor)
    return tensor / this_launch().world


def _all_stored(stored_rows: int, num_sequences: int, step: int, micro: int, split: StepSplit, seed: int) -> bool:
    """Whether every rank's rows of this micro-batch have stored teacher states: ranks whose teacher gathers across
    them run it together or not at all, and each computes the others' rows itself."""
    return all(max(split.rows(num_sequences, step, micro, r, seed)) < stored_rows for r in range(split.processes))


def _silent(_message: str) -> None:
    """What a process other than the main one says: nothing."""
