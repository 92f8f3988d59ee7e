"""Accuracy against speed-up, one point per layout, with the Pareto front marked (matplotlib, PNG)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .collect import LayoutRun, Metric
    from .table import Report


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


def check_metric_name(metric: str | None) -> None:
    """Refuse, in one line and before any record is read, a ``--metric`` that is no metric the report reads."""
    from ..errors import LadderizeError
    from .collect import ACCURACY_METRICS, PERPLEXITY_METRICS

    known = list(ACCURACY_METRICS) + list(PERPLEXITY_METRICS)
    if metric is not None and metric not in known:
        raise LadderizeError(f"--metric {metric!r} is not a metric report reads; choose from: {', '.join(known)}")


def choose_metric(report: "Report", metric: str | None = None, task: str | None = None) -> "Metric | None":
    """The plot's quality metric: among the report's metrics of ``task`` named ``metric`` (either or both may be
    None: any), an accuracy metric first, else a perplexity one, the one most layouts have. An unknown task, or a
    metric the task lacks, is one line listing the choices."""
    from ..errors import LadderizeError

    tasks = list(dict.fromkeys(m.task for m in report.metrics))
    if task is not None and task not in tasks:
        raise LadderizeError(f"--task {task!r} is in none of the runs; choose from: {', '.join(tasks) or '(no eval run given)'}")
    pool = [m for m in report.metrics if (task is None or m.task == task) and (metric is None or m.name == metric)]
    if metric is not None and not pool:
        names = list(dict.fromkeys(m.name for m in report.metrics if task is None or m.task == task))
        where = f"task {task!r}" if task is not None else "the runs"
        raise LadderizeError(f"--metric {metric!r} is not in {where}; choose from: {', '.join(names) or '(no eval run given)'}")
    for candidates in ([m for m in pool if m.higher_is_better], [m for m in pool if not m.higher_is_better]):
        if candidates:
            return max(candidates, key=lambda m: sum(1 for r in report.runs if m in r.metrics))
    return None


def choose_axes(report: "Report", metric: "Metric | None" = None) -> tuple["Metric | None", tuple[int, int] | None]:
    """The quality metric (``metric``, else ``choose_metric``'s) and the (TP, batch) covering the most layouts."""
    def coverage(config) -> int:
        return sum(1 for r in report.runs if metric in r.metrics and config in r.decode_speedup)

    metric = metric or choose_metric(report)
    config = None
    if metric is not None and report.configs:
        config = max(report.configs, key=lambda c: (coverage(c), c[0], -c[1]))
    return metric, config


def short_names(runs: list["LayoutRun"]) -> dict[str, str]:
    """Short point labels: the layout's kinds (``ladder``, ``spd@tp3``, ``ladder+spd@tp3``), numbered when
    several distinct layouts share them, and ``, adapted`` for adapted checkpoints. Keyed by the run's label."""
    layouts: list[str] = []
    for run in runs:
        if run.layout not in layouts:
            layouts.append(run.layout)
    base = {layout: "+".join(part.split(" ")[0] for part in layout.split(" + ")) for layout in layouts}
    short: dict[str, str] = {}
    for layout in layouts:
        same = [other for other in layouts if base[other] == base[layout]]
        short[layout] = base[layout] if len(same) == 1 else f"{base[layout]} #{same.index(layout) + 1}"
    return {run.label: short[run.layout] + (", adapted" if run.adapted else "") for run in runs}


def model_name(report: "Report") -> str:
    """The model's name for the title: the dense checkpoint's folder, else any checkpoint's."""
    runs = ([report.dense] if report.dense is not None else []) + list(report.runs)
    for run in runs:
        if run.checkpoint:
            return Path(run.checkpoint).name
    return "model"


def spans_a_decade(values: list[float]) -> bool:
    positive = [v for v in values if v > 0]
    return len(positive) == len(values) and bool(positive) and max(positive) / min(positive) >= 10


CIRCLE_SIZE, TRIANGLE_SIZE = 95.0, 45.0  # marker areas (points²): an adapted triangle (white-edged) shows inside its twin's circle
RING_WIDTH = 1.8  # the Pareto front's red ring around a marker (points)


def plot_pareto(report: "Report", path: Path, metric: "Metric | None" = None) -> dict[str, Any]:
    """Write the plot to ``path``; return what was plotted.

    One panel per benched (TP, batch) that has layouts with both the quality ``metric`` (default:
    ``choose_metric``'s) and a speed-up; points carry short names, placed where they cover no point
    and no other name (``_place_labels``), ``~`` before the name of a point whose speed-up is noise,
    and a legend below the panels gives each short name's layer ranges. An adapted checkpoint is a
    triangle drawn above the circles, smaller, so that it shows inside a zero-shot circle at the same
    place. Error bars show the metric's standard error (lm-eval) and the speed-up's over the bench
    rounds, where the data has them; the y axis is logarithmic when the values span a decade. The
    returned ``config``, ``points`` and ``front`` are those of the (TP, batch) covering the most
    layouts (``choose_axes``); ``panels`` has every panel, with each label's box and each marker's
    centre in display pixels.
    """
    import math

    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    metric, main_config = choose_axes(report, metric)
    configs = [c for c in report.configs if metric is not None and any(metric in r.metrics and c in r.decode_speedup for r in report.runs)]
    info: dict[str, Any] = {"points": [], "front": [], "config": main_config, "y_label": metric.label if metric else None,
                            "panels": [], "log_y": False, "short_names": {}, "title": None}
    if not configs:
        fig, ax = plt.subplots(figsize=(7.5, 5), dpi=120)
        ax.text(0.5, 0.5, "no layout has both an accuracy and a speed-up measurement", ha="center", va="center", wrap=True)
        ax.set_axis_off()
        ax.set_title("accuracy vs speed-up")
        _save(fig, path)
        return info

    runs_all = [r for r in report.runs if metric in r.metrics and any(c in r.decode_speedup for c in configs)]
    names = short_names(runs_all)
    layouts = list(dict.fromkeys(r.layout for r in runs_all))
    colors = {layout: plt.get_cmap("tab10")(i % 10) for i, layout in enumerate(layouts)}
    values = [r.metrics[metric] for r in runs_all]
    log_y = spans_a_decade(values)
    columns = min(3, len(configs))
    rows = math.ceil(len(configs) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(5.0 * columns + 0.6, 4.2 * rows + 0.4 + 0.28 * len(layouts)),
                             dpi=120, squeeze=False, sharey=True)
    for ax in axes.flat[len(configs):]:
        ax.set_axis_off()
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    panels = []
    for ax, config in zip(axes.flat, configs):
        runs = [r for r in runs_all if config in r.decode_speedup]
        points = [(r.decode_speedup[config].median, r.metrics[metric]) for r in runs]
        front = pareto_front(points, metric.higher_is_better)
        for run, (x, y) in zip(runs, points):
            xerr = run.decode_speedup[config].stderr
            yerr = run.metric_stderr.get(metric)
            if xerr is not None or yerr is not None:
                ax.errorbar([x], [y], xerr=[xerr] if xerr is not None else None, yerr=[yerr] if yerr is not None else None,
                            fmt="none", ecolor=colors[run.layout], elinewidth=1, capsize=3, alpha=0.7, zorder=2)
            edge = "tab:red" if runs.index(run) in front else "white" if run.adapted else "none"  # white: seen on its twin
            ax.scatter([x], [y], s=TRIANGLE_SIZE if run.adapted else CIRCLE_SIZE, color=colors[run.layout],
                       marker="^" if run.adapted else "o", edgecolors=edge, linewidths=RING_WIDTH if edge == "tab:red" else 0.8,
                       zorder=5 if run.adapted else 4)
        ax.plot([points[i][0] for i in front], [points[i][1] for i in front], color="tab:red", linestyle="--",
                linewidth=1.1, zorder=3)
        xerrs = [run.decode_speedup[config].stderr or 0.0 for run in runs]
        xs = [p[0] for p in points]
        low = min([x - e for x, e in zip(xs, xerrs)] + [1.0])  # the error bars stay inside the panel
        high = max([x + e for x, e in zip(xs, xerrs)] + [1.0])
        pad = max(0.02, 0.12 * (high - low))
        ax.set_xlim(low - pad, high + pad)
        ax.axvline(1.0, color="black", linewidth=0.6, alpha=0.4)
        if log_y:
            ax.set_yscale("log")
            plain = FuncFormatter(lambda v, _pos: f"{v:,.0f}" if v >= 10 else f"{v:g}")
            # labels at 1, 2 and 5 per decade only: a label on every minor tick overlapped its neighbours
            ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            ax.yaxis.set_major_formatter(plain)
            ax.yaxis.set_minor_formatter(NullFormatter())
        panels.append((ax, runs, points, config))
        ax.set_title(f"TP={config[0]}, batch {config[1]}", fontsize=10)
        ax.set_xlabel("decode speed-up against dense\n(median of rounds; error bars ±1 standard error; ~ noise)")
        ax.grid(True, alpha=0.3, which="both")
        info["panels"].append({"config": config, "points": [
            {"layout": r.label, "decode_speedup": x, "quality": y, "noise": r.decode_speedup[config].within_noise()}
            for r, (x, y) in zip(runs, points)], "front": [runs[i].label for i in front]})
    ylabel = metric.label + ("" if metric.higher_is_better else " (lower is better)") + (", log scale" if log_y else "")
    for ax in axes[:, 0]:
        ax.set_ylabel(ylabel)
    if not metric.higher_is_better:
        axes.flat[0].invert_yaxis()  # shared: better is up in every panel
    ax0 = axes.flat[0]
    # every point with its error bar (positive on a log axis), so the bars stay inside the panels
    y_ends = [y + sign * (run.metric_stderr.get(metric) or 0.0) for _ax, runs, points, _c in panels
              for run, (_x, y) in zip(runs, points) for sign in (-1, 1)]
    y_low, y_high = min(y_ends), max(y_ends)
    if log_y:
        if y_low <= 0:  # an error bar reaching zero or below: the lowest value instead
            y_low = min(values)
        ax0.set_ylim(*(sorted((y_low / 1.15, y_high * 1.15), reverse=not metric.higher_is_better)))
    else:
        pad = 0.08 * (y_high - y_low or 1.0)
        ax0.set_ylim(*(sorted((y_low - pad, y_high + pad), reverse=not metric.higher_is_better)))

    from matplotlib.lines import Line2D

    first = {layout: next(r for r in runs_all if r.layout == layout) for layout in layouts}
    handles = [Line2D([], [], marker="o", linestyle="none", color=colors[layout], markersize=7,
                      label=_legend_label(names[first[layout].label].removesuffix(", adapted"), layout)) for layout in layouts]
    handles += [Line2D([], [], marker="^", linestyle="none", color="gray", markersize=7, label="adapted checkpoint (triangle)"),
                Line2D([], [], color="tab:red", linestyle="--", marker="o", markerfacecolor="none", markeredgecolor="tab:red",
                       label="Pareto front (red ring)")]
    tps = sorted({c[0] for c in configs})
    title = f"{model_name(report)}: {metric.label} vs decode speed-up, TP={','.join(map(str, tps))}"
    fig.suptitle(title, fontsize=11)
    fig.legend(handles=handles, loc="lower center", ncol=1, fontsize=8, frameon=False, bbox_to_anchor=(0.5, 0.0))
    fig.tight_layout(rect=(0, 0.03 + 0.05 * (len(layouts) + 2) / rows / 1.5, 1, 1))
    fig.canvas.draw()  # the final layout and limits: labels are placed in display space
    for (ax, runs, points, config), panel in zip(panels, info["panels"]):
        panel.update(xlim=tuple(sorted(ax.get_xlim())), ylim=tuple(sorted(ax.get_ylim())))
        labels = [("~" if run.decode_speedup[config].within_noise() else "") + names[run.label] for run in runs]
        sizes = [TRIANGLE_SIZE if run.adapted else CIRCLE_SIZE for run in runs]
        panel.update(_place_labels(ax, points, labels, sizes))
    main = next((panel for panel in info["panels"] if panel["config"] == main_config), info["panels"][0])
    info.update(points=main["points"], front=main["front"], config=main["config"], log_y=log_y,
                short_names={label: names[label] for label in names}, title=title)
    _save(fig, path)
    return info


def _place_labels(ax, points: list[tuple[float, float]], labels: list[str], sizes: list[float]) -> dict[str, Any]:
    """Annotate each point with its label where the label's box covers no marker (of any point in the panel) and
    no label placed before it, inside the panel: the first such place of candidates around the point, nearest
    first and on the panel's inner side first; where none is free, the one covering the fewest. Returns the
    markers' centres and radii and the labels' boxes, in display pixels (``markers``, ``labels``)."""
    fig = ax.figure
    renderer = fig.canvas.get_renderer()
    scale = fig.dpi / 72.0  # points to pixels
    centres = [tuple(ax.transData.transform(point)) for point in points]
    radii = [(size ** 0.5 / 2 + RING_WIDTH / 2) * scale + 1.0 for size in sizes]
    marker_boxes = [(cx - r, cy - r, cx + r, cy + r) for (cx, cy), r in zip(centres, radii)]
    frame = ax.get_window_extent(renderer)
    middle = (frame.x0 + frame.x1) / 2
    placed: list[tuple[float, float, float, float]] = []
    order = sorted(range(len(points)), key=lambda i: (centres[i][0], centres[i][1]))
    for i in order:
        (cx, _), r = centres[i], radii[i]
        sides = (1, -1) if cx <= middle else (-1, 1)  # towards the panel's middle first
        candidates = [(sx * (r + 3), sy * (2 + step * 11)) for step in range(12) for sx in sides for sy in (1, -1)]
        candidates += [(0, sy * (r + 2 + step * 11)) for step in range(12) for sy in (1, -1)]
        note = ax.annotate(labels[i], points[i], textcoords="offset pixels", xytext=(0, 0), fontsize=8, annotation_clip=False)
        best, best_cost = None, None
        for dx, dy in candidates:
            note.xyann = (dx, dy)
            note.set_horizontalalignment("left" if dx > 0 else "right" if dx < 0 else "center")
            note.set_verticalalignment("bottom" if dy > 0 else "top")
            extent = note.get_window_extent(renderer)
            box = (extent.x0, extent.y0, extent.x1, extent.y1)
            inside = frame.x0 <= box[0] and box[2] <= frame.x1 and frame.y0 <= box[1] and box[3] <= frame.y1
            cost = sum(_overlap(box, other) for other in marker_boxes + placed) + (0 if inside else 1)
            if best_cost is None or cost < best_cost:
                best, best_cost = (dx, dy, box), cost
            if cost == 0:
                break
        dx, dy, box = best
        note.xyann = (dx, dy)
        note.set_horizontalalignment("left" if dx > 0 else "right" if dx < 0 else "center")
        note.set_verticalalignment("bottom" if dy > 0 else "top")
        placed.append(box)
    boxes = {i: placed[k] for k, i in enumerate(order)}
    return {"markers": [(cx, cy, r) for (cx, cy), r in zip(centres, radii)], "labels": [boxes[i] for i in range(len(points))]}


def _overlap(a: tuple[float, float, float, float], b: tuple[float, float, float, float]) -> int:
    """1 when the boxes ``(x0, y0, x1, y1)`` share an area, else 0."""
    return int(a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3])


def _legend_label(short: str, layout: str) -> str:
    return layout if short == layout else f"{short}: {layout}"


def _save(fig, path: Path) -> None:
    import matplotlib.pyplot as plt

    from ..checkpoint.atomic import write_file_atomic

    image = io.BytesIO()
    fig.savefig(image, format="png", bbox_inches="tight", pad_inches=0.15)  # everything drawn stays inside the image
    plt.close(fig)
    write_file_atomic(path, image.getvalue())
