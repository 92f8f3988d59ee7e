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
