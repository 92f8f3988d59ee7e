"""Whether a TP degree can run a model of a given shape and layout (the shape type is ``checkpoint.shapes.ModelShape``)."""

from __future__ import annotations


from collections.abc import Callable

from ..errors import LadderizeError
from ..model.layout import Layout, LayoutError, check_tp_divides, format_layer_ranges
from ..checkpoint.shapes import ModelShape

DEFAULT_TP = 2  # bench's TP degree when none is given and the model's heads split in two


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


def default_tp(dims: ModelShape, layout_for: Callable[[int], Layout], preferred: int = DEFAULT_TP) -> tuple[int, str | None]:
    """The TP degree to run when none is given, and why it is not ``preferred`` (``None`` when it is).

    ``preferred`` where ``validate_tp`` accepts it, else the smallest degree above it that the model's heads, MLP width
    and SPD layers allow (a model converted for SPD at TP=N: N), else 1. ``layout_for(tp)``: the layout run at ``tp``
    (a synthetic model's SPD layers follow the degree)."""
    try:
        validate_tp(dims, layout_for(preferred), preferred)
        return preferred, None
    except (LadderizeError, LayoutError) as exc:
        reason = str(exc)
    for tp in range(preferred + 1, dims.num_heads + 1):
        try:
            validate_tp(dims, layout_for(tp), tp)
        except (LadderizeError, LayoutError):
            continue
        return tp, reason
    return 1, reason


__all__ = ["DEFAULT_TP", "default_tp", "validate_tp"]
