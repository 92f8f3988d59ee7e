"""The pipeline behind ``ladderize convert``: auto layer selection, the conversion, then optional head grouping."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Converted:
    """Where the converted checkpoint is, and the SPD head orders when head grouping ran."""

    path: Path
    head_orders: dict[int, list[int]] | None = None


def check_auto_options(ranges: Mapping[str, str | None], budgets: Mapping[str, float | None] | None,
                       sensitivity: str | None) -> None:
    """``--<mode>-budget`` and ``--sensitivity`` choose the layers of an ``auto`` layout only: given beside explicit
    ranges they would be ignored, so they are one line instead (no torch). ``ranges``/``budgets``: per mode name."""
    from ..errors import LadderizeError
    from ..model.layout import LayerMode

    for name, budget in (budgets or {}).items():
        spec = ranges.get(name)
        if budget is not None and (spec or "none") != "auto":
            raise LadderizeError(f"--{name}-budget chooses the layers of --{name} auto; --{name} {spec or 'none'} names them "
                                 f"itself (drop --{name}-budget, or use --{name} auto --sensitivity FILE)")
    if sensitivity is not None and "auto" not in ranges.values():
        flags = [f"--{mode.value} auto" for mode in LayerMode.converted_modes()]
        none = "neither is given" if len(flags) == 2 else "none is given"
        raise LadderizeError(f"--sensitivity is read by {' or '.join(flags)} only; {none}")


def convert_layout(
    src: str,
    out: Path | str,
    *,
    ranges: Mapping[str, str | None] | None = None,
    spd_tp: int | None = None,
    dtype: str | None = "auto",
    max_shard_bytes: int | None = None,
    force: bool = False,
    budgets: Mapping[str, float | None] | None = None,
    sensitivity: str | None = None,
    head_grouping: bool = False,
    device: str = "auto",
    progress: Callable[[int, int, str], None] | None = None,
) -> Converted:
    """Convert ``src`` to the layout ``ranges`` names (mode name to range spec, ``{"ladder": "15:30"}``; ``auto``
    picks a mode's layers from a sensitivity report within its ``budgets`` entry; the report's TP is the
    TP-dependent modes' TP unless ``spd_tp`` is given), then group SPD heads if asked.

    ``dtype`` is the output dtype (``auto`` keeps the source's); ``device`` is where head grouping computes.
    """
    from ..convert.convert_support import auto_ranges
    from ..model.layout import LayerMode, tp_degree_for
    from ..checkpoint.placement import check_device, check_dtype
    from .conversion import convert_checkpoint

    ranges, budgets = dict(ranges or {}), dict(budgets or {})
    check_auto_options(ranges, budgets, sensitivity)
    device = check_device(device)
    dtype = check_dtype(dtype) or "auto"
    if max_shard_bytes is not None:
        from ..checkpoint.tensor_files import check_shard_bytes

        check_shard_bytes(max_shard_bytes)
    chosen: dict[str, str] = {}
    report_tp = None
    for name, spec in ranges.items():
        chosen[name], tp = auto_ranges(spec or "none", budgets.get(name), sensitivity, LayerMode(name))
        report_tp = tp if tp is not None else report_tp
    spd_tp = tp_degree_for(chosen, spd_tp, default=report_tp, default_from="the sensitivity report")
    extra = {} if max_shard_bytes is None else {"max_shard_bytes": max_shard_bytes}
    path = convert_checkpoint(src, out, **chosen, spd_tp_size=spd_tp, dtype=dtype, force=force,
                              progress=progress, **extra)
    if not head_grouping:
        return Converted(Path(path))
    from ..convert.convert_support import head_group_checkpoint

    return Converted(Path(path), head_group_checkpoint(path, teacher=src, device=device))
