"""A toy objective in one file: ``cos``, the mean cosine distance between the student's and the teacher's final
residual streams (entering the final norm), per token. One ``Objective`` entry and one stage preset, nothing else:
the teacher's pass, the stored teacher states, the FLOP count and the memory estimate follow from its traits
(docs/architecture.md, "Adding an objective"; ``test_toy_objective.py`` checks them).

Run as a script (``python tests/adapt/toy_objective.py adapt ...``, under torchrun too), it registers both and runs
ladderize's command line.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

from ladderize.adapt.objectives.losses import LossInputs
from ladderize.adapt.objectives.registry import OBJECTIVES, TEACHER_FINAL, Objective, register
from ladderize.adapt.plan.stages import STAGES


def cosine_distance(inputs: LossInputs) -> torch.Tensor:
    """``mean(1 - cos(student's final stream, teacher's))`` over the batch's tokens."""
    return (1 - F.cosine_similarity(inputs.final.float(), inputs.teacher.final.float(), dim=-1)).mean()


TOY = Objective("cos", teacher=TEACHER_FINAL, student_final=True, loss=cosine_distance)
PRESET: dict[str, Any] = {"objectives": "cos", "tokens": 32_768, "batch_size": 2, "warmup_steps": 5}


def register_toy(monkeypatch: pytest.MonkeyPatch | None = None) -> Objective:
    """Add ``cos`` and its stage preset (undone by ``monkeypatch``; for good in a process of its own without one)."""
    if monkeypatch is not None:
        monkeypatch.setitem(OBJECTIVES, TOY.name, TOY)
        monkeypatch.setitem(STAGES, TOY.name, PRESET)
        return TOY
    STAGES.setdefault(TOY.name, PRESET)
    return register(TOY)


if __name__ == "__main__":
    register_toy()
    from ladderize.cli import main

    main()
