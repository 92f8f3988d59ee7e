"""Join eval and bench JSON into one accuracy-vs-speed table (Markdown and CSV).

Inputs are read robustly:

- an eval record (``ladderize eval --json``): ``kind == "ladderize-eval"`` with ``layout``,
  ``layers_converted``, ``allreduces_per_token`` and lm-eval's ``results``;
- a bench record (``ladderize bench --json``): a list of rows, at the top level or under
  ``rows``/``results``/``runs``; a row has ``tp``, ``batch``, ``tokens_per_s`` and usually
  ``schedule``; a row's speed-up against dense is its own ``speedup_vs_dense`` (or a
  similar key) when given, else ``tokens_per_s`` over that of the ``dense`` schedule at the
  same TP degree, batch and lengths, in the same file or in the dense layout's bench.

Runs are joined per layout, keyed by checkpoint path when both sides name one, else by
the layout's description. The dense layout is the reference for every difference.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import LadderizeError

# Headline metrics, in display order: (lm-eval metric name, short label, higher is better).
ACCURACY_METRICS = {"acc": "acc", "acc_norm": "acc_norm", "exact_match": "em", "f1": "f1", "mcc": "mcc"}
PERPLEXITY_METRICS = {"perplexity": "ppl", "word_perplexity": "word ppl"}
SPEEDUP_KEYS = ("speedup_vs_dense", "speedup_against_dense", "speed_up_vs_dense", "speedup", "speed_up")
ROW_LIST_KEYS = ("rows", "results", "runs", "measurements")
NATIVE_SCHEDULES = ("native", None, "")


@dataclass(frozen=True)
class Metric:
    task: str
    name: str  # lm-eval metric name, e.g. "acc", "word_perplexity"
    higher_is_better: bool

    @property
    def label(self) -> str:
        short = ACCURACY_METRICS.get(self.name) or PERPLEXITY_METRICS.get(self.name) or self.name
        return f"{self.task} {short}"


@dataclass
class LayoutRun:
    """Everything known about one layout: accuracy (eval) and speed (bench)."""

    key: str
    layout: str
    checkpoint: str | None = None
    layers_converted: int | None = None
    num_layers: int | None = None
    allreduces_total: int | None = None
    allreduces_overlappable: int | None = None
    metrics: dict[Metric, float] = field(default_factory=dict)
    bench_rows: list[dict[str, Any]] = field(default_factory=list)
    speedups: dict[tuple[int, int], float] = field(default_factory=dict)  # (tp, batch) -> x
    speedup_spread: dict[tuple[int, int], tuple[float, float]] = field(default_factory=dict)  # (min, max) over the rounds
    speedup_stderr: dict[tuple[int, int], float] = field(default_factory=dict)
    metric_stderr: dict[Metric, float] = field(default_factory=dict)
    tokens_per_s: dict[tuple[int, int], float] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)
    adapted: bool = False  # the checkpoint's provenance records an adapt step
    speed_shared_from: str | None = None  # speed-ups borrowed from a run of the same layout

    @property
    def is_dense(self) -> bool:
        return self.layout == "dense" or self.layers_converted == 0

    @property
    def label(self) -> str:
        return f"{self.layout}, adapted" if self.adapted else self.layout


@dataclass
class Report:
    runs: list[LayoutRun]
    metrics: list[Metric]
    configs: list[tuple[int, int]]  # (tp, batch) with speed-ups
    dense: LayoutRun | None

    def columns(self) -> list[str]:
        cols = ["layout", "layers converted", "all-reduces / token"]
        for metric in self.metrics:
            cols += [metric.label, f"Δ {metric.label}"]
        cols += [f"speed-up TP{tp} b{batch}" for tp, batch in self.configs]
        return cols

    def delta(self, run: LayoutRun, metric: Metric) -> float | None:
        if self.dense is None or metric not in run.metrics or metric not in self.dense.metrics:
            return None
        return run.metrics[metric] - self.dense.metrics[metric]

    def rows(self, numeric: bool = False) -> list[list[Any]]:
        """Table rows; ``numeric`` keeps raw numbers (CSV), otherwise formatted strings (Markdown)."""
        out = []
        for run in self.runs:
            converted = (
                run.layers_converted if numeric else _fmt_converted(run.layers_converted, run.num_layers)
            )
            allreduces = run.allreduces_total if numeric else _fmt_allreduces(run)
            row: list[Any] = [run.label, converted, allreduces]
            for metric in self.metrics:
                value, delta = run.metrics.get(metric), self.delta(run, metric)
                if numeric:
                    row += [value, delta]
                else:
                    row += [_fmt_value(value), _fmt_delta(delta, run.is_dense)]
            for config in self.configs:
                speed, spread = run.speedups.get(config), run.speedup_spread.get(config)
                if numeric:
                    row += [speed, *(spread or (None, None))]
                else:
                    row.append(_fmt_speedup(speed, spread))
            out.append(row)
        return out

    def markdown(self) -> str:
        cols = self.columns()
        lines = ["| " + " | ".join(cols) + " |", "|" + "|".join(" --- " if i == 0 else " ---: " for i in range(len(cols))) + "|"]
        lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in self.rows()]
        return "\n".join(lines) + "\n"

    def csv(self) -> str:
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        cols = ["layout", "layers_converted", "allreduces_per_token"]
        for metric in self.metrics:
            name = f"{metric.task}/{metric.name}"
            cols += [name, f"{name}/delta_vs_dense"]
        for tp, batch in self.configs:
            name = f"speedup_vs_dense/tp{tp}/batch{batch}"
            cols += [name, f"{name}/min", f"{name}/max"]
        writer.writerow(cols)
        for row in self.rows(numeric=True):
            writer.writerow(["" if v is None else (f"{v:.6g}" if isinstance(v, float) else v) for v in row])
        return buffer.getvalue()


def load_records(paths: list[Path | str]) -> list[tuple[Path, dict[str, Any] | list]]:
    """Read every JSON run named (files, or folders searched recursively for ``*.json``)."""
    files: list[Path] = []
    for raw in paths:
        path = Path(raw).expanduser()
        if path.is_dir():
            found = sorted(p for p in path.rglob("*.json") if p.is_file() and not p.name.startswith("."))
            files += [p for p in found if _looks_like_run(p)]
        elif path.is_file():
            files.append(path)
        else:
            raise LadderizeError(f"run {path} does not exist")
    if not files:
        raise LadderizeError("no eval or bench JSON found in the runs given")
    records = []
    for file in files:
        try:
            records.append((file, json.loads(file.read_text(encoding="utf-8"))))
        except (ValueError, UnicodeDecodeError) as exc:
            raise LadderizeError(f"{file} is not valid JSON: {exc}") from None
    return records


def build_report(paths: list[Path | str]) -> Report:
    """Collect the runs, join them per layout, and compute differences and speed-ups."""
    runs: dict[str, LayoutRun] = {}
    for file, record in load_records(paths):
        if _is_predict(record):
            raise LadderizeError(
                f"{file} is a 'ladderize predict' JSON (predicted, not measured); report joins eval records "
                "(ladderize eval --json) and bench records (ladderize bench --json)"
            )
        if isinstance(record, dict) and _is_eval(record):
            _add_eval(runs, file, record)
        elif bench_rows_of(record) is not None:
            _add_bench(runs, file, record)
        else:
            raise LadderizeError(f"{file} is neither an eval record (ladderize eval --json) nor a bench record")
    _merge_by_layout(runs)
    ordered = sorted(runs.values(), key=lambda r: (not r.is_dense, r.layers_converted or 0, r.layout, r.adapted))
    dense = next((r for r in ordered if r.is_dense and not r.adapted), None) or next((r for r in ordered if r.is_dense), None)
    _compute_speedups(ordered, dense)
    _share_speedups(ordered)
    metrics = _metric_order({m for r in ordered for m in r.metrics})
    configs = sorted({c for r in ordered for c in r.speedups})
    for run in ordered:  # the dense layout is the reference: 1x by definition where it was not benched
        if run.is_dense:
            for config in configs:
                run.speedups.setdefault(config, 1.0)
    return Report(ordered, metrics, configs, dense)


# --- reading --------------------------------------------------------------------------------


def _looks_like_run(path: Path) -> bool:
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError, OSError):
        return False
    if _is_predict(record):
        return False
    return (isinstance(record, dict) and _is_eval(record)) or bench_rows_of(record) is not None


def _is_predict(record: Any) -> bool:
    """A ``ladderize predict --json`` file: rows of predicted times beside the interconnect and module timings used."""
    return isinstance(record, dict) and "interconnect" in record and "module_timings" in record


def _is_eval(record: dict[str, Any]) -> bool:
    return record.get("kind") == "ladderize-eval" or (isinstance(record.get("results"), dict) and "layout" in record and not bench_rows_of(record))


def bench_rows_of(record: Any) -> list[dict[str, Any]] | None:
    """The measurement rows of a bench record, or ``None`` when it is not one."""
    rows = None
    if isinstance(record, list):
        rows = record
    elif isinstance(record, dict):
        for key in ROW_LIST_KEYS:
            if isinstance(record.get(key), list):
                rows = record[key]
                break
    if not rows or not all(isinstance(r, dict) for r in rows):
        return None
    if not any("tokens_per_s" in r or any(k in r for k in SPEEDUP_KEYS) for r in rows):
        return None
    return rows


def _run_for(runs: dict[str, LayoutRun], checkpoint: str | None, layout: str) -> LayoutRun:
    key = _key(checkpoint, layout)
    if key not in runs:
        runs[key] = LayoutRun(key=key, layout=layout, checkpoint=checkpoint)
    return runs[key]


def _key(checkpoint: str | None, layout: str) -> str:
    return f"ckpt:{Path(checkpoint).expanduser().absolute()}" if checkpoint else f"layout:{layout}"


def _add_eval(runs: dict[str, LayoutRun], file: Path, record: dict[str, Any]) -> None:
    layout = str(record.get("layout") or "unknown")
    run = _run_for(runs, record.get("checkpoint"), layout)
    _fill_layout_facts(run, record)
    run.adapted = run.adapted or "adapt" in (record.get("history") or [])
    higher = (record.get("lm_eval") or {}).get("higher_is_better") or record.get("higher_is_better") or {}
    for task, values in (record.get("results") or {}).items():
        if not isinstance(values, dict):
            continue
        for key, value in values.items():
            name = key.split(",", 1)[0]
            if name not in ACCURACY_METRICS and name not in PERPLEXITY_METRICS:
                continue
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
                continue
            better = (higher.get(task) or {}).get(name)
            metric = Metric(task, name, bool(better) if better is not None else name in ACCURACY_METRICS)
            run.metrics[metric] = float(value)
            stderr = values.get(key.replace(name, f"{name}_stderr", 1))
            if isinstance(stderr, (int, float)) and not isinstance(stderr, bool) and math.isfinite(stderr):
                run.metric_stderr[metric] = float(stderr)
    run.sources.append(str(file))


def _add_bench(runs: dict[str, LayoutRun], file: Path, record: Any) -> None:
    rows = bench_rows_of(record) or []
    top = record if isinstance(record, dict) else {}
    meta = top.get("meta") if isinstance(top.get("meta"), dict) else {}
    # The checkpoint's own layout names the run; a row's "layout" is the layout its schedule ran.
    layout = _describe(top) or _describe(meta)
    checkpoint = top.get("checkpoint") or top.get("ckpt") or meta.get("checkpoint") or meta.get("model")
    if isinstance(checkpoint, str) and checkpoint.startswith("synthetic:"):
        checkpoint = None
    if not layout:  # fall back on the layout the native schedule ran
        layout = next((str(r["layout"]) for r in rows if r.get("schedule") in NATIVE_SCHEDULES and r.get("layout")), None)
    for row in rows:
        run = _run_for(runs, row.get("checkpoint") or checkpoint, layout or "unknown")
        _fill_layout_facts(run, meta)
        _fill_layout_facts(run, top)
        run.bench_rows.append(row)
        if str(file) not in run.sources:
            run.sources.append(str(file))


def _describe(record: dict[str, Any]) -> str | None:
    layout = record.get("layout")
    if isinstance(layout, dict):
        return layout.get("describe") or layout.get("name")
    return layout if isinstance(layout, str) else None


def _fill_layout_facts(run: LayoutRun, record: dict[str, Any]) -> None:
    if run.layout == "unknown" and _describe(record):
        run.layout = _describe(record)
    if run.layers_converted is None and isinstance(record.get("layers_converted"), (int, list)):
        value = record["layers_converted"]
        run.layers_converted = len(value) if isinstance(value, list) else value
    if run.num_layers is None and isinstance(record.get("num_layers"), int):
        run.num_layers = record["num_layers"]
    ar = record.get("allreduces_per_token")
    if run.allreduces_total is None and ar is not None:
        if isinstance(ar, dict):
            run.allreduces_total, run.allreduces_overlappable = ar.get("total"), ar.get("overlappable")
        elif isinstance(ar, (int, float)):
            run.allreduces_total = int(ar)


def _merge_by_layout(runs: dict[str, LayoutRun]) -> None:
    """A run keyed only by its layout (no checkpoint path) joins the checkpoints of that layout.

    Its bench rows go to every checkpoint of the layout (speed depends on the layout, not on
    the weights); its metrics only to a single one.
    """
    by_layout: dict[str, list[str]] = {}
    for key, run in runs.items():
        by_layout.setdefault(run.layout, []).append(key)
    for keys in by_layout.values():
        loose = [k for k in keys if k.startswith("layout:")]
        anchored = [runs[k] for k in keys if k.startswith("ckpt:")]
        if not loose or not anchored:
            continue
        for key in loose:
            other = runs.pop(key)
            for target in anchored:
                _absorb(target, other, metrics=len(anchored) == 1)


def _absorb(target: LayoutRun, other: LayoutRun, metrics: bool = True) -> None:
    for name in ("layers_converted", "num_layers", "allreduces_total", "allreduces_overlappable"):
        if getattr(target, name) is None:
            setattr(target, name, getattr(other, name))
    if metrics:
        target.metrics.update({m: v for m, v in other.metrics.items() if m not in target.metrics})
    target.bench_rows += other.bench_rows
    target.sources += [s for s in other.sources if s not in target.sources]


def _share_speedups(runs: list[LayoutRun]) -> None:
    """A checkpoint without its own bench takes the speed-ups measured for another of the same layout."""
    for run in runs:
        if run.speedups:
            continue
        donor = next((r for r in runs if r is not run and r.layout == run.layout and r.speedups and not r.speed_shared_from), None)
        if donor is not None:
            run.speedups = dict(donor.speedups)
            run.speedup_spread = dict(donor.speedup_spread)
            run.speedup_stderr = dict(donor.speedup_stderr)
            run.tokens_per_s = dict(donor.tokens_per_s)
            run.speed_shared_from = donor.label


# --- speed-up ---------------------------------------------------------------------------------


def _row_config(row: dict[str, Any]) -> tuple[int, int] | None:
    try:
        return int(row.get("tp", row.get("tp_size", 1))), int(row.get("batch", row.get("batch_size", 1)))
    except (TypeError, ValueError):
        return None


def _lengths(row: dict[str, Any]) -> tuple[Any, Any]:
    return row.get("prompt_len"), row.get("gen_len")


def _tps(row: dict[str, Any]) -> float | None:
    value = row.get("tokens_per_s")
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


def _compute_speedups(runs: list[LayoutRun], dense: LayoutRun | None) -> None:
    dense_native = {}
    if dense is not None:
        for row in dense.bench_rows:
            if row.get("schedule") in NATIVE_SCHEDULES + ("dense",) and _tps(row) and _row_config(row):
                dense_native.setdefault((_row_config(row), _lengths(row)), _tps(row))
    for run in runs:
        own_dense_rows = {
            (_row_config(r), _lengths(r)): r
            for r in run.bench_rows
            if r.get("schedule") == "dense" and _tps(r) and _row_config(r)
        }
        own_dense = {key: _tps(r) for key, r in own_dense_rows.items()}
        for row in run.bench_rows:
            config = _row_config(row)
            if config is None or row.get("schedule") not in NATIVE_SCHEDULES:
                continue
            if _tps(row) is not None:
                run.tokens_per_s.setdefault(config, _tps(row))
            given = next((row[k] for k in SPEEDUP_KEYS if isinstance(row.get(k), (int, float))), None)
            if given is not None:
                speed = float(given)
            elif run.is_dense:
                speed = 1.0
            else:
                reference = own_dense.get((config, _lengths(row))) or dense_native.get((config, _lengths(row)))
                speed = _tps(row) / reference if reference and _tps(row) else None
            if speed is not None and config not in run.speedups:
                run.speedups[config] = speed
                spread = _speedup_spread(row, own_dense_rows.get((config, _lengths(row))))
                if spread is not None:
                    run.speedup_spread[config] = spread[:2]
                    if spread[2] is not None:
                        run.speedup_stderr[config] = spread[2]


def _speedup_spread(row: dict[str, Any], dense_row: dict[str, Any] | None) -> tuple[float, float, float | None] | None:
    """(min, max, stderr) of a row's speed-up over the bench rounds: the row's own keys, else from both rows' runs."""
    low, high = row.get("speedup_vs_dense_min"), row.get("speedup_vs_dense_max")
    if isinstance(low, (int, float)) and isinstance(high, (int, float)):
        stderr = row.get("speedup_vs_dense_stderr")
        return float(low), float(high), float(stderr) if isinstance(stderr, (int, float)) else None
    if dense_row is None:
        return None
    from ..runtime.bench import speedup_stats

    stats = speedup_stats(dense_row.get("decode_s_per_token_runs"), row.get("decode_s_per_token_runs"))
    if not stats:
        return None
    return stats["speedup_vs_dense_min"], stats["speedup_vs_dense_max"], stats["speedup_vs_dense_stderr"]


def _metric_order(metrics: set[Metric]) -> list[Metric]:
    order = list(ACCURACY_METRICS) + list(PERPLEXITY_METRICS)
    return sorted(metrics, key=lambda m: (m.task, order.index(m.name) if m.name in order else len(order), m.name))


# --- formatting -------------------------------------------------------------------------------


def _fmt_converted(count: int | None, total: int | None) -> str:
    if count is None:
        return "–"
    return f"{count}/{total}" if total else str(count)


def _fmt_allreduces(run: LayoutRun) -> str:
    if run.allreduces_total is None:
        return "–"
    if run.allreduces_overlappable:
        return f"{run.allreduces_total} ({run.allreduces_overlappable} overlapped)"
    return str(run.allreduces_total)


def _fmt_speedup(speed: float | None, spread: tuple[float, float] | None) -> str:
    """``1.13x``, with the min–max over the bench rounds when known: ``1.13x (1.08–1.17)``."""
    if speed is None:
        return "–"
    if spread is None or spread[0] == spread[1]:
        return f"{speed:.2f}x"
    return f"{speed:.2f}x ({spread[0]:.2f}–{spread[1]:.2f})"


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


def notes(report: Report, plot_info: dict[str, Any]) -> str:
    """The Markdown notes under the table: what dense is, where the speed-ups came from, the plot's front."""
    lines = []
    if report.dense is None:
        lines.append("- No dense run was given, so differences against dense are left blank.")
    else:
        lines.append(f"- Differences (Δ) are against the dense layout ({report.dense.checkpoint or report.dense.layout}).")
    if report.configs:
        lines.append(
            "- Speed-up: tokens/s of the layout's own schedule over the dense schedule on the same weights, "
            "per tensor-parallel degree (TP) and batch (b), from `ladderize bench`; in brackets the lowest and "
            "highest speed-up over the bench's rounds (each round runs every schedule once)."
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
    lines.append("- All-reduces per token: per forward pass under TP; ladder layers' all-reduces overlap compute.")
    if plot_info.get("points"):
        lines.append(
            f"- Plot: {plot_info['y_label']} against speed-up at TP{plot_info['config'][0]} batch {plot_info['config'][1]};"
            f" Pareto front: {', '.join(plot_info['front'])}."
        )
    lines.append("- Sources: " + ", ".join(sorted({Path(s).name for r in report.runs for s in r.sources})))
    return "\n".join(lines) + "\n"
