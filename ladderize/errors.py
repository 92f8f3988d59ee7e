"""The error type that the CLI turns into one readable line and a nonzero exit."""

from __future__ import annotations

import enum
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


def install_interrupt_handlers() -> None:
    """Make SIGINT and SIGTERM raise ``Interrupted`` in the main thread (once); a second signal kills at once."""
    import signal

    def handler(signum, _frame):
        signal.signal(signum, signal.SIG_DFL)  # a second one while cleaning up ends the process
        raise Interrupted(signum)

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, handler)
