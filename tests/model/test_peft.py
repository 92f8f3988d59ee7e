"""peft on every layer mode: each Linear method equals its own merged model, trains every adapter parameter,
and LoRA's dropout acts in SPD layers; ``ladder_llama`` has Llama's rows in peft's default target tables."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import tiny_model
from tests.model.helpers import ATOL, HYBRID, max_diff, token_ids

ALL_LINEARS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
SPD_LAYERS = [2]  # HYBRID's SPD layer (dense, ladder, spd, ladder)


def _method_config(method: str, **extra):
    import peft

    if method in ("lora", "dora"):
        extra = {"target_modules": ALL_LINEARS, **extra}
        return peft.LoraConfig(r=2, lora_alpha=4, use_dora=method == "dora", **extra)
    if method == "ia3":  # o_proj and down_proj scale their input, the others their output (bias included)
        return peft.IA3Config(target_modules=ALL_LINEARS, feedforward_modules=["o_proj", "down_proj"], **extra)
    if method == "loha":
        return peft.LoHaConfig(r=2, alpha=4, target_modules=ALL_LINEARS, **extra)
    return peft.LoKrConfig(r=2, alpha=4, target_modules=ALL_LINEARS, **extra)


def _adapted(method: str, seed: int = 0, **extra):
    """The hybrid tiny model (biases on, so constant terms count) with ``method`` on every linear, its
    adapter parameters moved away from their identity initialisation."""
    import peft

    model = tiny_model(seed=seed, attention_bias=True, mlp_bias=True, **HYBRID)
    adapted = peft.get_peft_model(model, _method_config(method, **extra))
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for param in adapted.parameters():
            if param.requires_grad:
                param.add_(0.1 * torch.randn(param.shape, generator=generator))
    return adapted


@pytest.mark.parametrize("method", ["lora", "dora", "ia3", "loha", "lokr"])
def test_every_peft_method_equals_its_merged_model_and_trains_every_adapter_parameter(method):
    adapted = _adapted(method).eval()
    ids = token_ids()
    with torch.no_grad():
        adapter_logits = adapted(input_ids=ids, use_cache=False).logits
    adapted.train()
    adapted(input_ids=ids, use_cache=False).logits.square().mean().backward()
    untrained = [name for name, p in adapted.named_parameters()
                 if p.requires_grad and (p.grad is None or not p.grad.abs().max() > 0)]
    assert not untrained, f"no gradient reaches {untrained}"
    assert any(".layers.2." in name for name, p in adapted.named_parameters() if p.requires_grad)  # SPD adapted
    merged = adapted.eval().merge_and_unload()
    with torch.no_grad():
        merged_logits = merged(ids, use_cache=False).logits
    assert max_diff(adapter_logits, merged_logits) <= ATOL


def test_lora_dropout_acts_in_spd_layers_in_training_only():
    # only the modules an SPD block used to read as weights: o_proj and the MLP's
    adapted = _adapted("lora", lora_dropout=0.5, layers_to_transform=SPD_LAYERS,
                       target_modules=["o_proj", "gate_proj", "up_proj", "down_proj"]).train()
    ids = token_ids()
    with torch.no_grad():
        torch.manual_seed(0)
        first = adapted(input_ids=ids, use_cache=False).logits
        torch.manual_seed(1)
        second = adapted(input_ids=ids, use_cache=False).logits
        assert max_diff(first, second) > 1e-3  # the SPD layer's dropout draws differ
        adapted.eval()
        torch.manual_seed(0)
        assert torch.equal(adapted(input_ids=ids, use_cache=False).logits,
                           adapted(input_ids=ids, use_cache=False).logits)


def test_plain_spd_layers_still_slice_their_weights():
    """Without an adapter an SPD layer computes from weight slices (bit-identical to before; no call of the module)."""
    model = tiny_model(**HYBRID)
    calls = []
    for name in ("o_proj", "gate_proj", "up_proj", "down_proj"):
        module = model.model.layers[2].self_attn.o_proj if name == "o_proj" else getattr(model.model.layers[2].mlp, name)
        module.register_forward_hook(lambda *_, n=name: calls.append(n))
    with torch.no_grad():
        model(token_ids(), use_cache=False)
    assert calls == []


def test_lora_config_without_target_modules_takes_llamas_defaults():
    import peft

    model = tiny_model(**HYBRID)
    adapted = peft.get_peft_model(model, peft.LoraConfig(task_type="CAUSAL_LM"))
    assert adapted.peft_config["default"].target_modules == {"q_proj", "v_proj"}
    ia3 = peft.get_peft_model(tiny_model(**HYBRID), peft.IA3Config(task_type="CAUSAL_LM")).peft_config["default"]
    assert ia3.target_modules == {"k_proj", "v_proj", "down_proj"} and ia3.feedforward_modules == {"down_proj"}


def test_peft_tables_are_patched_when_peft_loads_after_ladderize():
    import subprocess
    import sys

    code = ("import ladderize, peft.utils.constants as c; "
            "assert c.TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING['ladder_llama'] == "
            "c.TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING['llama']")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
