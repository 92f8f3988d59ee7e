"""The learning-rate schedule of both trainings (joint and sequential)."""

from __future__ import annotations

import math
from collections.abc import Callable


def warmup_cosine(total_steps: int, warmup_steps: int, min_ratio: float) -> Callable[[int], float]:
    """Learning-rate factor per step: linear warm-up, then cosine decay to ``min_ratio``."""
    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / (warmup_steps + 1)
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    return factor


__all__ = ["warmup_cosine"]
