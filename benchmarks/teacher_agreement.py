"""How closely a student follows its dense teacher, token by token, on the perplexity window.

Per predicted position of each window (the ``[N, S]`` batch ``perplexity`` scores, e.g.
``wikitext2_ids``): the forward KL(teacher || student) of the next-token distributions, whether
both put their argmax on the same token, and each model's NLL of the actual next token. The means
are over all ``N x (S - 1)`` predictions; ``position_gap`` splits the positions ``[0, S - 1)``
into equal ranges to show where in the context the student's loss gap sits.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ladderize.errors import LadderizeError


def position_buckets(positions: int, buckets: int) -> list[tuple[int, int]]:
    """``buckets`` half-open ranges ``[start, end)`` of equal size (up to one) covering ``[0, positions)``."""
    if buckets < 1:
        raise LadderizeError(f"buckets must be at least 1, got {buckets}")
    if buckets > positions:
        raise LadderizeError(f"{buckets} position buckets for {positions} predicted positions; use at most {positions}")
    edges = [i * positions // buckets for i in range(buckets + 1)]
    return list(zip(edges, edges[1:]))


def _logits(model: torch.nn.Module, batch: torch.Tensor) -> torch.Tensor:
    device = next(model.parameters()).device
    return model(input_ids=batch.to(device), use_cache=False).logits  # [B, S, V]


@torch.no_grad()
def teacher_agreement(student: torch.nn.Module, teacher: torch.nn.Module, ids: torch.Tensor, *, batch_size: int = 4, buckets: int = 8) -> dict:
    """KL(teacher || student), top-1 agreement and both NLLs on the windows ``ids`` (``[N, S]`` token ids).

    Returns the means over every predicted token (``kl``, ``top1``, ``nll_student``,
    ``nll_teacher``; logits in float32, natural log), their count (``tokens``) and
    ``position_gap``: per range of predicting positions ``[start, end)`` of ``buckets`` equal
    ranges over ``[0, S - 1)``, its ``tokens``, both NLLs, their ``gap`` (student - teacher) and ``kl``.
    """
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2:
        shape = tuple(ids.shape) if isinstance(ids, torch.Tensor) else type(ids).__name__
        raise LadderizeError(f"ids must be a 2-D tensor [windows, seq_len] of token ids, got {shape}")
    if ids.shape[0] == 0 or ids.shape[1] < 2:
        raise LadderizeError(f"ids must hold at least one window of 2 or more tokens, got {tuple(ids.shape)}")
    if batch_size < 1:
        raise LadderizeError(f"batch_size must be at least 1, got {batch_size}")
    ids = ids.long()
    positions = ids.shape[1] - 1
    ranges = position_buckets(positions, buckets)
    sums = torch.zeros(4, positions, dtype=torch.float64)  # kl, top1, nll_student, nll_teacher per predicting position
    modes = (student.training, teacher.training)
    student.eval()
    teacher.eval()
    try:
        for start in range(0, ids.shape[0], batch_size):
            batch = ids[start : start + batch_size]
            student_logits = _logits(student, batch)
            teacher_logits = _logits(teacher, batch).to(student_logits.device)
            targets = batch[:, 1:].to(student_logits.device)  # [B, S-1]
            for row in range(batch.shape[0]):  # one window at a time: a few [S, V] float32 tensors
                log_q = F.log_softmax(student_logits[row, :-1].float(), dim=-1)  # [S-1, V]
                log_p = F.log_softmax(teacher_logits[row, :-1].float(), dim=-1)
                kl = F.kl_div(log_q, log_p, log_target=True, reduction="none").sum(-1)
                top1 = (log_q.argmax(-1) == log_p.argmax(-1)).float()
                target = targets[row].unsqueeze(-1)
                nll_student = -log_q.gather(-1, target).squeeze(-1)
                nll_teacher = -log_p.gather(-1, target).squeeze(-1)
                sums += torch.stack([kl, top1, nll_student, nll_teacher]).double().cpu()
    finally:
        student.train(modes[0])
        teacher.train(modes[1])
    windows = ids.shape[0]
    total = sums.sum(-1) / (windows * positions)
    gap = []
    for a, b in ranges:
        part = sums[:, a:b].sum(-1) / (windows * (b - a))
        gap.append({"start": a, "end": b, "tokens": windows * (b - a), "nll_student": part[2].item(), "nll_teacher": part[3].item(),
                    "gap": (part[2] - part[3]).item(), "kl": part[0].item()})
    return {"kl": total[0].item(), "top1": total[1].item(), "nll_student": total[2].item(), "nll_teacher": total[3].item(),
            "tokens": windows * positions, "position_gap": gap}
