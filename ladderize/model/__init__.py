"""The Ladder/SPD Llama model: layout, configuration and modeling (self-contained, travels with checkpoints)."""

from .configuration_ladder_llama import LadderLlamaConfig
from .layout import LayerMode, Layout, LayoutError, format_layer_ranges, parse_layer_ranges
from .modeling_ladder_llama import LadderLlamaForCausalLM, LadderLlamaModel

__all__ = [
    "LadderLlamaConfig",
    "LadderLlamaForCausalLM",
    "LadderLlamaModel",
    "LayerMode",
    "Layout",
    "LayoutError",
    "format_layer_ranges",
    "parse_layer_ranges",
]
