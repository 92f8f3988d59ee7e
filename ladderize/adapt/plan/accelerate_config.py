"""A user's Accelerate config, as ``accelerate launch`` hands it to the processes, read once into adapt's settings.

``accelerate launch --config_file CONFIG`` passes its config to every process as environment variables
(``ACCELERATE_USE_FSDP``, ``FSDP_OFFLOAD_PARAMS``, ``ACCELERATE_MIXED_PRECISION``, ...). Each one is honoured,
mapped onto adapt's own setting, or refused in one line naming what ladderize does instead; none is ignored:

- FSDP (``distributed_type: FSDP``): the sharded training (``--shard fsdp``: FSDP2, each decoder layer a unit, fully
  sharded and resharded after its forward); its activation checkpointing is ``--activation-checkpointing``.
  Parameter or activation offload, and sharding strategies other than full sharding, are refused. How Accelerate
  would wrap, prefetch, load and save (auto-wrap policy, layer class, prefetch, state-dict type, original params,
  RAM-efficient loading, module-state sync, FSDP version) is ladderize's own: said in one note.
- ``mixed_precision`` bf16 or fp16 is ``--mixed-precision`` (``no``, Accelerate's default, leaves ladderize's);
  ``gradient_accumulation_steps`` is ``--grad-accum``; ``gradient_clipping`` is the stages' ``max_grad_norm``;
  ``dynamo_backend: INDUCTOR`` is ``--compile``.
- DeepSpeed and Megatron-LM configs are refused: adapt shards with FSDP2.

``accelerate launch --gradient_accumulation_steps N`` exports N only for DeepSpeed; adapt reads it from the launching
process's command line (``launch_accumulation``) and takes it as ``--grad-accum N``, as the config's would be.

A setting given on the command line and one the config maps onto it must agree, or the run is refused in one line.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from ...errors import LadderizeError
from .config import GivenSettings
from .settings_sections import OptimizerSettings, ParallelismSettings, TrainingSettings

# Accelerate's FSDP settings that ladderize decides itself (module docstring): the note names them
OWN_FSDP = ("FSDP_AUTO_WRAP_POLICY", "FSDP_TRANSFORMER_CLS_TO_WRAP", "FSDP_MIN_NUM_PARAMS", "FSDP_BACKWARD_PREFETCH",
            "FSDP_FORWARD_PREFETCH", "FSDP_STATE_DICT_TYPE", "FSDP_USE_ORIG_PARAMS", "FSDP_CPU_RAM_EFFICIENT_LOADING",
            "FSDP_SYNC_MODULE_STATES", "FSDP_VERSION", "FSDP_IGNORED_MODULES")
FULL_SHARD = {"1", "FULL_SHARD"}


def _on(env: Mapping[str, str], key: str) -> bool:
    return env.get(key, "").strip().lower() in {"true", "1", "yes"}


def _refuse(what: str, instead: str) -> LadderizeError:
    return LadderizeError(f"the Accelerate config asks for {what}; {instead}")


def launch_arguments(cmdline: list[str]) -> list[str] | None:
    """The arguments a command line gives ``accelerate launch`` (``accelerate launch ARGS``, ``accelerate-launch ARGS``
    or ``python -m accelerate.commands.launch ARGS``), or None for any other command."""
    for index, arg in enumerate(cmdline):
        name = Path(arg).name
        if arg == "accelerate.commands.launch" or name == "accelerate-launch":
            return cmdline[index + 1:]
        if name == "accelerate" and cmdline[index + 1:index + 2] == ["launch"]:
            return cmdline[index + 2:]
    return None


def launch_accumulation(pid: int | None = None) -> int | None:
    """``--gradient_accumulation_steps`` as given to the ``accelerate launch`` that started process ``pid``'s child
    (default: this process's parent, which is the launch itself for one process and for several), else None."""
    try:
        raw = Path(f"/proc/{os.getppid() if pid is None else pid}/cmdline").read_bytes()
    except OSError:  # no /proc, or the parent is gone
        return None
    args = launch_arguments([arg for arg in raw.decode(errors="replace").split("\0") if arg])
    if not args:
        return None
    from accelerate.commands.launch import launch_command_parser

    try:
        parsed, _ = launch_command_parser().parse_known_args(args)
    except SystemExit:  # not a command line Accelerate would have run
        return None
    return parsed.gradient_accumulation_steps


def from_accelerate(given: GivenSettings, env: Mapping[str, str] | None = None) -> tuple[GivenSettings, str | None]:
    """The settings the launching Accelerate config maps onto (``given``: those set on the command line, which must
    agree), and one note saying what was taken (``None`` outside ``accelerate launch``). Refusals raise
    ``LadderizeError`` before any work. Read from this process (``env`` None), the launch's own
    ``--gradient_accumulation_steps`` counts as the config's."""
    if env is None:
        env = os.environ
        if "ACCELERATE_MIXED_PRECISION" in env and "ACCELERATE_GRADIENT_ACCUMULATION_STEPS" not in env:
            steps = launch_accumulation()
            if steps is not None:
                env = {**env, "ACCELERATE_GRADIENT_ACCUMULATION_STEPS": str(steps)}
    if _on(env, "ACCELERATE_USE_DEEPSPEED"):
        raise _refuse("DeepSpeed", "ladderize adapt shards with FSDP2: use an FSDP or multi-GPU config, or torchrun")
    if _on(env, "ACCELERATE_USE_MEGATRON_LM"):
        raise _refuse("Megatron-LM", "ladderize adapt shards with FSDP2: use an FSDP or multi-GPU config, or torchrun")
    mapped = GivenSettings()
    taken: list[str] = []
    if _on(env, "ACCELERATE_USE_FSDP"):
        strategy = env.get("FSDP_SHARDING_STRATEGY", "FULL_SHARD").strip().upper()
        if strategy not in FULL_SHARD:
            raise _refuse(f"fsdp_sharding_strategy {strategy}",
                          "ladderize's sharded training shards fully (FULL_SHARD); for replicated training use --shard ddp "
                          "with a multi-GPU config")
        if env.get("FSDP_RESHARD_AFTER_FORWARD", "true").strip().lower() == "false":
            raise _refuse("fsdp_reshard_after_forward false",
                          "ladderize's sharded training reshards each layer after its forward (FULL_SHARD)")
        if _on(env, "FSDP_OFFLOAD_PARAMS"):
            raise _refuse("fsdp_offload_params", "ladderize's sharded training keeps its shards on the device; the plan "
                          "sizes the batch to the memory (--dry-run prices it), or add processes")
        if _on(env, "FSDP_ACTIVATION_CHECKPOINTING_OFFLOAD"):
            raise _refuse("fsdp_activation_checkpointing_offload",
                          "ladderize recomputes activations on the device (--activation-checkpointing), without offload")
        mapped = mapped.with_given(ParallelismSettings, shard="fsdp")
        taken.append("FSDP as --shard fsdp (FSDP2, full sharding)")
        if _on(env, "FSDP_ACTIVATION_CHECKPOINTING"):
            mapped = mapped.with_given(ParallelismSettings, activation_checkpointing=True)
            taken.append("activation checkpointing")
        own = [key.removeprefix("FSDP_").lower() for key in OWN_FSDP if key in env]
        if own:
            taken.append(f"ladderize's own wrapping, prefetch, loading and saving in place of fsdp's {', '.join(own)} "
                         "(each decoder layer one unit; each rank reads its rows; distributed checkpoint)")
    precision = env.get("ACCELERATE_MIXED_PRECISION", "no").strip().lower()
    if precision == "fp8":
        raise _refuse("mixed_precision fp8", "ladderize trains in bf16 or fp32 (--mixed-precision bf16 or no)")
    if precision in {"bf16", "fp16"}:
        mapped = mapped.with_given(ParallelismSettings, mixed_precision=precision)
        taken.append(f"mixed precision {precision}")
    numbers = (("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", TrainingSettings, "grad_accum", int, "gradient_accumulation_steps",
                {"", "1"}),
               ("ACCELERATE_GRADIENT_CLIPPING", OptimizerSettings, "max_grad_norm", float, "gradient_clipping",
                {"", "none", "false"}))
    for key, section, setting, kind, name, unset in numbers:
        text = env.get(key, "").strip().lower()
        if text in unset:
            continue
        try:
            mapped = mapped.with_given(section, **{setting: kind(text)})
        except ValueError:
            raise _refuse(f"{name} {text!r}", f"give a {'whole ' if kind is int else ''}number") from None
        taken.append(f"{name.replace('_', ' ')} {text}")
    backend = env.get("ACCELERATE_DYNAMO_BACKEND", "NO").strip().upper()
    if backend == "INDUCTOR":
        mapped = mapped.with_given(ParallelismSettings, compile=True)
        taken.append("dynamo_backend INDUCTOR as --compile (each decoder layer compiled)")
    elif backend not in {"", "NO"}:
        raise _refuse(f"dynamo_backend {backend}", "ladderize compiles its layers with inductor (--compile), or not at all")
    for key, value, asked in mapped.disagreements(given):
        raise LadderizeError(f"the Accelerate config sets {key} to {value!r}, the command line to {asked!r}; "
                             "give one of them")
    launched = "ACCELERATE_MIXED_PRECISION" in env or "ACCELERATE_USE_FSDP" in env
    if not launched:
        return mapped, None
    return mapped, "Accelerate config: " + ("; ".join(taken) if taken else "nothing to take (processes and devices only)")
