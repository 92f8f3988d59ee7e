"""The shape numbers of a checkpoint's config, and whether a TP degree can run it."""

from __future__ import annotations

from typing import Any

from ..errors import LadderizeError
from ..model.layout import LayerMode, Layout, check_tp_divides, format_layer_ranges
from ..model.shapes import ModelShape


class ModelDims(ModelShape):
    """The one shape type (``model.shapes.ModelShape``) with the runtime's positional constructor.

    ``ModelDims.from_config(config)`` is ``ModelShape.from_config``; ``num_layers``/``num_heads``/
    ``num_kv_heads`` and ``param_count()`` are the shape's own.
    """

    def __init__(self, hidden_size: int, num_layers: int, num_heads: int, num_kv_heads: int, head_dim: int,
                 intermediate_size: int, vocab_size: int, rms_norm_eps: float, hidden_act: str, attention_bias: bool,
                 attention_out_bias: bool, mlp_bias: bool, tie_word_embeddings: bool) -> None:
        super().__init__(
            name="", hidden_size=hidden_size, intermediate_size=intermediate_size, num_hidden_layers=num_layers,
            num_attention_heads=num_heads, num_key_value_heads=num_kv_heads, head_dim=head_dim, vocab_size=vocab_size,
            rms_norm_eps=rms_norm_eps, hidden_act=hidden_act, attention_bias=attention_bias,
            attention_out_bias=attention_out_bias, mlp_bias=mlp_bias, tie_word_embeddings=tie_word_embeddings,
        )

    @classmethod
    def from_config(cls, config: Any, name: str = "") -> ModelShape:
        return ModelShape.from_config(config, name)


def validate_tp(dims: ModelDims, layout: Layout, tp: int, allow_spd_mismatch: bool = False) -> None:
    """Check that ``tp`` ranks can run this model; raise ``LayoutError``/``LadderizeError`` with one line.

    SPD layers are a different model at another TP degree: the error names the degree they need.
    """
    if tp < 1:
        raise LadderizeError(f"--tp must be at least 1, got {tp}")
    spd_layers = layout.layers(LayerMode.SPD)
    # Dense and ladder layers replicate KV heads when tp exceeds their count; SPD's head groups cannot.
    check_tp_divides(tp, dims.num_heads, dims.num_kv_heads, dims.intermediate_size, replicate_kv=not spd_layers)
    if spd_layers and tp != layout.spd_tp_size and not allow_spd_mismatch:
        raise LadderizeError(
            f"the model has SPD layers converted for TP={layout.spd_tp_size}: it needs --tp {layout.spd_tp_size}, "
            f"not --tp {tp} (layers {format_layer_ranges(spd_layers)} would compute other head groups, a different "
            "model), or --allow-spd-mismatch to run SPD semantics at this degree anyway"
        )


__all__ = ["ModelDims", "ModelShape", "validate_tp"]
