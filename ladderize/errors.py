"""The error type that the CLI turns into one readable line and a nonzero exit."""

from __future__ import annotations


class LadderizeError(Exception):
    """A user-facing failure: bad input, missing data, unsupported model. Its message is one line."""
