"""The Ladder/SPD Llama model: layout, configuration and modeling (self-contained, travels with checkpoints),
and the ground floor every package builds on: ``placement`` (the device and dtype rule).

Names load lazily (PEP 562), so ``ladderize.checkpoint.placement`` or ``.layout`` import neither torch nor
transformers.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "LadderLlamaConfig": "configuration_ladder_llama",
    "LadderLlamaForCausalLM": "modeling_ladder_llama",
    "LadderLlamaModel": "modeling_ladder_llama",
    "LayerMode": "layout",
    "Layout": "layout",
    "LayoutError": "layout",
    "format_layer_ranges": "layout",
    "parse_layer_ranges": "layout",
}


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = sorted(_EXPORTS)
