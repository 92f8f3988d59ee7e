"""Small parsers of command-line values shared by the commands and the packages (no heavy imports)."""

from __future__ import annotations

from .errors import LadderizeError


def parse_int_list(text: str, what: str) -> tuple[int, ...]:
    """``"1,2,4,8"`` -> ``(1, 2, 4, 8)``: comma-separated positive integers, else a one-line ``LadderizeError``."""
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise LadderizeError(f"{what} must be comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise LadderizeError(f"{what} must list positive integers, got {text!r}")
    return values
