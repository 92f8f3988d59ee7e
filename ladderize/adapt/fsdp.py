"""Sharding the frozen teacher under FSDP, so that it is not replicated on every rank.

``AdaptLoss`` keeps the teacher out of its registered submodules (Accelerate wraps only the
student), and it runs the teacher piece by piece (``stream.embed``, ``run_layers``,
``logits_from``), not through ``teacher.forward``. ``shard_teacher`` therefore applies torch's
FSDP2 ``fully_shard`` to every piece that holds parameters: the embedding, each decoder
layer, the final norm and the LM head. Each unit gathers its parameters in its own forward
and frees them after it, so a rank holds 1/world of the teacher plus one unit at a time.
"""

from __future__ import annotations

import torch

from ..model import LadderLlamaForCausalLM


def teacher_units(teacher: LadderLlamaForCausalLM) -> list[torch.nn.Module]:
    """The modules that own the teacher's parameters, each one FSDP unit."""
    units = [teacher.model.embed_tokens, *teacher.model.layers, teacher.model.norm]
    if teacher.lm_head.weight is not teacher.model.embed_tokens.weight:  # tied heads share the embedding's unit
        units.append(teacher.lm_head)
    return units


def shard_teacher(teacher: LadderLlamaForCausalLM, mesh=None) -> LadderLlamaForCausalLM:
    """Shard the frozen ``teacher`` over the default process group (or ``mesh``) with FSDP2, in place."""
    from torch.distributed.fsdp import fully_shard

    teacher.requires_grad_(False)
    for unit in teacher_units(teacher):
        fully_shard(unit, mesh=mesh, reshard_after_forward=True)
    return teacher
