"""LoRA on the converted layers, merged into the weights on save.

SPD layers read ``o_proj.weight`` and the MLP weights directly (each rank takes its own
columns or rows) instead of calling the modules, so an adapter that only wraps
``Linear.forward`` (peft's ``lora.Linear``) would be silently skipped there. Here the
low-rank update is a ``torch.nn.utils.parametrize`` parametrization of the weight itself:
every read of ``weight`` (forward, per-rank slices, the TP runtime's sharding) sees
``W + (alpha / r) * B @ A``. Merging bakes the update in and removes the parametrization,
so the saved checkpoint has plain Llama tensor names. The hyper-parameters follow peft's
``LoraConfig`` (r, lora_alpha, target modules); the adapter is initialised as peft does
(A Kaiming-uniform, B zero), so training starts at the converted model exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.utils import parametrize

from ..convert.architectures import LINEAR_MODULES
from ..model import LadderLlamaForCausalLM

LINEAR_NAMES = LINEAR_MODULES  # the TP plan's linear modules (convert/architectures.py)


@dataclass(frozen=True)
class LoraSpec:
    rank: int = 16
    alpha: float = 32.0
    targets: tuple[str, ...] = LINEAR_NAMES


class LowRankDelta(nn.Module):
    """Parametrization ``W -> W + scale * B @ A`` with trainable ``A [r, in]`` and ``B [out, r]``."""

    def __init__(self, out_features: int, in_features: int, rank: int, alpha: float, dtype, device):
        super().__init__()
        self.lora_A = nn.Parameter(torch.empty(rank, in_features, dtype=dtype, device=device))
        self.lora_B = nn.Parameter(torch.zeros(out_features, rank, dtype=dtype, device=device))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        self.scale = alpha / rank

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return weight + self.scale * (self.lora_B @ self.lora_A)


def add_lora(model: LadderLlamaForCausalLM, layers: list[int], spec: LoraSpec = LoraSpec()) -> list[nn.Parameter]:
    """Attach low-rank deltas to the target linears of ``layers``; freeze everything else. Returns the adapter parameters."""
    for param in model.parameters():
        param.requires_grad_(False)
    adapters: list[nn.Parameter] = []
    for index in layers:
        layer = model.model.layers[index]
        for name in spec.targets:
            linear = layer.get_submodule(name)
            weight = linear.weight
            delta = LowRankDelta(weight.shape[0], weight.shape[1], spec.rank, spec.alpha, weight.dtype, weight.device)
            parametrize.register_parametrization(linear, "weight", delta)
            adapters.extend([delta.lora_A, delta.lora_B])
    return adapters


def has_lora(model: nn.Module) -> bool:
    return any(parametrize.is_parametrized(module, "weight") for module in model.modules())


def merge_lora(model: nn.Module) -> nn.Module:
    """Bake every low-rank delta into its weight and drop the parametrization (in place)."""
    for module in list(model.modules()):
        if parametrize.is_parametrized(module, "weight"):
            parametrize.remove_parametrizations(module, "weight", leave_parametrized=True)
    return model
