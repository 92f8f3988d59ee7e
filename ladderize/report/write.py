"""Writing a report folder: the table (Markdown, CSV) and the plot, side by side.

The one place that joins ``formats.py`` (the table as text) and ``plot.py`` (the figure), so
neither imports the other at run time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..checkpoint.atomic import write_file_atomic
from .plot import check_metric_name, choose_metric, plot_pareto
from .formats import csv_text, markdown, notes
from .table import Predicted, build_report


def write_report(paths: list[Path | str], out: Path | str, title: str = "ladderize: accuracy vs speed",
                 predicted: Predicted | None = None, metric: str | None = None, task: str | None = None) -> dict[str, Any]:
    """Write ``report.md``, ``report.csv`` and ``accuracy_vs_speedup.png`` into ``out``; return paths and the report.
    ``predicted``: speed-ups from ``ladderize predict`` shown beside the measured ones (the demo's GPU-node figure).
    ``metric`` and ``task``: the plot's quality axis (``plot.choose_metric``), refused in one line before ``out`` is
    made when the runs lack them."""
    check_metric_name(metric)
    report = build_report(paths, predicted)
    plot_metric = choose_metric(report, metric, task)
    out = Path(out).expanduser().absolute()
    out.mkdir(parents=True, exist_ok=True)
    png = out / "accuracy_vs_speedup.png"
    plot_info = plot_pareto(report, png, plot_metric)
    text = f"# {title}\n\n" + markdown(report) + "\n" + notes(report, plot_info)
    md_path, csv_path = out / "report.md", out / "report.csv"
    write_file_atomic(md_path, text)
    write_file_atomic(csv_path, csv_text(report))
    return {"markdown": md_path, "csv": csv_path, "png": png, "report": report, "plot": plot_info}


__all__ = ["write_report"]
