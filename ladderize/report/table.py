"""The accuracy-vs-speed table: one row per layout, its metrics and their difference from dense, its decode speed-ups.

``build_report`` joins the records (``runs``) and lays them out; ``render`` turns the table into
Markdown, CSV and notes, and ``plot`` into the figure.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..records import SpeedupSpread
from .collect import ACCURACY_METRICS, PERPLEXITY_METRICS, Config, LayoutRun, Metric, collect_runs, dense_run


@dataclass
class Predicted:
    """Decode speed-ups ``ladderize predict`` gives for layouts on a GPU node (``label``: its interconnect and
    compute model), shown beside the measured ones and labelled as predicted."""

    label: str
    speedups: dict[str, dict[Config, float]]  # layout description -> (tp, batch) -> predicted decode speed-up

    def configs(self) -> list[Config]:
        return sorted({c for by_config in self.speedups.values() for c in by_config})

    def of(self, run: LayoutRun, config: Config) -> float | None:
        return 1.0 if run.is_dense else self.speedups.get(run.layout, {}).get(config)


@dataclass
class Report:
    runs: list[LayoutRun]
    metrics: list[Metric]
    configs: list[Config]  # (tp, batch) with decode speed-ups
    dense: LayoutRun | None
    predicted: Predicted | None = None

    def columns(self) -> list[str]:
        """Display labels; every speed-up column names its phase."""
        cols = ["layout", "layers converted", "all-reduces / token"]
        for metric in self.metrics:
            cols += [metric.label, f"Δ {metric.label}"]
        cols += [f"decode speed-up TP{tp} b{batch}" for tp, batch in self.configs]
        cols += [f"predicted decode speed-up TP{tp} b{batch}" for tp, batch in self._predicted_configs()]
        return cols

    def _predicted_configs(self) -> list[Config]:
        return self.predicted.configs() if self.predicted is not None else []

    def csv_columns(self) -> list[str]:
        cols = ["layout", "layers_converted", "allreduces_per_decode_step"]
        for metric in self.metrics:
            name = f"{metric.task}/{metric.name}"
            cols += [name, f"{name}/delta_vs_dense"]
        for tp, batch in self.configs:
            name = f"decode_speedup_vs_dense/tp{tp}/batch{batch}"
            cols += [name, f"{name}/min", f"{name}/max", f"{name}/noise"]
        cols += [f"predicted_decode_speedup_vs_dense/tp{tp}/batch{batch}" for tp, batch in self._predicted_configs()]
        return cols

    def delta(self, run: LayoutRun, metric: Metric) -> float | None:
        if self.dense is None or metric not in run.metrics or metric not in self.dense.metrics:
            return None
        return run.metrics[metric] - self.dense.metrics[metric]

    def numeric_rows(self) -> list[list[Any]]:
        """One row of raw values per run, in ``csv_columns`` order (``None`` where unknown)."""
        out = []
        for run in self.runs:
            row: list[Any] = [run.label, run.layers_converted, run.allreduces_per_decode_step]
            for metric in self.metrics:
                row += [run.metrics.get(metric), self.delta(run, metric)]
            for config in self.configs:
                speedup = run.decode_speedup.get(config)
                row += [None] * 4 if speedup is None else [speedup.median, speedup.min, speedup.max, int(speedup.within_noise())]
            row += [self.predicted.of(run, config) for config in self._predicted_configs()]
            out.append(row)
        return out


def build_report(paths: list[Path | str], predicted: Predicted | None = None) -> Report:
    """Collect the runs, join them per layout, and compute differences and decode speed-ups (and the ``predicted``
    ones beside them)."""
    runs = collect_runs(paths)
    metrics = _metric_order({m for r in runs for m in r.metrics})
    configs = sorted({c for r in runs for c in r.decode_speedup})
    for run in runs:  # the dense layout is the reference: 1x by definition where it was not benched (and can run)
        if run.is_dense:
            for config in configs:
                if _can_run(run, config[0]):
                    run.decode_speedup.setdefault(config, SpeedupSpread.single(1.0))
    return Report(runs, metrics, configs, dense_run(runs), predicted)


def _can_run(run: LayoutRun, tp: int) -> bool:
    """Whether ``run``'s checkpoint can run at TP ``tp`` (``runtime.tp_check.validate_tp``); True when its config is not
    readable. A model that cannot run a degree (SmolLM2's 9 heads at TP 2) gets no 1.00x there."""
    if not run.checkpoint:
        return True
    from ..errors import LadderizeError
    from ..checkpoint.architectures import read_config_header
    from ..model.layout import LayoutError
    from ..runtime.tp_check import validate_tp

    try:
        header = read_config_header(run.checkpoint)
    except (LadderizeError, LayoutError):
        return True
    try:
        validate_tp(header.shape, header.layout, tp)
    except (LadderizeError, LayoutError):
        return False
    return True


def _metric_order(metrics: set[Metric]) -> list[Metric]:
    order = list(ACCURACY_METRICS) + list(PERPLEXITY_METRICS)
    return sorted(metrics, key=lambda m: (m.task, order.index(m.name) if m.name in order else len(order), m.name))


__all__ = ["Predicted", "Report", "build_report"]
