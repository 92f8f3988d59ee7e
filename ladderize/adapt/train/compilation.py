"""Compiled decoder layers for training (``adapt --compile``): ``torch.compile`` one layer kind at a time.

Every adapt stage spends most of its time in decoder layers. Their matmuls are already fast (oneDNN
on a CPU, cuBLAS on a GPU); what eager PyTorch adds is one pass over memory per elementwise op:
RMSNorm, rotary, SiLU x up, the residual adds and autocast's casts, and Inductor fuses them. On SmolLM2-135M
in bf16 on one core of this project's CPU, side by side in one process (``benchmarks/bench_layer_step.py``), a
converted layer's forward takes 42 against 58 ms per 1,024 tokens and its training step (forward, backward, clip,
fused AdamW) 149 against 206 ms. Of that, 168 against 206 comes from the fused elementwise ops; the rest from
attention's backward, which a compiled layer on a CPU computes as tensor ops Inductor fuses in place of the flash
kernel's backward (``causal_attention.py``; docs/adapt-design.md, "Compiled layers and kd loss").

Regional compilation: each decoder layer's ``forward`` is compiled in place (``nn.Module.compile``).
Dynamo traces one graph per layer kind, grad mode and batch shape, and the layers of a kind share it: a layer's
residual-stream slot numbers, constants of its graph, are numbered from the layer's own start
(``model/residual.layer_program``), so every ladder layer after the first reads the same ones (``graph_kinds``:
ladder 15-29 of a 30-layer model has three kinds, the first layer, the dense layers after it and the ladder
layers; the teacher's and the student's layers of a kind share theirs too). Numbered from the model's start, each
layer was a graph of its own: a kd stage's first step on ladder 15-29 waited 51 s for 15 traces where it now waits
10 s for one (``benchmarks/bench_kd_step.py --compile --stored-first``; docs/adapt-measurements.md). The recompile limits are
raised (``RECOMPILE_LIMIT``): at dynamo's default of 8, the graphs after the eighth (a layout of many kinds, several
batch shapes) would run eager without a word. State dict keys do not change.

The kd loss is compiled too (``objectives.compiled_kd_loss``, with ``inductor_options``): ``objectives.blockwise_kd`` runs it, and its gradient, on
blocks of 128 x 49,152 float32 logits, where eager PyTorch makes a dozen passes (temperature, two log-softmaxes,
the KL terms and their backward) and Inductor two or three: 29 against 63 ms a block on one core. The LM head's
matmul stays eager (one matmul, nothing to fuse).

When a run compiles, and the Inductor settings of its graphs, is ``compile_policy.py``'s. A compiled layer computes the same function in a different order of roundings (fused ops keep their
intermediates in float32), so a run resumed with another setting continues within rounding, as on
another device (``AdaptConfig.fingerprint`` leaves it out).

"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

import torch

from ...checkpoint.placement import inductor_options
from ...model.layout import LayerMode, module_program
from ...model.residual import layer_program

RECOMPILE_LIMIT = 4096  # graphs of the decoder-layer forward: layers (student and teacher) x grad modes x batch shapes
def compile_layers(layers: Iterable[torch.nn.Module], device: torch.device | str) -> None:
    """Compile each decoder layer's forward in place (regional compilation; module docstring) for ``device``, its
    attention through ``causal_attention.training_attention`` (on a CPU, a backward Inductor fuses; elsewhere the
    stock SDPA)."""
    import torch._dynamo

    from .causal_attention import training_attention

    config = torch._dynamo.config
    config.recompile_limit = max(config.recompile_limit, RECOMPILE_LIMIT)
    config.accumulated_recompile_limit = max(config.accumulated_recompile_limit, RECOMPILE_LIMIT)
    options = inductor_options(device)
    for layer in layers:
        layer.self_attn.attention_function = training_attention
        layer.compile(dynamic=False, options=options)


def graph_kinds(*models: Sequence[LayerMode]) -> list[tuple[int, ...]]:
    """For each of ``models`` (its layer modes), the kind of compiled graph each layer runs (module docstring): layers
    that read the same slot numbers from their start share one, across the models too (the teacher's dense layers
    and the student's), and kinds are numbered in order of first appearance."""
    kinds: dict[tuple, int] = {}
    found = []
    for modes in models:
        program = module_program(modes)
        keys = []
        for layer in range(len(modes)):
            attention, mlp, slots = layer_program(program, layer)  # the layer's own index is not part of its graph
            keys.append((replace(attention, layer=0, overlaps_next=False), replace(mlp, layer=0, overlaps_next=False), slots))
        found.append(tuple(kinds.setdefault(key, len(kinds)) for key in keys))
    return found


def adamw(params: list[torch.nn.Parameter], **settings) -> torch.optim.AdamW:
    """AdamW, with its fused kernel (one pass over each tensor for the whole update) where every parameter is on a
    CPU or a CUDA device; the same update as the loop, within rounding."""
    fuse = bool(params) and all(param.device.type in ("cpu", "cuda") for param in params)
    return torch.optim.AdamW(params, fused=True if fuse else None, **settings)


def recompute_activations(model: torch.nn.Module) -> None:
    """Activation checkpointing on each decoder layer of ``model`` (non-reentrant): transformers'
    ``activation_checkpointing_enable`` where it has it (5.24 on), else its ``gradient_checkpointing_enable``."""
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
