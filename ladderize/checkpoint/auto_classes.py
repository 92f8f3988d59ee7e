"""Registration of ``ladder_llama`` with transformers' ``AutoConfig``, ``AutoModel`` and ``AutoModelForCausalLM``
(idempotent).

``import ladderize`` calls it at once when transformers' auto classes are loaded, else right after they are
first imported (the root's import hook); vLLM's plugin (``runtime/vllm/plugin.register``) calls it too.
Importing this module imports neither torch nor transformers.
"""

from __future__ import annotations

_registered = False


def is_registered() -> bool:
    return _registered


def register_auto_classes() -> None:
    """Register ``ladder_llama`` with ``AutoConfig``, ``AutoModel`` and ``AutoModelForCausalLM`` (idempotent), and
    the writer of the card and provenance that the model's saves put beside the weights."""
    global _registered
    if _registered:
        return
    _registered = True
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    from ..model.configuration_ladder_llama import LadderLlamaConfig
    from ..model.modeling_ladder_llama import LadderLlamaForCausalLM, LadderLlamaModel, LadderLlamaPreTrainedModel
    from .io import write_companion_files

    # a save through the model writes ladderize's card and provenance as the checkpoint writer does
    LadderLlamaPreTrainedModel.companion_writer = staticmethod(write_companion_files)
    AutoConfig.register(LadderLlamaConfig.model_type, LadderLlamaConfig, exist_ok=True)
    AutoModel.register(LadderLlamaConfig, LadderLlamaModel, exist_ok=True)
    AutoModelForCausalLM.register(LadderLlamaConfig, LadderLlamaForCausalLM, exist_ok=True)


__all__ = ["is_registered", "register_auto_classes"]
