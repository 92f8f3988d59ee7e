"""Sampling settings of the runtime's decoder, and their check (light: no torch, so the command line checks them first)."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import LadderizeError


@dataclass(frozen=True)
class Sampling:
    """Greedy when ``temperature == 0``; otherwise temperature / top-k / top-p sampling with a seed."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0


def check_sampling(sampling: Sampling) -> None:
    """One line of error for a sampling setting the decoder cannot use."""
    if sampling.temperature < 0:
        raise LadderizeError(f"--temperature must be 0 (greedy) or positive, got {sampling.temperature}")
    if not 0 < sampling.top_p <= 1:
        raise LadderizeError(f"--top-p must be in (0, 1], got {sampling.top_p}")
    if sampling.top_k < 0:
        raise LadderizeError(f"--top-k must be 0 (all tokens) or positive, got {sampling.top_k}")
