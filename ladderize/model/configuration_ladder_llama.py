"""Configuration of the Ladder/SPD Llama: a LlamaConfig plus the per-layer layout.

Saving one (``save_pretrained``, which a model's ``save_pretrained``, ``push_to_hub``,
``Trainer.save_model`` and peft's ``merge_and_unload().save_pretrained`` all call) writes the code
files beside ``config.json`` and names them in ``auto_map``, so the folder loads with
``trust_remote_code=True`` where ladderize is not installed.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import transformers

TRANSFORMERS_REQUIREMENT = "transformers>=5.4,<6"  # 5.4: the first whose configs are dataclasses (@strict below)
if tuple(int(part) for part in transformers.__version__.split(".")[:2]) < (5, 4):  # else @strict fails obscurely
    raise ImportError(
        f"ladder_llama checkpoints need {TRANSFORMERS_REQUIREMENT} (found transformers {transformers.__version__}): "
        f"pip install '{TRANSFORMERS_REQUIREMENT}'"
    )

from huggingface_hub.dataclasses import strict  # noqa: E402
from transformers import LlamaConfig  # noqa: E402

from .layout import Layout  # noqa: E402

# The self-contained code a checkpoint carries (need only torch and transformers), and the auto_map naming it.
CODE_FILES = ("layout.py", "configuration_ladder_llama.py", "block.py", "residual.py", "modeling_ladder_llama.py")
AUTO_MAP = {
    "AutoConfig": "configuration_ladder_llama.LadderLlamaConfig",
    "AutoModel": "modeling_ladder_llama.LadderLlamaModel",
    "AutoModelForCausalLM": "modeling_ladder_llama.LadderLlamaForCausalLM",
}


def write_code_files(directory: str | Path) -> None:
    """Copy the code files (``CODE_FILES``) beside a checkpoint in ``directory``.

    A file missing beside this one is skipped: only under ``trust_remote_code`` after loading the
    config alone, where transformers' own ``custom_object_save`` copies what it loaded.
    """
    here = Path(__file__).resolve().parent
    for name in CODE_FILES:
        if (here / name).is_file():
            shutil.copyfile(here / name, Path(directory) / name)


@strict
class LadderLlamaConfig(LlamaConfig):
    r"""Llama configuration with a per-layer mode (``dense``, ``ladder`` or ``spd``).

    Args:
        layer_modes: one mode per decoder layer; ``None`` means all dense.
        spd_tp_size: the tensor-parallel degree SPD layers were converted for. SPD's
            function depends on it: rank r owns head group r and MLP shard r.
        spd_head_order: optional per-layer permutation of KV heads used to form SPD's
            head groups (head grouping); ``None`` keeps the natural order.
        attention_out_bias: bias on ``o_proj``; ``None`` follows ``attention_bias``
            (Qwen2 has q/k/v biases but none on ``o_proj``).
    """

    model_type = "ladder_llama"

    layer_modes: list[str] | None = None
    spd_tp_size: int = 1
    spd_head_order: list[list[int] | None] | None = None
    attention_out_bias: bool | None = None

    def __post_init__(self, **kwargs):
        super().__post_init__(**kwargs)
        if self.layer_modes is None:
            self.layer_modes = ["dense"] * self.num_hidden_layers
        if self.attention_out_bias is None:
            self.attention_out_bias = self.attention_bias
        self.layout.validate(self.num_attention_heads, self.num_key_value_heads, self.intermediate_size)

    def save_pretrained(self, save_directory, push_to_hub: bool = False, **kwargs) -> None:
        """``PretrainedConfig.save_pretrained``, plus the code files and the ``auto_map`` that names them."""
        Path(save_directory).mkdir(parents=True, exist_ok=True)
        self.architectures = ["LadderLlamaForCausalLM"]
        self.auto_map = dict(AUTO_MAP)
        write_code_files(save_directory)
        super().save_pretrained(save_directory, push_to_hub=push_to_hub, **kwargs)

    @property
    def layout(self) -> Layout:
        """The per-layer modes as a ``Layout``."""
        return Layout.from_config(self)
