"""Accuracy against speed-up, one point per layout, with the Pareto front marked (matplotlib, PNG)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .table import LayoutRun, Metric, Report


def pareto_front(points: list[tuple[float, float]], higher_is_better: bool = True) -> list[int]:
    """Indices of the points no other point beats in both speed-up (higher) and quality.

    Each point is ``(speed_up, quality)``; quality is maximized when ``higher_is_better``.
    """
    sign = 1.0 if higher_is_better else -1.0
    front = []
    for i, (speed, quality) in enumerate(points):
        q = sign * quality
        dominated = any(
            s >= speed and sign * other >= q and (s > speed or sign * other > q)
            for j, (s, other) in enumerate(points)
            if j != i
        )
        if not dominated:
            front.append(i)
    return sorted(front, key=lambda i: points[i][0])


def choose_axes(report: "Report") -> tuple["Metric | None", tuple[int, int] | None]:
    """The quality metric (accuracy first, else perplexity) and the (TP, batch) covering the most layouts."""
    def coverage(metric, config) -> int:
        return sum(1 for r in report.runs if metric in r.metrics and config in r.speedups)

    metric = None
    for candidates in ([m for m in report.metrics if m.higher_is_better], [m for m in report.metrics if not m.higher_is_better]):
        if candidates:
            metric = max(candidates, key=lambda m: sum(1 for r in report.runs if m in r.metrics))
            break
    config = None
    if metric is not None and report.configs:
        config = max(report.configs, key=lambda c: (coverage(metric, c), c[0], -c[1]))
    return metric, config


def plot_pareto(report: "Report", path: Path) -> dict[str, Any]:
    """Write the plot to ``path``; return what was plotted (metric, config, points, front)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    metric, config = choose_axes(report)
    runs: list[LayoutRun] = (
        [r for r in report.runs if metric in r.metrics and config in r.speedups] if metric and config else []
    )
    fig, ax = plt.subplots(figsize=(7.5, 5), dpi=120)
    info: dict[str, Any] = {"points": [], "front": [], "config": config, "y_label": metric.label if metric else None}
    if not runs:
        ax.text(0.5, 0.5, "no layout has both an accuracy and a speed-up measurement", ha="center", va="center", wrap=True)
        ax.set_axis_off()
    else:
        points = [(r.speedups[config], r.metrics[metric]) for r in runs]
        front = pareto_front(points, metric.higher_is_better)
        on_front = set(front)
        others = [i for i in range(len(points)) if i not in on_front]
        ax.scatter([points[i][0] for i in others], [points[i][1] for i in others], s=45, color="tab:gray", label="layout", zorder=3)
        ax.scatter([points[i][0] for i in front], [points[i][1] for i in front], s=70, color="tab:red", label="Pareto front", zorder=4)
        ax.plot([points[i][0] for i in front], [points[i][1] for i in front], color="tab:red", linestyle="--", linewidth=1.2, zorder=2)
        for run, (x, y) in zip(runs, points):
            ax.annotate(run.label, (x, y), textcoords="offset points", xytext=(6, 6), fontsize=8)
        ax.axvline(1.0, color="black", linewidth=0.6, alpha=0.4)
        ax.margins(x=0.25, y=0.1)  # room for the labels
        ax.set_xlabel(f"speed-up against dense (TP={config[0]}, batch {config[1]})")
        ylabel = metric.label + ("" if metric.higher_is_better else " (lower is better)")
        ax.set_ylabel(ylabel)
        if not metric.higher_is_better:
            ax.invert_yaxis()  # better is up either way
        ax.grid(True, alpha=0.3)
        ax.legend(loc="best", fontsize=8)
        info["points"] = [{"layout": r.label, "speedup": x, "quality": y} for r, (x, y) in zip(runs, points)]
        info["front"] = [runs[i].label for i in front]
    ax.set_title("accuracy vs speed-up")
    fig.tight_layout()
    tmp = path.with_name(f".{path.stem}.tmp.png")
    fig.savefig(tmp, format="png")
    plt.close(fig)
    tmp.replace(path)
    return info
