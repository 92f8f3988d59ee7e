"""vLLM general plugin: registers ladderize's ``ladder_llama`` config and model with vLLM.

Installed by ``pip install ladderize[vllm]`` through the ``vllm.general_plugins`` entry point
(``ladderize = "ladderize.runtime.vllm.plugin:register"``). vLLM calls ``register()`` in every
process (front end, engine core, each TP worker) before it reads a model's config, so a converted
checkpoint (``model_type: ladder_llama``, ``architectures: ["LadderLlamaForCausalLM"]``) serves
without ``trust_remote_code``: the config class is registered with transformers' ``AutoConfig``
exactly as ``import ladderize`` does for transformers, and the architecture with vLLM's
``ModelRegistry`` by its import path (vLLM imports the model lazily, in the workers).
"""

from __future__ import annotations

import logging

from ladderize.errors import one_line
from ladderize.checkpoint.auto_classes import register_auto_classes
from ladderize.model.layout import Layout, format_layer_ranges

ARCHITECTURE = "LadderLlamaForCausalLM"
MODEL_PATH = "ladderize.runtime.vllm.model:VllmLadderLlamaForCausalLM"  # the class; the architecture name stays


class SPDDegreeError(RuntimeError):
    """An SPD checkpoint served at a TP degree other than the one it was converted for.

    A RuntimeError, not a ValueError: vLLM's pydantic config would wrap a ValueError in a long report.
    """


def check_parallel(layout: Layout, tp: int, pp: int) -> None:
    """Refuse what the ladderize model cannot serve exactly, with one readable line."""
    spd = layout.tp_dependent_layers
    if spd and tp != layout.spd_tp_size:
        raise SPDDegreeError(
            f"ladderize: SPD layers {format_layer_ranges(spd)} were converted for TP={layout.spd_tp_size}; at "
            f"tensor_parallel_size={tp} each rank would hold a different head group, which is a different model. "
            f"Serve with tensor_parallel_size={layout.spd_tp_size}"
        )
    if pp != 1:
        raise SPDDegreeError(f"ladderize: pipeline parallelism is not supported by the ladder/SPD layer loop (got {pp})")


class LadderConfigCheck:
    """vLLM's per-architecture config hook: runs in the front-end process, before any engine starts."""

    @staticmethod
    def verify_and_update_config(vllm_config) -> None:
        parallel = vllm_config.parallel_config
        check_parallel(Layout.from_config(vllm_config.model_config.hf_config), parallel.tensor_parallel_size,
                       parallel.pipeline_parallel_size)

    @staticmethod
    def verify_and_update_model_config(model_config) -> None:
        return None


def register() -> None:
    """Register the config with transformers and the model with vLLM (idempotent, as vLLM requires).

    Never raises: vLLM calls every installed plugin in every process, so an exception here would stop
    vLLM for every model in the environment. A failure is one logged warning; only ladder_llama
    checkpoints then fail to serve (vLLM names their unknown architecture).
    """
    try:
        _register()
    except Exception as exc:  # noqa: BLE001 (any failure: vLLM must keep serving other models)
        logging.getLogger(__name__).warning(
            "ladderize: vLLM plugin not registered, ladder_llama checkpoints will not serve (%s: %s)",
            type(exc).__name__, one_line(exc),
        )


def _register() -> None:
    from vllm import ModelRegistry
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP

    register_auto_classes()
    if ARCHITECTURE not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(ARCHITECTURE, MODEL_PATH)
    MODELS_CONFIG_MAP.setdefault(ARCHITECTURE, LadderConfigCheck)  # the TP/SPD refusal, before workers start
