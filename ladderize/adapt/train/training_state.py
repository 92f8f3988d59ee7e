"""The training state in the run dir: saved atomically, checked and read back on resume, removed after a finished run.

``RUN_DIR/state/`` holds ``trainer_state.json`` (step, tokens, times, curve and the config's
fingerprint) and what the training needs to continue exactly:

- joint training (any strategy): the trained parameters and their optimizer state in torch's distributed checkpoint
  (``dcp/``: every process writes its own shards), the whole folder replaced atomically at each save
  (``SaveClock``); it resumes on the same process count bit for bit and on another from the tokens trained (the
  learning-rate schedule is a function of the step, and the batches of the seed and the step);
- sequential training: one ``layer-NNNNN.safetensors`` per finished converted layer, each
  written (atomically) as soon as the layer is trained, then ``trainer_state.json``
  rewritten (atomically) to name the last finished layer; when ``SaveClock`` says so, the
  window in training partway (``partial-STEP-*.safetensors``: its layers and AdamW state), which
  ``trainer_state.json`` then names.

``RUN_DIR/curve.json`` mirrors the curve beside it. ``state/unsaved.json`` holds the training time an attempt ended
by an exception (Ctrl-C, SIGTERM, an error) spent past the state it left (``record_unsaved``): a resume counts it, so
a stage's ``train_s`` is the time of all its attempts; the next save covers it (and drops the file).
"""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...checkpoint.atomic import replace_directory, write_file_atomic
from ...checkpoint.free_space import disk_full_as_one_line
from ...checkpoint.placement import this_launch
from ...errors import LadderizeError
from .. import process_group
from ..plan.config import AdaptConfig
from ..plan.inputs import STATE_DIR, TRAINER_STATE

if TYPE_CHECKING:
    import torch

DCP_DIR = "dcp"  # in a joint stage's state: the trained parameters and their optimizer state
RUN_CURVE = "curve.json"
UNSAVED = "unsaved.json"  # in the state: training seconds of ended attempts past the state saved (``record_unsaved``)


def save_joint_state(state_dir: Path, config: AdaptConfig, module: torch.nn.Module, optimizer, payload: dict[str, Any],
                     extra: dict[str, Any] | None = None) -> None:
    """Replace ``state_dir`` with a joint stage's training state: the trained parameters of ``module``, their optimizer
    state and ``extra``'s stateful objects (a loss scaler, the EMA's average: each one's ``state_dict``) in one torch
    distributed checkpoint, every process writing its own shards and a replicated tensor written once, beside
    ``trainer_state.json`` (``payload``). The main process renames the folder only after every process has written.
    A save that meets a full disk ends the run in one line (``free_space.disk_full_as_one_line``), its partial
    folder removed and the previous save as it was."""
    import torch.distributed.checkpoint as dcp

    tmp = state_dir.parent / f".{state_dir.name}.tmp"
    if process_group.is_main():
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    process_group.barrier()
    kept = ("the previous save is kept, and --resume continues from it" if state_dir.exists() else
            "no earlier save was kept")
    try:
        with disk_full_as_one_line("the training state", state_dir, kept):
            with _one_process_quiet():
                dcp.save({**_trained_state(module, optimizer), **(extra or {})}, checkpoint_id=str(tmp / DCP_DIR),
                         no_dist=not process_group.running())
            process_group.barrier()
            if process_group.is_main():
                write_trainer_state(tmp, config, payload)
                replace_directory(tmp, state_dir)
    except BaseException:  # a full disk, or an interrupt mid-write: the partial save goes, the previous one stays
        if process_group.is_main():
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    process_group.barrier()


def load_joint_state(state_dir: Path, module: torch.nn.Module, optimizer, extra: dict[str, Any] | None = None) -> None:
    """Load the state ``save_joint_state`` wrote into ``module``'s trained parameters, ``optimizer`` and ``extra``'s
    stateful objects (each one's ``load_state_dict``), on this process count or another: each process reads what it
    holds."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    state = {**_trained_state(module, optimizer), **(extra or {})}
    with _one_process_quiet():
        dcp.load(state, checkpoint_id=str(state_dir / DCP_DIR), no_dist=not process_group.running())
    set_state_dict(module, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
                   options=StateDictOptions(ignore_frozen_params=True, strict=False))


def read_joint_state(state_dir: Path, config: AdaptConfig) -> dict[str, Any] | None:
    """A joint stage's saved trainer state (``None``: nothing saved yet); a state in another format is refused."""
    saved = read_trainer_state(state_dir, config)
    if saved is not None and not (state_dir / DCP_DIR).is_dir():
        raise LadderizeError(f"cannot resume {state_dir.parent}: its state is not a torch distributed checkpoint "
                             f"(an older ladderize's format); pass --force to start over")
    return saved


def _trained_state(module: torch.nn.Module, optimizer) -> dict[str, Any]:
    """What a joint state holds of the training: the trained parameters (sharded or whole) and their optimizer state."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    model_state, optim_state = get_state_dict(module, optimizer, options=StateDictOptions(ignore_frozen_params=True))
    return {"model": model_state, "optim": optim_state}


@contextlib.contextmanager
def _one_process_quiet():
    """DCP warns at every save and load of one process without a process group that it assumes one process: it is
    what ``no_dist`` asks for, so the line is noise."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        yield


FIRST_SAVE_S = 60.0  # a run saved by time writes its first state a minute in: an early Ctrl-C loses at most that


class SaveClock:
    """When a run saves its training state: every ``save_every`` optimizer steps where set, else by wall time (a
    minute in, then every ``save_minutes``), and at once where a Ctrl-C or SIGTERM is held for it
    (``errors.holding_interrupts``): the run then stops after that save (``saved`` raises the interrupt), losing
    nothing. A save is collective, so under a launcher the main process's clock and signal decide for every rank (a
    step count needs no word: every rank counts the same). The joint training hears a held signal at every step
    (``InterruptVote``, which sets ``stop``); ``due`` hears the main process's where it is asked.

    Under torchrun, each save measures how long an interrupt's save takes there (the steps a signal waits to be heard,
    then the save) and warns where that outlasts torchrun's shutdown window, again whenever a save is slower than the
    last one it warned about."""

    def __init__(self, config: AdaptConfig, say: Callable[[str], None] | None = None):
        import time

        self.every = config.saving.save_every
        self.interval = 60.0 * config.saving.save_minutes
        self.last = time.perf_counter()
        self.saved_once = False
        self.stop: int | None = None  # the held interrupt the run stops with after this save
        self.say = say  # where a save says that an interrupt's save would outlast torchrun's shutdown window
        self._checked = self.last  # when the current step began: a step's end (``stepped``), or a save's end
        self._step_s = 0.0  # the last step's length: how long a signal waits to be heard
        self._due_at: float | None = None
        self._warned_s = 0.0  # the longest interrupt's save warned about

    @property
    def by_steps(self) -> bool:
        return self.every is not None

    def stepped(self) -> None:
        """An optimizer step ended: its length is how long a signal that lands in the next one waits."""
        import time

        now = time.perf_counter()
        self._step_s, self._checked, self._due_at = now - self._checked, now, now

    def due(self, step: int, device) -> bool:
        """Whether to save after optimizer step ``step`` (which it marks ended, ``stepped``); by time, one broadcast
        from the main process, which also carries its held signal."""
        import time

        from ...errors import held_interrupt

        held = held_interrupt() or 0
        self.stepped()
        if self.by_steps:
            due = step % self.every == 0
            if this_launch().several and not due:  # the ranks agree on the signal where they agree to save
                return False
        else:
            wait = min(FIRST_SAVE_S, self.interval) if not self.saved_once else self.interval
            due = time.perf_counter() - self.last >= wait
        due, held = _main_says(due, held, device)
        self.stop = held or None
        return due or self.stop is not None

    def saved(self, steps_heard: int = 1) -> None:
        """The state was saved: the clock starts again, and a held interrupt stops the run here. ``steps_heard``: the
        steps a signal can wait before the run hears it (``InterruptVote.lag``), for the shutdown window's check."""
        import time

        from ...errors import Interrupted

        self.last, self.saved_once = time.perf_counter(), True
        self._checked = self.last  # the next step begins after the save
        window = shutdown_window()
        if self.say is not None and window is not None and self._due_at is not None:
            needs = steps_heard * self._step_s + self.last - self._due_at  # heard at a step's end, then saved
            if needs > window and needs > self._warned_s:
                self._warned_s = needs
                self.say(f"warning: an interrupt's save here takes about {needs:.0f} s (a step, then this save), and "
                         f"torchrun ends the processes {window:.0f} s after a signal: launch with torchrun "
                         f"--shutdown_timeout {_generous(needs)} (or {SHUTDOWN_ENV}={_generous(needs)}), or an interrupt "
                         "keeps only the last periodic save")
        if self.stop is not None:
            raise Interrupted(self.stop)


class InterruptVote:
    """Whether a held interrupt (``errors.holding_interrupts``) stops the joint training at this step's end, the same
    answer on every process, asked at every step.

    One process reads its own held signal. Under a launcher each process puts its held signal into an all-reduce (max)
    over a CPU (gloo) group at each step's end, started without waiting and read at the next step's end, when it is
    long done: a signal any process holds stops every process one step later (``lag``), at one step's end for all, and
    nothing waits on the device. The last step votes at once, so that no signal is left for after the training."""

    def __init__(self):
        import torch.distributed as dist

        self._group = None
        self._pending: tuple | None = None  # the all-reduce of the last step's vote, and its tensor
        self.lag = 2 if this_launch().several else 1  # steps a signal can wait (the one it lands in, the vote's)
        if this_launch().several and dist.get_backend() != "gloo":
            self._group = dist.new_group(backend="gloo")  # every rank joins; the vote stays off the device

    def heard(self, last: bool = False) -> int | None:
        """The signal the run stops with at this step's end (``None``: it goes on)."""
        import torch
        import torch.distributed as dist

        from ...errors import held_interrupt

        held = held_interrupt() or 0
        if not this_launch().several:
            return held or None
        voted = 0
        if self._pending is not None:
            work, tensor = self._pending
            work.wait()
            voted = int(tensor.item())
        mine = torch.tensor([held], dtype=torch.int64)
        if last:
            dist.all_reduce(mine, op=dist.ReduceOp.MAX, group=self._group)
            self._pending = None
            return max(voted, int(mine.item())) or None
        self._pending = (dist.all_reduce(mine, op=dist.ReduceOp.MAX, group=self._group, async_op=True), mine)
        return voted or None

    def close(self) -> None:
        """Wait for the last vote started (every process started it), so that none is left in flight."""
        if self._pending is not None:
            self._pending[0].wait()
            self._pending = None


SHUTDOWN_ENV = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"


def shutdown_window() -> float | None:
    """Seconds torchrun waits for its processes after forwarding a signal before it kills them
    (``$TORCH_ELASTIC_SHUTDOWN_TIMEOUT``, else its default 30; its ``--shutdown_timeout`` is not seen by the processes);
    ``None`` outside torchrun."""
    import os

    if "TORCHELASTIC_RUN_ID" not in os.environ:
        return None
    try:
        return float(os.environ.get(SHUTDOWN_ENV, "30"))
    except ValueError:
        return 30.0


def _generous(seconds: float) -> int:
    """A shutdown window with room: twice ``seconds``, rounded up to a whole minute."""
    return 60 * -(-int(2 * seconds) // 60)


def _main_says(flag: bool, signum: int, device) -> tuple[bool, int]:
    """The main process's ``flag`` and held ``signum`` on every process of a launched job (its own outside one)."""
    said, held = process_group.main_says((1 if flag else 0, signum), device)
    return bool(said), held


def write_trainer_state(state_dir: Path, config: AdaptConfig, payload: dict[str, Any]) -> None:
    """Write ``trainer_state.json`` (the payload plus the fingerprint) atomically, and the curve beside the state."""
    state_dir.mkdir(parents=True, exist_ok=True)
    write_file_atomic(state_dir / TRAINER_STATE, json.dumps({**payload, "fingerprint": config.fingerprint()}) + "\n")
    (state_dir / UNSAVED).unlink(missing_ok=True)  # the payload's train_s counts it (``read_trainer_state``)
    _write_curve(state_dir, payload["curve"])


def _write_curve(state_dir: Path, curve: list[dict[str, Any]]) -> None:
    write_file_atomic(state_dir.parent / RUN_CURVE, json.dumps(curve, indent=1) + "\n")


def read_trainer_state(state_dir: Path, config: AdaptConfig) -> dict[str, Any] | None:
    """The saved trainer state, checked against ``config``; ``None`` when nothing was saved yet. Its ``train_s``
    counts the time ended attempts spent past it (``record_unsaved``)."""
    file = state_dir / TRAINER_STATE
    if not file.is_file():
        return None
    try:
        saved = json.loads(file.read_text())
    except ValueError as exc:
        raise LadderizeError(f"cannot resume {state_dir.parent}: {file} is corrupt ({exc}); pass --force to start over") from None
    check_fingerprint(saved, config, state_dir.parent)
    saved["train_s"] = saved.get("train_s", 0.0) + _unsaved_seconds(state_dir)
    return saved


def record_unsaved(state_dir: Path, train_s: float) -> None:
    """An attempt ended by an exception at ``train_s`` seconds of training (its last progress report, counted from
    the run's start): keep the part past the saved state for the resume. Nothing when no state was saved (a rerun
    starts over)."""
    file = state_dir / TRAINER_STATE
    try:
        covered = json.loads(file.read_text()).get("train_s", 0.0) if file.is_file() else None
    except ValueError:
        covered = None
    if covered is not None and train_s > covered:
        write_file_atomic(state_dir / UNSAVED, json.dumps({"train_s": train_s - covered}) + "\n")


def _unsaved_seconds(state_dir: Path) -> float:
    try:
        return float(json.loads((state_dir / UNSAVED).read_text())["train_s"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0.0


def check_fingerprint(saved: dict[str, Any], config: AdaptConfig, run_dir: Path) -> None:
    """Refuse to resume a run that was started with other settings, naming them.

    A setting added to ``AdaptConfig`` after the run started is missing from its fingerprint;
    the run had that setting's default.
    """
    current = json.loads(json.dumps(config.fingerprint()))
    defaults = json.loads(json.dumps(AdaptConfig().fingerprint()))
    started = {**{k: defaults[k] for k in current if k not in saved["fingerprint"]}, **saved["fingerprint"]}
    if started != current:
        changed = sorted(k for k in current.keys() | started.keys() if started.get(k) != current.get(k))
        raise LadderizeError(f"cannot resume {run_dir}: the run was started with different {', '.join(changed)}")


def finish_state(run_dir: Path, state_dir: Path, keep: bool) -> Path | None:
    """After a finished run, remove its training state (it can be as large as the model and optimizer) unless ``keep``.

    Only ladderize's own files go: ``state/``, ``curve.json`` (the curve is also in OUT) and
    their temp dirs; the run dir itself only if that leaves it empty. Returns the state kept, if any.
    """
    if keep:
        return state_dir if state_dir.exists() else None
    for name in (STATE_DIR, f".{STATE_DIR}.tmp", f".{STATE_DIR}.old"):
        shutil.rmtree(run_dir / name, ignore_errors=True)
    (run_dir / RUN_CURVE).unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        run_dir.rmdir()  # only when empty
    return None
