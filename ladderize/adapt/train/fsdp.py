"""The frozen teacher's FSDP2 units, so that it is not replicated on every rank (``sharded.py``).

``AdaptLoss`` runs the teacher piece by piece (``residual_states.embed``, ``run_layers``,
``logits_from``), not through ``teacher.forward``, so every piece that holds parameters is a unit
of its own (``teacher_units``): the embedding, each decoder layer, the final norm and the LM head.
Each unit gathers its parameters in its own forward and frees them after it, so a rank holds
1/world of the teacher plus one unit at a time.
``head_gathered`` keeps the final norm and LM head gathered while ``objectives.blockwise_head_losses``
calls them once per block of tokens: one all-gather per step, not one per block. A tied LM head
is one unit with the embedding whose weight it is.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from ...model import LadderLlamaForCausalLM


def teacher_units(teacher: LadderLlamaForCausalLM) -> list[torch.nn.Module | list[torch.nn.Module]]:
    """The modules that own the teacher's parameters, each one FSDP unit: a tied LM head and its embedding are one
    (a list), so that both hold the gathered weight while it is gathered."""
    if head_unit(teacher) is teacher.lm_head:
        return [teacher.model.embed_tokens, *teacher.model.layers, teacher.model.norm, teacher.lm_head]
    return [[teacher.model.embed_tokens, teacher.lm_head], *teacher.model.layers, teacher.model.norm]


def head_unit(teacher: LadderLlamaForCausalLM) -> torch.nn.Module:
    """The module that owns the LM head's weight: the head, or the embedding when they are tied."""
    tied = teacher.lm_head.weight is teacher.model.embed_tokens.weight
    return teacher.model.embed_tokens if tied else teacher.lm_head


@contextmanager
def head_gathered(*models: LadderLlamaForCausalLM) -> Iterator[None]:
    """Keep the units behind ``residual_states.logits_from`` (final norm, LM head) of each of ``models`` gathered
    inside the block, a unit two models share once; no-op for those not sharded on their own."""
    from torch.distributed.fsdp import FSDPModule

    units = list({id(unit): unit for model in models for unit in (model.model.norm, head_unit(model))
                  if isinstance(unit, FSDPModule)}.values())
    for unit in units:
        unit.unshard()
        unit.set_reshard_after_forward(False)
    try:
        yield
    finally:
        for unit in units:
            unit.set_reshard_after_forward(True)
            unit.reshard()
