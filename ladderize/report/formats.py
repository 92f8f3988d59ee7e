"""The report table as text: formatted cells, Markdown, CSV, and the notes under the table."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

from ..records import SpeedupSpread
from .collect import LayoutRun
from .table import Report

NOISE_NOTE = ("~: the rounds' speed-ups straddle 1.00x (some rounds faster than dense, some slower): noise, "
              "not a gain or a loss")


def table_rows(report: Report) -> list[list[str]]:
    """The table's cells as displayed, in ``report.columns()`` order."""
    out = []
    for run in report.runs:
        row = [run.label, _fmt_converted(run.layers_converted, run.num_layers), _fmt_allreduces(run)]
        for metric in report.metrics:
            row += [_fmt_value(run.metrics.get(metric)), _fmt_delta(report.delta(run, metric), run.is_dense)]
        for config in report.configs:
            row.append(format_speedup(run.decode_speedup.get(config)))
        if report.predicted is not None:
            row += [format_speedup(_single(report.predicted.of(run, config))) for config in report.predicted.configs()]
        out.append(row)
    return out


def markdown(report: Report) -> str:
    cols = report.columns()
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join(" --- " if i == 0 else " ---: " for i in range(len(cols))) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(report)]
    return "\n".join(lines) + "\n"


def csv_text(report: Report) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(report.csv_columns())
    for row in report.numeric_rows():
        writer.writerow(["" if v is None else (f"{v:.6g}" if isinstance(v, float) else v) for v in row])
    return buffer.getvalue()


def notes(report: Report, plot_info: dict[str, Any]) -> str:
    """The Markdown notes under the table: what dense is, where the speed-ups came from, the plot's front."""
    lines = []
    if report.dense is None:
        lines.append("- No dense run was given, so differences against dense are left blank.")
    else:
        lines.append(f"- Differences (Δ) are against the dense layout ({report.dense.checkpoint or report.dense.layout}).")
    if report.configs:
        lines.append(
            "- Decode speed-up: the dense schedule's decode time per token over the layout's own schedule's, on the "
            "same weights, per tensor-parallel degree (TP) and batch (b), from `ladderize bench`: the median over the "
            "bench's rounds of each round's speed-up (each round runs every schedule once); in brackets the lowest and "
            "highest round, and `~` before a speed-up whose rounds straddle 1.00x (noise, not a gain or a loss). "
            "The plot's error bars are ± one standard error (of the rounds' speed-ups; of the metric, from lm-eval), "
            "not the bracketed range; a `~` before a point's name marks the same noise."
        )
    else:
        lines.append("- No bench run was given, so there are no speed-up columns.")
    shared = [r for r in report.runs if r.speed_shared_from]
    if shared:
        lines.append(
            "- Speed depends on the layout, not the weights: "
            + "; ".join(f"{r.label} uses the bench of {r.speed_shared_from}" for r in shared)
            + "."
        )
    if report.predicted is not None:
        lines.append(f"- Predicted decode speed-up: what `ladderize predict` gives for the same layout, TP degree, batch and "
                     f"lengths on a GPU node ({report.predicted.label}); a model, not a measurement.")
    for note in dict.fromkeys(n for r in report.runs for n in r.load_notes):
        lines.append(f"- Load: {note}.")
    lines.append("- All-reduces per token: per forward pass under TP; ladder layers' all-reduces overlap compute.")
    if plot_info.get("points"):
        lines.append(
            f"- Plot: {plot_info['y_label']} against decode speed-up at TP{plot_info['config'][0]} "
            f"batch {plot_info['config'][1]}; Pareto front: {', '.join(plot_info['front'])}."
        )
    lines.append("- Sources: " + ", ".join(sorted({Path(s).name for r in report.runs for s in r.sources})))
    return "\n".join(lines) + "\n"


def _fmt_converted(count: int | None, total: int | None) -> str:
    if count is None:
        return "–"
    return f"{count}/{total}" if total else str(count)


def _fmt_allreduces(run: LayoutRun) -> str:
    if run.allreduces_per_decode_step is None:
        return "–"
    if run.overlappable_allreduces_per_decode_step:
        return f"{run.allreduces_per_decode_step} ({run.overlappable_allreduces_per_decode_step} overlapped)"
    return str(run.allreduces_per_decode_step)


def format_speedup(speedup: SpeedupSpread | None) -> str:
    """How every speed-up is shown (bench's table, the report, the demo): ``1.13x``, with the min–max over the bench
    rounds when they differ, ``1.13x (1.08–1.17)``, and marked ``~`` when that range straddles 1.00x (noise,
    ``NOISE_NOTE``): ``~0.83x (0.74–1.81)``."""
    if speedup is None:
        return "–"
    text, low, high = f"{speedup.median:.2f}x", f"{speedup.min:.2f}", f"{speedup.max:.2f}"
    if low != high or speedup.within_noise():
        text += f" ({low}–{high})"
    return "~" + text if speedup.within_noise() else text


def _single(value: float | None) -> SpeedupSpread | None:
    return None if value is None else SpeedupSpread.single(value)


def _fmt_value(value: float | None) -> str:
    if value is None:
        return "–"
    if abs(value) >= 100:
        return f"{value:,.1f}"
    return f"{value:.4f}" if abs(value) < 1 else f"{value:.2f}"


def _fmt_delta(delta: float | None, is_dense: bool) -> str:
    if delta is None:
        return "–"
    if is_dense:
        return "0"
    if abs(delta) >= 100:
        return f"{delta:+,.1f}"
    return f"{delta:+.4f}" if abs(delta) < 1 else f"{delta:+.2f}"


__all__ = ["NOISE_NOTE", "csv_text", "format_speedup", "markdown", "notes", "table_rows"]
