"""The one dtype parser of every command: names (and their short aliases) to torch dtypes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .errors import LadderizeError

if TYPE_CHECKING:  # torch is imported only when a name is parsed
    import torch

ALIASES = {"fp32": "float32", "float": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}
NAMES = ("float32", "bfloat16", "float16")


def parse_dtype(name: str | None, auto: "torch.dtype | None" = None) -> "torch.dtype | None":
    """``float32``/``bfloat16``/``float16`` (or fp32, bf16, fp16, half); ``auto``/``None`` give ``auto``.

    Raises ``LadderizeError`` with one line for any other name.
    """
    if name is None or str(name).lower() == "auto":
        return auto
    import torch

    key = ALIASES.get(str(name).lower(), str(name).lower())
    if key not in NAMES:
        raise LadderizeError(f"unknown dtype {name!r}; use auto, float32, bfloat16 or float16")
    return getattr(torch, key)


__all__ = ["ALIASES", "NAMES", "parse_dtype"]
