"""The portable Ladder/SPD Llama model: what travels inside a converted checkpoint (``auto_map`` remote code).

``layout`` (the mode table and its program), ``residual`` (its one interpreter), ``block`` (the math),
``configuration_ladder_llama`` and ``modeling_ladder_llama`` (the HF classes); ``CODE_FILES`` lists them.
They import nothing of ladderize outside this package (``tests/test_import_graph.py`` checks it), so a
checkpoint loads where ladderize is absent. Reading, writing and placing checkpoints is ``ladderize.checkpoint``.

Names load lazily (PEP 562), so ``ladderize.model.layout`` imports neither torch nor transformers.
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
