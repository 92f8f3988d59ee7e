"""The dense teacher of a converted checkpoint (its source, or another dense checkpoint of its shape): where it is,
that it fits the student, and loading it. Head grouping measures against it; every adapt stage learns from it."""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import LadderizeError
from ..model import LadderLlamaConfig, LadderLlamaForCausalLM

SHAPE_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size")


def check_teacher(path: str, teacher_config: LadderLlamaConfig, student_config: LadderLlamaConfig) -> None:
    """Refuse a teacher that is not dense or whose shape differs from the student's (one line)."""
    if teacher_config.layout.converted_layers:
        raise LadderizeError(f"teacher {path} is not dense (layout {teacher_config.layout.describe()}); pass the dense source with --teacher")
    for name in SHAPE_FIELDS:
        if getattr(teacher_config, name) != getattr(student_config, name):
            raise LadderizeError(f"teacher {path} does not match the checkpoint: {name} {getattr(teacher_config, name)} vs {getattr(student_config, name)}")


def load_teacher(path: str, student: LadderLlamaForCausalLM, device: str | torch.device = "cpu") -> LadderLlamaForCausalLM:
    """The dense teacher at ``path``, whole, in fp32 on ``device``, frozen and in eval mode."""
    from ..checkpoint.io import load_model

    teacher = load_model(path, dtype=torch.float32, device=device)
    check_teacher(path, teacher.config, student.config)
    teacher.requires_grad_(False)
    return teacher.eval()
