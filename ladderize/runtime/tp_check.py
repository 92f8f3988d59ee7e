"""Whether a TP degree can run a model of a given shape and layout (the shape type is ``checkpoint.shapes.ModelShape``)."""

from __future__ import annotations


from ..errors import LadderizeError
from ..model.layout import Layout, check_tp_divides, format_layer_ranges
from ..checkpoint.shapes import ModelShape


def validate_tp(dims: ModelShape, layout: Layout, tp: int, allow_spd_mismatch: bool = False) -> None:
    """Check that ``tp`` ranks can run this model; raise ``LayoutError``/``LadderizeError`` with one line.

    SPD layers are a different model at another TP degree: the error names the degree they need.
    """
    if tp < 1:
        raise LadderizeError(f"--tp must be at least 1, got {tp}")
    # Dense and ladder layers replicate KV heads when tp exceeds their count; SPD's head groups cannot.
    check_tp_divides(tp, dims.num_heads, dims.num_kv_heads, dims.intermediate_size, replicate_kv=not layout.head_split_layers)
    spd_layers = layout.tp_dependent_layers  # a different model at another TP degree
    if spd_layers and tp != layout.spd_tp_size and not allow_spd_mismatch:
        raise LadderizeError(
            f"the model has SPD layers converted for TP={layout.spd_tp_size}: it needs --tp {layout.spd_tp_size}, "
            f"not --tp {tp} (layers {format_layer_ranges(spd_layers)} would compute other head groups, a different "
            "model), or --allow-spd-mismatch to run SPD semantics at this degree anyway"
        )


__all__ = ["validate_tp"]
