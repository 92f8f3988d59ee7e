"""peft LoRA on the converted layers: a standard adapter in ``OUT/adapter/``, merged into the weights in ``OUT``.

``add_lora`` applies ``peft.get_peft_model`` with a ``LoraConfig`` whose targets are the TP
plan's linear modules (``checkpoint/architectures.py``) of the converted layers only
(``layers_to_transform``). peft replaces those ``nn.Linear`` modules in place with
``lora.Linear`` wrappers, so the model object keeps its structure (``model.model.layers``)
and the objectives run on it unchanged.

SPD blocks call the wrapped modules on each head group's input (``modeling_ladder_llama.column_shard``,
``linear_part``), as dense and ladder blocks do on the whole input, so the adapter (any peft Linear
method, dropout included) acts in them exactly as its merged weights would. ``lora_dropout`` stays 0
here: the recipe was measured without it.

The saved adapter loads with ``PeftModel.from_pretrained(<converted base>, OUT/adapter)``;
``merge_lora`` bakes it in (``merge_and_unload``) for the merged checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ...checkpoint.architectures import LINEAR_MODULES
from ...errors import LadderizeError
from ...model import LadderLlamaForCausalLM

ADAPTER_DIR = "adapter"


@dataclass(frozen=True)
class LoraSpec:
    rank: int = 16
    alpha: float = 32.0
    targets: tuple[str, ...] = LINEAR_MODULES  # the TP plan's linear modules (checkpoint/architectures.py)


def lora_config(layers: list[int], spec: LoraSpec = LoraSpec(), base: str | None = None):
    """peft's ``LoraConfig`` for the target linears of ``layers`` (no dropout: the recipe was measured without)."""
    from peft import LoraConfig

    if not layers:
        raise LadderizeError("the checkpoint has no converted layers; --train lora has nothing to adapt (use --train all)")
    return LoraConfig(
        r=spec.rank, lora_alpha=spec.alpha, lora_dropout=0.0, bias="none", task_type="CAUSAL_LM",
        target_modules=list(spec.targets), layers_to_transform=sorted(layers), layers_pattern="layers",
        base_model_name_or_path=base,
    )


def add_lora(model: LadderLlamaForCausalLM, layers: list[int], spec: LoraSpec = LoraSpec(), base: str | None = None):
    """Wrap the target linears of ``layers`` with peft LoRA (in place); freeze everything else.

    Returns ``(peft_model, adapter_parameters)``. ``model`` itself now holds the LoRA layers,
    so it can be trained directly; ``peft_model`` saves the adapter and merges it.
    """
    from peft import get_peft_model

    model.requires_grad_(False)
    peft_model = get_peft_model(model, lora_config(layers, spec, base))
    params = [p for n, p in model.named_parameters() if "lora_" in n]
    for param in params:
        param.requires_grad_(True)
    return peft_model, params


def save_adapter(peft_model, path: Path) -> Path:
    """Write the standard adapter files (``adapter_config.json``, ``adapter_model.safetensors``) to ``path``."""
    peft_model.save_pretrained(str(path), safe_serialization=True)
    return path


def merge_lora(peft_model) -> LadderLlamaForCausalLM:
    """Bake the adapter into the weights and return the plain model (peft's ``merge_and_unload``)."""
    with torch.no_grad():
        model = peft_model.merge_and_unload(progressbar=False, safe_merge=True)
    if hasattr(model, "peft_config"):
        del model.peft_config
    return model
