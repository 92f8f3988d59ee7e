"""vLLM general plugin: registers ladderize's ``ladder_llama`` config and model with vLLM.

Installed by ``pip install ladderize[vllm]`` through the ``vllm.general_plugins`` entry point
(``ladderize = "ladderize.serving.vllm_plugin:register"``). vLLM calls ``register()`` in every
process (front end, engine core, each TP worker) before it reads a model's config, so a converted
checkpoint (``model_type: ladder_llama``, ``architectures: ["LadderLlamaForCausalLM"]``) serves
without ``trust_remote_code``: the config class is registered with transformers' ``AutoConfig``
exactly as ``import ladderize`` does for transformers, and the architecture with vLLM's
``ModelRegistry`` by its import path (vLLM imports the model lazily, in the workers).
"""

from __future__ import annotations

ARCHITECTURE = "LadderLlamaForCausalLM"
MODEL_PATH = "ladderize.serving.vllm_model:LadderLlamaForCausalLM"


def register() -> None:
    """Register the config with transformers and the model with vLLM (idempotent, as vLLM requires)."""
    import ladderize
    from vllm import ModelRegistry

    ladderize.register_auto_classes()
    if ARCHITECTURE not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(ARCHITECTURE, MODEL_PATH)
