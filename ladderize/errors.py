"""The error type that the CLI turns into one readable line and a nonzero exit."""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Iterator
from typing import TypeVar

E = TypeVar("E", bound=enum.Enum)


class LadderizeError(Exception):
    """A user-facing failure: bad input, missing data, unsupported model. Its message is one line."""


def parse_choice(kind: type[E], text: "str | E", noun: str) -> E:
    """``kind``'s member named by ``text`` (case and surrounding space ignored), else a one-line error."""
    try:
        return kind(text.strip().lower() if isinstance(text, str) else text)
    except ValueError:
        raise LadderizeError(f"unknown {noun} {text!r}; choose from {', '.join(str(m.value) for m in kind)}") from None


def one_line(exc: BaseException, limit: int = 300) -> str:
    """The first line of ``exc``'s message, at most ``limit`` characters (its type's name when empty)."""
    lines = str(exc).strip().splitlines()
    return lines[0][:limit] if lines else type(exc).__name__


class Interrupted(BaseException):
    """SIGINT or SIGTERM arrived: unwinds like ``KeyboardInterrupt`` (``finally`` blocks clean up).

    A ``BaseException`` but not a ``KeyboardInterrupt``, so neither ``except Exception`` nor the
    CLI framework's own Ctrl-C handling swallows it; the CLI turns it into one line and exit
    code 128 + signal number (130 for SIGINT, 143 for SIGTERM). ``hint`` (set by a command on
    the way out) tells the user how to continue.
    """

    def __init__(self, signum: int):
        import signal

        self.signum = int(signum)
        self.signame = signal.Signals(self.signum).name
        self.hint = ""
        super().__init__(self.signame)

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def install_interrupt_handlers() -> dict:
    """Make SIGINT and SIGTERM raise ``Interrupted`` (once; a second signal kills at once).

    Returns the previous handlers for ``restore_handlers``. Outside the main thread (where
    Python allows no handlers) it does nothing.
    """
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return {}

    def handler(signum, _frame):
        if _HELD["on"] and _HELD["signum"] is None:  # a training loop takes it where it can save (``holding_interrupts``)
            _HELD["signum"] = signum
            return
        signal.signal(signum, signal.SIG_DFL)  # a second one while cleaning up ends the process
        raise Interrupted(signum)

    previous = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        previous[signum] = signal.getsignal(signum)
        signal.signal(signum, handler)
    _defaults_in_forked_children()
    return previous


_HELD: dict = {"on": False, "signum": None}  # the interrupt a training loop holds for its next save point


@contextlib.contextmanager
def holding_interrupts() -> Iterator[None]:
    """Inside, the first SIGINT or SIGTERM does not unwind at once: it is held (``held_interrupt``) for the training
    loop to save its state at the end of the step and stop there (``adapt.training_state.SaveClock``); a second one
    unwinds at once. Leaving the block with one still held raises it. Without ``install_interrupt_handlers``'
    handlers (a library caller's own), nothing is held."""
    _HELD.update(on=True, signum=None)
    try:
        yield
    finally:
        signum = _HELD["signum"]
        _HELD.update(on=False, signum=None)
    if signum is not None:
        raise Interrupted(signum)


def held_interrupt() -> int | None:
    """The signal ``holding_interrupts`` holds, or None."""
    return _HELD["signum"]


_FORK_HOOK_INSTALLED = False


def _defaults_in_forked_children() -> None:
    """Forked children (DataLoader workers, a ``multiprocessing`` ``Pool``) get the default SIGINT/SIGTERM.

    A pool worker that raises ``Interrupted`` while holding the pool's queue lock, instead of dying
    on ``Pool.terminate()``'s SIGTERM, leaves the other workers blocked on that lock and the parent
    waiting forever in ``join()``. Only the command's own process turns signals into ``Interrupted``.

    The two signals are blocked across ``fork()``: a SIGTERM that reaches a child before its
    after-fork hook ran would otherwise land in Python's handler, and CPython drops the signals
    pending there when a child starts (``PyOS_AfterFork_Child``), so ``Pool.terminate()`` could
    signal a just-forked worker that then never died. Blocked, the signal waits in the kernel until
    the child has its default handlers, and then ends it.
    """
    global _FORK_HOOK_INSTALLED
    import os
    import signal
    import threading

    if _FORK_HOOK_INSTALLED or not hasattr(os, "register_at_fork") or not hasattr(signal, "pthread_sigmask"):
        return
    _FORK_HOOK_INSTALLED = True
    signals = {signal.SIGINT, signal.SIGTERM}
    masks: dict[int, set] = {}  # the forking thread's mask before the fork (the child keeps that thread's id)

    def block() -> None:
        masks[threading.get_ident()] = signal.pthread_sigmask(signal.SIG_BLOCK, signals)

    def unblock() -> None:
        signal.pthread_sigmask(signal.SIG_SETMASK, masks.pop(threading.get_ident(), set()))

    def reset_then_unblock() -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        unblock()

    os.register_at_fork(before=block, after_in_parent=unblock, after_in_child=reset_then_unblock)


def restore_handlers(previous: dict) -> None:
    """Put back the handlers ``install_interrupt_handlers`` replaced."""
    import signal

    for signum, handler in previous.items():
        signal.signal(signum, handler if handler is not None else signal.SIG_DFL)


def ignore_late_signals() -> None:
    """The command is over (its output printed): from here SIGINT and SIGTERM are ignored, so one that lands
    during the interpreter's teardown cannot turn a finished command into exit 130/143. (Python resets its
    own handlers to the default, killing, action at teardown; an ignored signal stays ignored.)"""
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, signal.SIG_IGN)


def exit_now(code: int) -> None:
    """End the process with ``code`` after the ``atexit`` handlers and a flush, skipping the interpreter's
    teardown (seconds of garbage collection with torch loaded): an interrupted command exits promptly."""
    import atexit
    import os
    import sys

    ignore_late_signals()
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # a closed or broken stream: nothing more to say
                pass
        os._exit(code)
