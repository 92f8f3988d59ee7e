"""Eval and bench records joined into one ``LayoutRun`` per layout: its accuracy and its decode speed-up.

Records are read with ``ladderize.records.read_record`` (files from before the records through its
legacy reader) and by their names only:

- an ``EvalRecord`` gives a checkpoint's layout, its all-reduce counts and lm-eval's ``results``;
- a ``BenchRecord`` gives ``BenchRow``s. A layout's speed is its ``native`` rows' ``BenchRow.decode_speedup()``
  (the rounds' median and range, the rule of ``records.measured_speedup``, as bench wrote it); a row without
  one is compared by the same rule with the ``dense`` row of the same (TP degree, batch, prompt, decode
  steps) in its own file, else with the dense layout's bench (times only: rounds of two runs do not pair).
- a ``PredictRecord`` (a model, not a measurement) is refused with one line.

The records must be of one model (``check_one_model``). Runs are joined per layout, keyed by checkpoint path when both sides name one, else by the layout's
description. The dense layout is the reference for every difference.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import LadderizeError
from ..records import (DENSE_SCHEDULE, BenchRecord, BenchRow, EvalRecord, PredictRecord, Record, SpeedupSpread, finite,
                       measured_speedup, read_record)

# Headline metrics, in display order: (lm-eval metric name, short label, higher is better).
ACCURACY_METRICS = {"acc": "acc", "acc_norm": "acc_norm", "exact_match": "em", "f1": "f1", "mcc": "mcc"}
PERPLEXITY_METRICS = {"perplexity": "ppl", "word_perplexity": "word ppl"}
NATIVE_SCHEDULE = "native"

Config = tuple[int, int]  # (tp, batch)


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
    """Everything known about one layout: accuracy (eval) and decode speed (bench)."""

    key: str
    layout: str
    checkpoint: str | None = None
    layers_converted: int | None = None
    num_layers: int | None = None
    allreduces_per_decode_step: int | None = None
    overlappable_allreduces_per_decode_step: int | None = None
    metrics: dict[Metric, float] = field(default_factory=dict)
    metric_stderr: dict[Metric, float] = field(default_factory=dict)
    bench_rows: list[BenchRow] = field(default_factory=list)
    decode_speedup: dict[Config, SpeedupSpread] = field(default_factory=dict)  # the rounds' median, range, stderr
    decode_tokens_per_s: dict[Config, float] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)
    load_notes: list[str] = field(default_factory=list)  # benches measured under load (``BenchRecord.load_note``)
    metric_settings: dict[Metric, "Measured"] = field(default_factory=dict)  # how and where each metric was measured
    adapted: bool = False  # the checkpoint's provenance records an adapt step
    speed_shared_from: str | None = None  # speed-ups borrowed from a run of the same layout

    @property
    def decode_speedups(self) -> dict[Config, float]:
        """The decode speed-up per (tp, batch): ``decode_speedup``'s value (the rounds' median)."""
        return {config: speedup.median for config, speedup in self.decode_speedup.items()}

    @property
    def is_dense(self) -> bool:
        return self.layout == "dense" or self.layers_converted == 0

    @property
    def label(self) -> str:
        return f"{self.layout}, adapted" if self.adapted else self.layout


def load_records(paths: list[Path | str]) -> list[tuple[Path, Record]]:
    """Read every record named: files, or folders searched recursively for ``*.json`` eval and bench records."""
    files: list[tuple[Path, bool]] = []  # (path, named explicitly)
    for raw in paths:
        path = Path(raw).expanduser()
        if path.is_dir():
            files += [(p, False) for p in sorted(path.rglob("*.json")) if p.is_file() and not p.name.startswith(".")]
        elif path.is_file():
            files.append((path, True))
        else:
            raise LadderizeError(f"run {path} does not exist")
    records = []
    for file, explicit in files:
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as exc:
            if explicit:
                raise LadderizeError(f"{file} is not valid JSON: {exc}") from None
            continue
        try:
            record = read_record(data, str(file))
        except LadderizeError:
            if explicit:
                raise
            continue  # a folder may hold other JSON
        if isinstance(record, PredictRecord):
            if explicit:
                raise LadderizeError(
                    f"{file} is a 'ladderize predict' JSON (predicted, not measured); report joins eval records "
                    "(ladderize eval --json) and bench records (ladderize bench --json)"
                )
            continue
        records.append((file, record))
    if not records:
        raise LadderizeError("no eval or bench JSON found in the runs given")
    return records


@dataclass(frozen=True)
class ModelOf:
    """Which model a record measured: a name for messages, its layer count and its parameter count (where known)."""

    name: str
    num_layers: int | None
    params: int | None

    def differs(self, other: "ModelOf") -> bool:
        known = [(a, b) for a, b in ((self.num_layers, other.num_layers), (self.params, other.params)) if a and b]
        return any(a != b for a, b in known)

    def describe(self) -> str:
        shape = [f"{self.num_layers} layers" if self.num_layers else "", f"{self.params / 1e6:,.1f}M parameters" if self.params else ""]
        return f"{self.name} ({', '.join(s for s in shape if s)})" if any(shape) else self.name


def model_of(record: Record) -> ModelOf:
    """The model behind an eval or bench record: a bench's meta, or the checkpoint's config (read without torch)."""
    checkpoint = record.checkpoint if isinstance(record, (EvalRecord, BenchRecord)) else None
    if isinstance(record, BenchRecord) and record.checkpoint is None:
        return ModelOf(record.model, record.meta.get("num_layers"), record.meta.get("params"))
    params = record.meta.get("params") if isinstance(record, BenchRecord) else None
    layers = record.meta.get("num_layers") if isinstance(record, BenchRecord) else record.num_layers
    if checkpoint and params is None:
        try:
            from ..checkpoint.architectures import read_config_header

            shape = read_config_header(checkpoint).shape
            params, layers = shape.num_parameters, layers or shape.num_hidden_layers
        except LadderizeError:  # moved or deleted since: the layer count still tells models apart
            pass
    return ModelOf(Path(checkpoint).name if checkpoint else "model", layers, params)


def check_one_model(records: list[tuple[Path, Record]]) -> None:
    """Refuse, in one line, records of different models (a synthetic bench beside a real model's eval): one table
    would put one model's speed beside another's accuracy."""
    groups: list[tuple[ModelOf, list[str]]] = []
    for file, record in records:
        model = model_of(record)
        group = next((g for g in groups if not g[0].differs(model)), None)
        if group is None:
            groups.append((model, [file.name]))
        else:
            group[1].append(file.name)
    if len(groups) > 1:
        described = "; ".join(f"{model.describe()}: {', '.join(files)}" for model, files in groups)
        raise LadderizeError(f"report joins the runs of one model, but these runs hold {len(groups)}: {described}; "
                             "report each model apart (one 'ladderize report' per model)")


@dataclass(frozen=True)
class Measured:
    """The settings an eval record measured one task with, and the file that holds it."""

    settings: tuple[tuple[str, Any], ...]  # (setting, value) in a fixed order
    file: str

    def differing(self, other: "Measured") -> tuple[str, Any, Any] | None:
        """The first setting whose values differ, with both values (None: the same settings)."""
        return next(((name, mine, theirs) for (name, mine), (_, theirs) in zip(self.settings, other.settings)
                     if mine != theirs), None)


def eval_settings(record: EvalRecord, task: str, file: Path) -> Measured:
    """What makes two eval figures of ``task`` comparable: the task's limit and n-shot, the model's context (max
    length), the backend, its parallelism, the dtype and the batch size."""
    limit = record.limit.get(task) if isinstance(record.limit, dict) else record.limit
    shots = (record.lm_eval.get("n-shot") or {}).get(task)
    return Measured((("limit", limit), ("n-shot", shots), ("max length", record.max_length),
                     ("backend", record.backend), ("tensor parallel size", record.tensor_parallel_size),
                     ("dtype", record.dtype), ("batch size", record.batch_size)), str(file))


def _shown(value: Any, setting: str) -> str:
    if value is None:
        return {"max length": "the model's own", "limit": "none (every example)"}.get(setting, "not recorded")
    return str(value)


def _refuse_mixed(task: str, one: Measured, other: Measured) -> None:
    """Refuse, in one line, two figures of ``task`` measured with different settings (no figure is computed from
    records that measured another thing); the files are named in path order, as the records are read."""
    first, second = sorted([one, other], key=lambda measured: measured.file)
    found = first.differing(second)
    if found is None:
        return
    setting, a, b = found
    raise LadderizeError(f"report compares figures measured with the same settings, but {task}'s {setting} is "
                         f"{_shown(a, setting)} in {first.file} and {_shown(b, setting)} in {second.file}; "
                         "evaluate both with the same settings, or report them apart")


def check_comparable(runs: list[LayoutRun]) -> None:
    """Every figure of a task, in every run, measured with the same settings (``eval_settings``), else one line
    naming the setting and the two files."""
    first: dict[str, Measured] = {}
    for run in runs:
        for metric, measured in run.metric_settings.items():
            seen = first.setdefault(metric.task, measured)
            _refuse_mixed(metric.task, seen, measured)


BENCH_SETTINGS = ("device", "dtype")  # a bench's meta that makes its speed-ups comparable with another's


def check_benches_comparable(records: list[tuple[Path, Record]]) -> None:
    """The bench records of one report measured on the same device and dtype, else one line naming the setting and
    the two files (one table would put speed-ups of different machines side by side)."""
    benches = sorted(((file, record) for file, record in records if isinstance(record, BenchRecord)),
                     key=lambda pair: str(pair[0]))
    for file, record in benches[1:]:
        base_file, base = benches[0]
        for name in BENCH_SETTINGS:
            if base.meta.get(name) != record.meta.get(name):
                raise LadderizeError(f"report compares benches measured alike, but the {name} is "
                                     f"{_shown(base.meta.get(name), name)} in {base_file} and "
                                     f"{_shown(record.meta.get(name), name)} in {file}; report them apart")


def collect_runs(paths: list[Path | str]) -> list[LayoutRun]:
    """The runs of every record (of one model: ``check_one_model``), joined per layout, dense first, with their
    decode speed-ups. Records are read in the order of their paths, whatever the order they were named in, and two
    figures of one task measured with different settings are refused (``check_comparable``)."""
    runs: dict[str, LayoutRun] = {}
    records = sorted(load_records(paths), key=lambda pair: str(pair[0]))
    check_one_model(records)
    check_benches_comparable(records)
    for file, record in records:
        if isinstance(record, EvalRecord):
            _add_eval(runs, file, record)
        elif isinstance(record, BenchRecord):
            _add_bench(runs, file, record)
    _merge_by_layout(runs)
    check_comparable(list(runs.values()))
    ordered = sorted(runs.values(), key=lambda r: (not r.is_dense, r.layers_converted or 0, r.layout, r.adapted))
    _compute_speedups(ordered, dense_run(ordered))
    _share_speedups(ordered)
    return ordered


def dense_run(runs: list[LayoutRun]) -> LayoutRun | None:
    """The reference: the dense layout's run (not adapted, when there is a choice)."""
    return next((r for r in runs if r.is_dense and not r.adapted), None) or next((r for r in runs if r.is_dense), None)


def _run_for(runs: dict[str, LayoutRun], checkpoint: str | None, layout: str) -> LayoutRun:
    key = f"ckpt:{Path(checkpoint).expanduser().absolute()}" if checkpoint else f"layout:{layout}"
    if key not in runs:
        runs[key] = LayoutRun(key=key, layout=layout, checkpoint=checkpoint)
    return runs[key]


def _add_eval(runs: dict[str, LayoutRun], file: Path, record: EvalRecord) -> None:
    run = _run_for(runs, record.checkpoint or None, record.layout)
    # the eval record read the checkpoint's config: its counts replace any a bench record gave (_layout_from_bench)
    run.layers_converted = run.layers_converted if record.layers_converted is None else record.layers_converted
    run.num_layers = run.num_layers if record.num_layers is None else record.num_layers
    if record.allreduces_per_decode_step is not None:
        run.allreduces_per_decode_step = record.allreduces_per_decode_step
        run.overlappable_allreduces_per_decode_step = record.overlappable_allreduces_per_decode_step
    run.adapted = run.adapted or "adapt" in record.history
    higher = record.lm_eval.get("higher_is_better") or {}
    for task, values in record.results.items():
        if not isinstance(values, dict):
            continue
        for key, raw in values.items():
            name = key.split(",", 1)[0]
            value = finite(raw)
            if (name not in ACCURACY_METRICS and name not in PERPLEXITY_METRICS) or value is None:
                continue
            better = (higher.get(task) or {}).get(name)
            metric = Metric(task, name, bool(better) if better is not None else name in ACCURACY_METRICS)
            measured = eval_settings(record, task, file)
            if metric in run.metric_settings:
                _refuse_mixed(task, run.metric_settings[metric], measured)
            run.metric_settings[metric] = measured
            run.metrics[metric] = value
            stderr = finite(values.get(key.replace(name, f"{name}_stderr", 1)))
            if stderr is not None:
                run.metric_stderr[metric] = stderr
    run.sources.append(str(file))


def _add_bench(runs: dict[str, LayoutRun], file: Path, record: BenchRecord) -> None:
    # The checkpoint's own layout names the run; a row's layout is the layout its schedule ran.
    run = _run_for(runs, record.checkpoint, record.layout)
    dense = {row.config(): row for row in record.rows if row.schedule == DENSE_SCHEDULE}
    for row in record.rows:  # a row written without its speed-up: the rule, against the dense row of its own run
        if row.decode_speedup() is None and row.config() in dense:
            row.compare_with(dense[row.config()])
    run.bench_rows += record.rows
    note = record.load_note(f"bench {file.name}")
    if note and note not in run.load_notes:
        run.load_notes.append(note)
    _layout_from_bench(run, record)
    if str(file) not in run.sources:
        run.sources.append(str(file))


def _layout_from_bench(run: LayoutRun, record: BenchRecord) -> None:
    """What a run without an eval record knows of its layout from its bench record: layers converted (from the
    meta, else the layout's description) and all-reduces per decode step (the meta's program count, else the
    native rows' count at TP > 1, where the ranks really communicate)."""
    from ..model.layout import described_layers

    meta = record.meta
    if run.layers_converted is None:
        layers = described_layers(record.layout)
        run.layers_converted = meta.get("layers_converted", None if layers is None else sum(map(len, layers.values())))
    if run.num_layers is None:
        run.num_layers = meta.get("num_layers")
    if run.allreduces_per_decode_step is None:
        counts = meta.get("allreduces_per_token")
        native = next((r for r in record.rows if r.schedule == NATIVE_SCHEDULE and r.tp > 1
                       and r.allreduces_per_decode_step is not None), None)  # fmt: skip
        if isinstance(counts, dict) and "total" in counts:
            run.allreduces_per_decode_step = counts["total"]
            run.overlappable_allreduces_per_decode_step = counts.get("overlappable")
        elif native is not None and not native.domino_chunks:
            run.allreduces_per_decode_step = native.allreduces_per_decode_step
            run.overlappable_allreduces_per_decode_step = native.overlapped_allreduces_per_decode_step


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
    for name in ("layers_converted", "num_layers", "allreduces_per_decode_step", "overlappable_allreduces_per_decode_step"):
        if getattr(target, name) is None:
            setattr(target, name, getattr(other, name))
    if metrics:
        target.metrics.update({m: v for m, v in other.metrics.items() if m not in target.metrics})
        target.metric_settings.update({m: v for m, v in other.metric_settings.items() if m not in target.metric_settings})
    target.bench_rows += other.bench_rows
    target.load_notes += [n for n in other.load_notes if n not in target.load_notes]
    target.sources += [s for s in other.sources if s not in target.sources]


def _share_speedups(runs: list[LayoutRun]) -> None:
    """A checkpoint without its own bench takes the speed-ups measured for another of the same layout."""
    for run in runs:
        if run.decode_speedup:
            continue
        donor = next((r for r in runs if r is not run and r.layout == run.layout and r.decode_speedup
                      and not r.speed_shared_from), None)  # fmt: skip
        if donor is not None:
            run.decode_speedup = dict(donor.decode_speedup)
            run.decode_tokens_per_s = dict(donor.decode_tokens_per_s)
            run.speed_shared_from = donor.label


def _compute_speedups(runs: list[LayoutRun], dense: LayoutRun | None) -> None:
    """Each run's decode speed-up per (tp, batch), from its native rows (see the module docstring)."""
    dense_reference: dict[tuple, BenchRow] = {}
    if dense is not None:
        for row in dense.bench_rows:
            if row.schedule in (NATIVE_SCHEDULE, DENSE_SCHEDULE):
                dense_reference.setdefault(row.config(), row)
    for run in runs:
        for row in run.bench_rows:
            config = (row.tp, row.batch)
            if row.schedule != NATIVE_SCHEDULE or config in run.decode_speedup:
                continue
            run.decode_tokens_per_s[config] = row.decode_tokens_per_s
            speed = row.decode_speedup()
            reference = dense_reference.get(row.config())
            if speed is None and run.is_dense:
                speed = SpeedupSpread.single(1.0)
            elif speed is None and reference is not None:
                speed = measured_speedup(None, None, reference.decode_s_per_token, row.decode_s_per_token)
            if speed is not None:
                run.decode_speedup[config] = speed


__all__ = ["ACCURACY_METRICS", "PERPLEXITY_METRICS", "LayoutRun", "Measured", "Metric", "ModelOf", "check_comparable",
           "check_one_model", "collect_runs", "dense_run", "eval_settings", "load_records", "model_of"]
