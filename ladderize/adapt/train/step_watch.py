"""What ends a stage's steps or saves its state, asked after each optimizer step by both stage kinds.

Three things decide it, the same way in the joint loop (``trainer.py``) and in the sequential stage's windows
(``sequential/sequential_run.py``), each holding one ``StepWatch``:

- a Ctrl-C or SIGTERM, held for the step's end (``errors.holding_interrupts``) and voted over the processes
  (``training_state.InterruptVote``): the run saves its state there and stops after the save;
- the save clock (``training_state.SaveClock``): every ``save_every`` steps, or a minute in and then every
  ``save_minutes``, the main process's clock deciding for every process;
- a wall budget's deadline (``deadline.Deadline``), by the main process's clock.

So a change to how a run hears a signal, when it saves, or how it keeps its time is made here once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch

from ...errors import holding_interrupts
from ..plan.config import AdaptConfig
from .deadline import Deadline
from .training_state import InterruptVote, SaveClock


class StepWatch:
    """One stage's interrupt vote, save clock and deadline (module docstring). ``deadline``: when the stage should end
    (``time.perf_counter()``'s clock on the main process; None: no deadline); ``device``: where the main process's word
    is broadcast under a launcher."""

    def __init__(self, config: AdaptConfig, say: Callable[[str], None] | None, deadline: float | None,
                 device: torch.device):
        self.clock = SaveClock(config, say)
        self.ends = Deadline(deadline, device)
        self.device = device
        self._vote: InterruptVote | None = None

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        """Inside, a Ctrl-C or SIGTERM is held for the next step's end (``after_step``), where the run saves and stops;
        one still held when the block ends is raised there. The processes' vote (one for the stage, made on its first
        block: under a launcher on CUDA it is a process group of its own) is finished on a normal exit: every process
        started the same votes."""
        if self._vote is None:
            self._vote = InterruptVote()
        with holding_interrupts():
            yield
            self._vote.close()

    def after_step(self, step: int, *, last: bool = False, read_clock: bool = True) -> bool:
        """Whether to save after optimizer step ``step``, on every process alike: the save clock is due (read where
        ``read_clock``, a step whose losses are read; a clock of steps always), or a held signal was voted for, which
        stops the run after that save (``stopping``). ``last``: the training's last step, whose vote is taken at once.
        Called on every process at every step inside ``holding``."""
        if read_clock or self.clock.by_steps:
            due = self.clock.due(step, self.device)
        else:
            due = False
            self.clock.stepped()
        heard = self._vote.heard(last=last) if self._vote is not None else None
        if heard is not None:
            self.clock.stop, due = heard, True
        return due

    @property
    def stopping(self) -> bool:
        """Whether a held signal stops the run after the next save."""
        return self.clock.stop is not None

    def saved(self) -> None:
        """The state was saved: the clock starts again, and a signal voted for stops the run here (raised)."""
        self.clock.saved(self._vote.lag if self._vote is not None else 1)

    def time_up(self) -> bool:
        """Whether the stage's deadline has passed, on every process alike (collective under a launcher)."""
        return self.ends.past()

    def close(self) -> None:
        """Finish the processes' vote in flight, where a run leaves its steps early (every process leaves at the same
        step)."""
        if self._vote is not None:
            self._vote.close()
