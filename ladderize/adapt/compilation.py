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

The setting (``AdaptConfig.compile``): ``True`` compiles and refuses a machine where it cannot (CUDA without
Triton, a CPU without a C++ compiler; checked by compiling a small function once per process); ``False`` runs eager;
``None`` (auto, the default) compiles on the device types where compiled adapt runs were measured against eager
(``AUTO_DEVICES``: the CPU; docs/adapt-design.md, "Compiled layers and kd loss") and where the backend runs, unless the
environment says ``LADDERIZE_COMPILE=0``; a wall ``--budget`` under ``AUTO_MIN_BUDGET_S`` runs eager (``eager_for_budget``,
applied by ``budget.size_recipe``). On CUDA it is ``--compile``'s to ask until the GPU check has measured it
(``tests/gpu/test_adapt_gpu.py`` runs a compiled stage there). The sharded path
(``sharded.py``) compiles each layer before FSDP2 shards it (tested against eager on a CPU).
A compiled layer computes the same function in a different order of roundings (fused ops keep their
intermediates in float32), so a run resumed with another setting continues within rounding, as on
another device (``AdaptConfig.fingerprint`` leaves it out).

On CUDA, Inductor by default times a reduction kernel's candidate block sizes on the device and keeps the fastest,
and the block sizes set the order of its sums: the same run gets other roundings when something else loads the GPU.
The GPU check saw it on an H100 (benchmarks/results/gpu_check/h100-2026-11-26/): a compiled sequential stage beside five
other test workers drifted from eager by 1.6e-4 of the loss in 16 steps, alone by 5.9e-6 (twice, the same digits).
So compiled graphs on CUDA use Inductor's deterministic mode (``inductor_options``): kernels chosen by rule, never by
timing, and a run or its resume gets the same kernels on the same GPU and software.
"""

from __future__ import annotations

import functools
import os
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import replace

import torch

from ..errors import LadderizeError
from ..model.layout import LayerMode, module_program
from ..model.residual import layer_program

ENV = "LADDERIZE_COMPILE"  # auto's answer when set: 1/on/true or 0/off/false
RECOMPILE_LIMIT = 4096  # graphs of the decoder-layer forward: layers (student and teacher) x grad modes x batch shapes
COMPILING = ("decoder layers compiled (torch.compile): the first steps of each layer kind and shape wait for the "
             "compiler; --no-compile runs eager")
ON, OFF = ("1", "on", "true", "yes"), ("0", "off", "false", "no")
AUTO_DEVICES = ("cpu",)  # where auto compiles: the device types a compiled run was measured on (module docstring)
# the shortest wall budget auto compiles for: 30 minutes, the one a compiled run was measured at against eager (6%
# less training for the same token passes, its compiler's waits included); on a cold cache the first kind of layer
# alone waits about a minute (60 s for ladder 15-29 in fp32), and a budget of a few minutes spends more on that than
# fused ops give back (--budget 10m: 34,816 token passes compiled on a cold cache against 59,392 eager; docs/adapt-measurements.md)
AUTO_MIN_BUDGET_S = 1800.0


def _cpu_compiler() -> str | None:
    names = [os.environ["CXX"]] if os.environ.get("CXX") else ["g++", "c++", "clang++"]
    return next((found for name in names if (found := shutil.which(name))), None)


@functools.lru_cache(maxsize=None)
def unavailable(device_type: str) -> str | None:
    """Why ``torch.compile`` cannot run on this device type here (None: it can; a small function compiled once)."""
    if device_type == "cuda":
        from torch.utils._triton import has_triton

        if not has_triton():
            return "Triton is not installed"
        import torch._inductor.config as inductor

        if not hasattr(inductor, "deterministic"):  # inductor_options asks for it
            return f"Inductor in torch {torch.__version__} has no deterministic mode"
    elif device_type == "cpu":
        if _cpu_compiler() is None:
            return "no C++ compiler found (g++, c++, clang++ or $CXX)"
    else:
        return f"not measured on {device_type}"
    try:
        probe = torch.compile(lambda x: torch.nn.functional.silu(x) * x + 1, dynamic=False, options=inductor_options(device_type))
        probe(torch.ones(8, device=device_type))
    except Exception as error:  # the backend's own message (a missing header, a broken toolchain)
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return f"torch.compile failed on a small function: {first}"
    return None


def resolve_compile(setting: bool | None, device: torch.device) -> bool:
    """Whether this run compiles its decoder layers (module docstring): ``setting`` True, False or None (auto)."""
    if setting is False:
        return False
    if setting is None:
        return _auto_may_compile(device) and unavailable(device.type) is None
    reason = unavailable(device.type)
    if reason is not None:
        raise LadderizeError(f"--compile: torch.compile cannot run on {device.type} here: {reason} (or run with --no-compile)")
    return True


def _auto_may_compile(device: torch.device) -> bool:
    """Whether auto considers compiling on ``device`` at all (``$LADDERIZE_COMPILE``, the device type), before
    asking the backend whether it runs (``unavailable``)."""
    told = os.environ.get(ENV, "").strip().lower()
    if told and told not in ON + OFF:
        raise LadderizeError(f"${ENV}={told!r}: use 1/on or 0/off")
    return not (told in OFF or device.type not in AUTO_DEVICES)


def eager_for_budget(setting: bool | None, seconds: float, device: torch.device) -> bool:
    """Whether auto (``setting`` None), which may compile on ``device``, runs a wall budget of ``seconds`` eager:
    under ``AUTO_MIN_BUDGET_S`` the compiler's waits cost more than they save. Decided without compiling anything
    (``unavailable``'s probe takes seconds): where the backend does not run, auto is eager anyway."""
    return setting is None and seconds < AUTO_MIN_BUDGET_S and _auto_may_compile(device)


def inductor_options(device: torch.device | str) -> dict[str, bool]:
    """Inductor's settings for graphs compiled for ``device``: on CUDA its deterministic mode, which picks kernels by
    rule instead of timing them (module docstring; ``unavailable`` refuses CUDA where Inductor has no such mode);
    elsewhere Inductor's defaults (a CPU's kernels are not timed)."""
    return {"deterministic": True} if torch.device(device).type == "cuda" else {}


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
