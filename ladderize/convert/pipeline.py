"""The pipeline behind ``ladderize convert``: auto layer selection, the conversion, then optional head grouping."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Converted:
    """Where the converted checkpoint is, and the SPD head orders when head grouping ran."""

    path: Path
    head_orders: dict[int, list[int]] | None = None


def check_auto_options(ladder: str | None, spd: str | None, ladder_budget: float | None, spd_budget: float | None,
                       sensitivity: str | None) -> None:
    """``--ladder-budget``/``--spd-budget`` and ``--sensitivity`` choose the layers of an ``auto`` layout only: given
    beside explicit ranges they would be ignored, so they are one line instead (no torch)."""
    from ..errors import LadderizeError

    for name, spec, budget in (("ladder", ladder, ladder_budget), ("spd", spd, spd_budget)):
        if budget is not None and (spec or "none") != "auto":
            raise LadderizeError(f"--{name}-budget chooses the layers of --{name} auto; --{name} {spec or 'none'} names them "
                                 f"itself (drop --{name}-budget, or use --{name} auto --sensitivity FILE)")
    if sensitivity is not None and "auto" not in (ladder, spd):
        raise LadderizeError("--sensitivity is read by --ladder auto or --spd auto only; neither is given")


def convert_layout(
    src: str,
    out: Path | str,
    *,
    ladder: str | None = "none",
    spd: str | None = "none",
    spd_tp: int | None = None,
    dtype: str | None = "auto",
    max_shard_bytes: int | None = None,
    force: bool = False,
    ladder_budget: float | None = None,
    spd_budget: float | None = None,
    sensitivity: str | None = None,
    head_grouping: bool = False,
    device: str = "auto",
    progress: Callable[[int, int, str], None] | None = None,
) -> Converted:
    """Convert ``src`` to the layout ``ladder``/``spd`` name (``auto`` picks layers from a sensitivity report
    within a budget; the report's TP is the SPD TP unless ``spd_tp`` is given), then group SPD heads if asked.

    ``dtype`` is the output dtype (``auto`` keeps the source's); ``device`` is where head grouping computes.
    """
    from ..adapt.convert_support import auto_ranges
    from ..model.layout import LayerMode, spd_tp_for
    from ..model.placement import check_device, check_dtype
    from .conversion import convert_checkpoint

    check_auto_options(ladder, spd, ladder_budget, spd_budget, sensitivity)
    device = check_device(device)
    dtype = check_dtype(dtype) or "auto"
    if max_shard_bytes is not None:
        from ..model.shards import check_shard_bytes

        check_shard_bytes(max_shard_bytes)
    ladder, _ = auto_ranges(ladder or "none", ladder_budget, sensitivity, LayerMode.LADDER)
    spd, report_tp = auto_ranges(spd or "none", spd_budget, sensitivity, LayerMode.SPD)
    spd_tp = spd_tp_for(spd, spd_tp, default=report_tp, default_from="the sensitivity report")
    extra = {} if max_shard_bytes is None else {"max_shard_bytes": max_shard_bytes}
    path = convert_checkpoint(src, out, ladder=ladder, spd=spd, spd_tp_size=spd_tp, dtype=dtype, force=force,
                              progress=progress, **extra)
    if not head_grouping:
        return Converted(Path(path))
    from ..adapt.convert_support import head_group_checkpoint

    return Converted(Path(path), head_group_checkpoint(path, teacher=src, device=device))
