"""The records that ``bench``, ``predict`` and ``eval`` write and ``report`` reads: every name says its phase and unit.

One module holds every record name; before writing a field, find it here and use it.

* ``SpeedRow``: one schedule at one (TP degree, batch, prompt, decode steps), in both phases:
  ``prefill_s`` (the prefill step, whole batch), ``decode_s_per_token`` (one decode step: one new
  token per sequence), ``decode_tokens_per_s = batch / decode_s_per_token`` and
  ``e2e_tokens_per_s = batch * (decode_steps + 1) / (prefill_s + decode_steps * decode_s_per_token)``
  (the prefill yields the first new token, each decode step one more; the gpt-fast convention).
  ``decode_speedup_vs_dense`` compares decode times with the ``dense`` schedule's at the same TP
  degree, batch and lengths, ``e2e_speedup_vs_dense`` the end-to-end throughputs: a speed-up
  always compares one phase with the same phase.
  ``BenchRow`` (measured by ``ladderize bench``) adds the spread over the timed rounds and the
  communication it measured; ``PredictRow`` (priced by ``ladderize predict``) adds the exposed
  communication of each phase and a note.
* A measured speed-up follows one rule (``measured_speedup``), wherever it is shown: each timed round
  ran every schedule once, so round i of a row is compared with round i of ``dense``; the speed-up is
  the median of those per-round ratios, with their min and max, and it is noise
  (``SpeedupSpread.within_noise``, shown ``~``) when that min-max range straddles 1.0. A row without
  rounds that pair up has the ratio of its times and no spread.
* ``BenchRecord``, ``PredictRecord``, ``EvalRecord``: the JSON files. Each has ``record`` (its
  kind) and ``version`` (``RECORD_VERSION``); ``read_record`` turns any of them back into its type.

Files written before these records (no ``record`` field, "version 1") are read by ``read_legacy``,
which maps the old names by the file's kind: ``tokens_per_s`` and ``speedup_vs_dense`` were
decode-only in bench files and end-to-end in predict files; bench's ``gen_len`` counted decode
steps and predict's ``new_tokens`` counted new tokens (decode steps + 1).
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar, TypeVar, Union

from .errors import LadderizeError

RECORD_VERSION = 2  # 1: the files written before these records (see ``read_legacy``)
BENCH_RECORD = "ladderize-bench"
PREDICT_RECORD = "ladderize-predict"
EVAL_RECORD = "ladderize-eval"
SENSITIVITY_RECORD = "ladderize-sensitivity"  # convert.sensitivity.SensitivityReport (not a speed or accuracy row)
DENSE_SCHEDULE = "dense"
BUSY_CORES = 0.5  # CPU cores other processes keep busy from which a bench's speed figures are noise
R = TypeVar("R", bound="SpeedRow")


def e2e_tokens_per_s(batch: int, decode_steps: int, prefill_s: float, decode_s_per_token: float) -> float:
    """New tokens per second over a whole generation: the prefill's token plus one per decode step, per sequence."""
    return batch * (decode_steps + 1) / (prefill_s + decode_steps * decode_s_per_token)


@dataclass(frozen=True)
class SpeedupSpread:
    """The per-round decode speed-ups of a bench row (round i against the dense schedule's round i)."""

    min: float
    median: float
    max: float
    stderr: float | None  # None with a single round

    @classmethod
    def of(cls, dense_runs: list[float] | None, runs: list[float] | None) -> "SpeedupSpread | None":
        """From both rows' per-round decode times; ``None`` unless the rounds pair up."""
        if not dense_runs or not runs or len(dense_runs) != len(runs):
            return None
        ratios = [d / t for d, t in zip(dense_runs, runs)]
        stderr = statistics.stdev(ratios) / len(ratios) ** 0.5 if len(ratios) > 1 else None
        return cls(min(ratios), statistics.median(ratios), max(ratios), stderr)

    @classmethod
    def single(cls, value: float) -> "SpeedupSpread":
        """A speed-up without rounds to spread over (a prediction, a row of another run's dense): no range."""
        return cls(value, value, value, None)

    def within_noise(self) -> bool:
        """Whether the rounds disagree on the sign of the change (some faster than dense, some slower): the
        median speed-up is then noise, not a gain or a loss."""
        return self.min < 1.0 < self.max


def measured_speedup(dense_runs: list[float] | None, runs: list[float] | None, dense_s: float, this_s: float) -> SpeedupSpread:
    """The one rule for a measured speed-up over dense: the median (min, max) over the rounds of dense's time in a
    round over this row's in the same round, when the rounds pair up; else ``dense_s / this_s`` with no range.
    The times are of one phase (a decode step, or a whole generation) and one configuration."""
    return SpeedupSpread.of(dense_runs, runs) or SpeedupSpread.single(dense_s / this_s)


@dataclass
class SpeedRow:
    """One schedule's speed at one (tp, batch, prompt_len, decode_steps); see the module docstring."""

    schedule: str  # native (the checkpoint's own layout), dense, upper-bound, domino; predict: ladder, spd, layout
    layout: str  # the layout the schedule ran (``Layout.describe()``)
    tp: int
    batch: int
    prompt_len: int  # prompt tokens per sequence
    decode_steps: int  # decode steps per sequence, each one new token (the prefill yields one more)
    prefill_s: float | None  # the prefill step, whole batch; None in a legacy row that lacked it
    decode_s_per_token: float  # one decode step (one new token per sequence)
    allreduces_per_decode_step: int | None  # all-reduces one rank issues per decode step
    decode_speedup_vs_dense: float | None = None
    e2e_speedup_vs_dense: float | None = None

    DERIVED: ClassVar[tuple[str, ...]] = ("decode_tokens_per_s", "e2e_tokens_per_s")  # written, recomputed on reading

    @property
    def decode_tokens_per_s(self) -> float:
        return self.batch / self.decode_s_per_token

    @property
    def e2e_tokens_per_s(self) -> float | None:
        if self.prefill_s is None:
            return None
        return e2e_tokens_per_s(self.batch, self.decode_steps, self.prefill_s, self.decode_s_per_token)

    def config(self) -> tuple[int, int, int, int]:
        """What must match for two rows to be compared: ``(tp, batch, prompt_len, decode_steps)``."""
        return self.tp, self.batch, self.prompt_len, self.decode_steps

    def speedups_against(self, dense: "SpeedRow") -> tuple[float, float | None]:
        """(decode, end-to-end) speed-up of this row over ``dense``: decode time over decode time, e2e over e2e."""
        if dense.config() != self.config():
            raise ValueError(f"cannot compare {self.config()} with {dense.config()}")
        decode = dense.decode_s_per_token / self.decode_s_per_token
        mine, theirs = self.e2e_tokens_per_s, dense.e2e_tokens_per_s
        return decode, (mine / theirs if mine is not None and theirs is not None else None)

    def compare_with(self, dense: "SpeedRow | None") -> None:
        """Set both speed-ups against ``dense`` (``None``: no dense row to compare with, no speed-up)."""
        if dense is None:
            self.decode_speedup_vs_dense = self.e2e_speedup_vs_dense = None
        else:
            self.decode_speedup_vs_dense, self.e2e_speedup_vs_dense = self.speedups_against(dense)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            out[f.name] = getattr(self, f.name)
            if f.name == "decode_s_per_token":  # the derived rates, beside the times they come from
                out.update(decode_tokens_per_s=self.decode_tokens_per_s, e2e_tokens_per_s=self.e2e_tokens_per_s)
        return out

    @classmethod
    def from_json(cls: type[R], data: dict[str, Any], where: str = "row") -> R:
        """The row of ``to_json``; an unknown or missing field is a one-line ``LadderizeError``."""
        if not isinstance(data, dict):
            raise LadderizeError(f"{where}: a row must be a JSON object")
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names - set(cls.DERIVED))
        if unknown:
            raise LadderizeError(f"{where}: unknown field(s) {', '.join(unknown)} in a {cls.__name__}")
        required = [f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING]
        missing = [name for name in required if name not in data]
        if missing:
            raise LadderizeError(f"{where}: {cls.__name__} lacks {', '.join(missing)}")
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass
class BenchRow(SpeedRow):
    """A row measured by ``ladderize bench``: medians over the timed rounds, and their spread.

    Its ``decode_speedup_vs_dense`` and ``e2e_speedup_vs_dense`` follow ``measured_speedup`` (the median over the
    rounds), with ``decode_speedup_vs_dense_{min,median,max,stderr}`` and ``e2e_speedup_vs_dense_{min,max}``
    beside them; ``decode_speedup()`` and ``e2e_speedup()`` read them back for every display."""

    comm: str | None = None  # what carried the all-reduces: shm, gloo, nccl
    decode_allreduce_share: float | None = None  # share of decode time the ranks spent blocked in all-reduces
    decode_issue_s_per_token: float | None = None  # per decode step, one rank: host time issuing all-reduces
    decode_wait_s_per_token: float | None = None  # per decode step, one rank: host time waiting for in-flight ones
    decode_gap_closed: float | None = None  # (dense - this) / (dense - upper-bound), in decode time per token
    overlapped_allreduces_per_decode_step: int | None = None
    domino_chunks: int | None = None
    decode_s_per_token_runs: list[float] = field(default_factory=list)  # one per timed round
    prefill_s_runs: list[float] = field(default_factory=list)  # one per timed round, beside the decode times
    decode_s_per_token_min: float | None = None
    decode_s_per_token_median: float | None = None
    decode_s_per_token_max: float | None = None
    decode_tokens_per_s_min: float | None = None
    decode_tokens_per_s_max: float | None = None
    decode_speedup_vs_dense_min: float | None = None
    decode_speedup_vs_dense_median: float | None = None
    decode_speedup_vs_dense_max: float | None = None
    decode_speedup_vs_dense_stderr: float | None = None
    e2e_speedup_vs_dense_min: float | None = None
    e2e_speedup_vs_dense_max: float | None = None

    def set_decode_runs(self, runs_s_per_token: list[float], prefill_runs_s: list[float] | None = None) -> None:
        """Record the per-round decode times per token and their min, median and max (and the rates they give), and
        the per-round prefill times when given."""
        low, high = min(runs_s_per_token), max(runs_s_per_token)
        self.decode_s_per_token_runs = list(runs_s_per_token)
        self.decode_s_per_token_min, self.decode_s_per_token_max = low, high
        self.decode_s_per_token_median = statistics.median(runs_s_per_token)
        self.decode_tokens_per_s_min, self.decode_tokens_per_s_max = self.batch / high, self.batch / low
        if prefill_runs_s is not None:
            self.prefill_s_runs = list(prefill_runs_s)

    def generation_s(self) -> float | None:
        """The median round's whole generation: the prefill and every decode step (None without a prefill time)."""
        return None if self.prefill_s is None else self.prefill_s + self.decode_steps * self.decode_s_per_token

    def generation_s_runs(self) -> list[float]:
        """Each round's whole generation, where the rounds hold both phases."""
        if len(self.prefill_s_runs) != len(self.decode_s_per_token_runs):
            return []
        return [p + self.decode_steps * d for p, d in zip(self.prefill_s_runs, self.decode_s_per_token_runs)]

    def compare_with(self, dense: "SpeedRow | None") -> None:
        """Both speed-ups against ``dense`` by ``measured_speedup`` (round by round when the rounds pair up), with
        their range; ``None``: no dense row, no speed-up. End to end, the time of a whole generation: the same
        tokens in both, so its inverse ratio is that of ``e2e_tokens_per_s``."""
        for name in ("decode_speedup_vs_dense", "e2e_speedup_vs_dense"):
            for suffix in ("", "_min", "_max") + (("_median", "_stderr") if name.startswith("decode") else ()):
                setattr(self, name + suffix, None)
        if dense is None:
            return
        if dense.config() != self.config():
            raise ValueError(f"cannot compare {self.config()} with {dense.config()}")
        measured = isinstance(dense, BenchRow)
        decode = measured_speedup(dense.decode_s_per_token_runs if measured else None, self.decode_s_per_token_runs,
                                  dense.decode_s_per_token, self.decode_s_per_token)
        self.decode_speedup_vs_dense = decode.median
        self.decode_speedup_vs_dense_min, self.decode_speedup_vs_dense_median = decode.min, decode.median
        self.decode_speedup_vs_dense_max, self.decode_speedup_vs_dense_stderr = decode.max, decode.stderr
        dense_s = dense.generation_s() if measured else None
        if dense_s is None or self.generation_s() is None:
            return
        e2e = measured_speedup(dense.generation_s_runs(), self.generation_s_runs(), dense_s, self.generation_s())
        self.e2e_speedup_vs_dense, self.e2e_speedup_vs_dense_min, self.e2e_speedup_vs_dense_max = e2e.median, e2e.min, e2e.max

    def decode_speedup(self) -> SpeedupSpread | None:
        """The decode speed-up every display shows (bench's table, the report, its plot, the demo): the median over the
        rounds with its range when this row has them, else ``decode_speedup_vs_dense`` alone."""
        low, high = self.decode_speedup_vs_dense_min, self.decode_speedup_vs_dense_max
        median = self.decode_speedup_vs_dense_median
        if median is None:
            median = self.decode_speedup_vs_dense
        if median is None and low is not None and high is not None:
            median = (low + high) / 2
        if median is None:
            return None
        if low is None or high is None:
            return SpeedupSpread.single(median)
        return SpeedupSpread(low, median, high, self.decode_speedup_vs_dense_stderr)

    def e2e_speedup(self) -> SpeedupSpread | None:
        """The end-to-end speed-up as shown: ``e2e_speedup_vs_dense`` (the rounds' median) with its range when known."""
        value = self.e2e_speedup_vs_dense
        if value is None:
            return None
        low, high = self.e2e_speedup_vs_dense_min, self.e2e_speedup_vs_dense_max
        return SpeedupSpread.single(value) if low is None or high is None else SpeedupSpread(low, value, high, None)


@dataclass
class PredictRow(SpeedRow):
    """A row priced by ``ladderize predict`` (a model of a GPU node, not a measurement)."""

    prefill_exposed_comm_s: float | None = None  # all-reduce time compute did not hide, in the prefill step
    decode_exposed_comm_s_per_token: float | None = None  # the same, per decode step
    prefill_speedup_vs_dense: float | None = None  # dense prefill_s / this prefill_s (same TP, batch)
    note: str = ""


def add_speedups(rows: list[SpeedRow]) -> None:
    """Set both speed-ups of every row against the ``dense`` row of its (tp, batch, lengths), when there is one
    (``compare_with``: measured rows by ``measured_speedup``). The rows are of one run (their rounds pair up)."""
    dense = {row.config(): row for row in rows if row.schedule == DENSE_SCHEDULE}
    for row in rows:
        row.compare_with(dense.get(row.config()))


# --- the files ----------------------------------------------------------------------------------


@dataclass
class BenchRecord:
    """``ladderize bench --json``: rows measured on the bundled TP runtime, and how they were measured."""

    model: str  # checkpoint path, or "synthetic:SHAPE"
    layout: str  # the model's own layout (what the native schedule runs)
    rows: list[BenchRow]
    meta: dict[str, Any] = field(default_factory=dict)  # device, dtype, comm, repeats, versions, time, ...
    annotations: dict[str, Any] = field(default_factory=dict)  # top-level keys a script added (summaries, commands)

    @property
    def checkpoint(self) -> str | None:
        return None if self.model.startswith("synthetic:") else self.model

    def load_note(self, where: str) -> str | None:
        """A note when other processes took the CPU while this bench ran, so that its speed figures are noise:
        ``BUSY_CORES`` or more cores busy elsewhere just before the run or during it (its meta's
        ``busy_cores_elsewhere``), or, in a record without those, the 1-minute load average above the CPU cores.
        ``where`` names the bench in the note."""
        busy = self.meta.get("busy_cores_elsewhere")
        cores = self.meta.get("cpu_cores")
        if isinstance(busy, dict) and any(finite(busy.get(k)) is not None for k in ("before", "during")):
            before, during = finite(busy.get("before")), finite(busy.get("during"))
            if max(v for v in (before, during) if v is not None) < BUSY_CORES:
                return None
            of = f" of the {cores}" if isinstance(cores, int) and cores > 0 else ""
            if during is None:
                when = f"{before:.1f}{of} CPU cores busy just before it"
            else:
                when = f"{during:.1f}{of} CPU cores busy during the run" + (
                    "" if before is None else f" ({before:.1f} just before it)")
            return f"{where} was measured while other processes kept {when}, so its speed figures are noise"
        try:
            load, cores = float((self.meta.get("load_average") or [0.0])[0]), int(cores or 0)
        except (ValueError, TypeError, IndexError):
            return None
        if not cores or load <= cores:
            return None
        return f"{where} was measured at load average {load:.1f} on {cores} CPU cores, so its speed figures are noise"

    def to_json(self) -> dict[str, Any]:
        return {"record": BENCH_RECORD, "version": RECORD_VERSION, "model": self.model, "layout": self.layout,
                "meta": self.meta, "rows": [row.to_json() for row in self.rows], **self.annotations}

    @classmethod
    def from_json(cls, data: dict[str, Any], where: str = "bench record") -> "BenchRecord":
        _check_header(data, BENCH_RECORD, where)
        rows = _row_list(data, where)
        known = ("record", "version", "model", "layout", "meta", "rows")
        return cls(str(_need(data, "model", where)), str(_need(data, "layout", where)),
                   [BenchRow.from_json(r, f"{where} row {i}") for i, r in enumerate(rows)],
                   dict(data.get("meta") or {}), {k: v for k, v in data.items() if k not in known})


@dataclass
class PredictRecord:
    """``ladderize predict --json``: predicted rows, and the model shape, profiles and module timings used."""

    model: dict[str, Any]  # ``ModelShape.to_dict()``
    interconnect: dict[str, Any]
    compute: dict[str, Any]  # label, device, on_gpu
    prompt_len: int
    decode_steps: int
    decode_kv_len: int  # keys per decode step at which decode is priced (the mean over the generation)
    domino_chunks: int
    layout: dict[str, Any] | None
    schedules: dict[str, str]  # schedule -> what it means
    rows: list[PredictRow]
    module_timings: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        out = {"record": PREDICT_RECORD, "version": RECORD_VERSION}
        for f in fields(self):
            out[f.name] = getattr(self, f.name)
        out["rows"] = [row.to_json() for row in self.rows]
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any], where: str = "predict record") -> "PredictRecord":
        _check_header(data, PREDICT_RECORD, where)
        values = {f.name: _need(data, f.name, where) for f in fields(cls) if f.name not in ("rows", "module_timings")}
        rows = [PredictRow.from_json(r, f"{where} row {i}") for i, r in enumerate(_row_list(data, where))]
        return cls(**values, rows=rows, module_timings=list(data.get("module_timings") or []))


@dataclass
class EvalRecord:
    """``ladderize eval --json``: lm-eval's results dict, unchanged, with the checkpoint's layout."""

    checkpoint: str
    layout: str  # ``Layout.describe()``
    layout_ranges: dict[str, Any]
    num_layers: int | None
    layers_converted: int | None
    allreduces_per_decode_step: int | None  # per forward pass under TP (one decode step)
    overlappable_allreduces_per_decode_step: int | None  # of those, the ones the layout lets overlap the next module
    history: list[str]  # the checkpoint's provenance steps (convert, adapt, ...)
    results: dict[str, Any]  # lm-eval's, unchanged
    lm_eval: dict[str, Any] = field(default_factory=dict)  # version, n-shot, higher_is_better, bootstrap_iters, ...
    tasks: list[Any] = field(default_factory=list)
    limit: float | dict[str, Any] | None = None  # lm-eval's --limit (per task when the tasks ran apart)
    batch_size: int | str | None = None  # lm-eval's: an int, or auto / auto:N
    max_length: int | None = None
    device: str | None = None  # the device the model ran on (each process's, under data parallelism)
    dtype: str | None = None  # the model's dtype (the checkpoint's own unless --dtype said otherwise)
    processes: int | None = None  # data-parallel processes (HF under a launcher) or vLLM replicas that split the requests
    backend: str = "hf"  # lm-eval's model type: hf (HFLM) or vllm (lm-eval's VLLM with ladderize's plugin)
    tensor_parallel_size: int = 1  # vLLM's ranks per model (--tp)
    parallelize: bool = False  # HFLM's device map: one model over this node's GPUs
    data: dict[str, Any] = field(default_factory=dict)
    eval_s: float | None = None
    ladderize_version: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"record": EVAL_RECORD, "version": RECORD_VERSION, **{f.name: getattr(self, f.name) for f in fields(self)}}

    @classmethod
    def from_json(cls, data: dict[str, Any], where: str = "eval record") -> "EvalRecord":
        _check_header(data, EVAL_RECORD, where)
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names - {"record", "version"})
        if unknown:
            raise LadderizeError(f"{where}: unknown field(s) {', '.join(unknown)} in an eval record")
        required = [f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING]
        for name in required:
            _need(data, name, where)
        return cls(**{k: v for k, v in data.items() if k in names})


Record = Union[BenchRecord, PredictRecord, EvalRecord]
_TYPES: dict[str, Any] = {BENCH_RECORD: BenchRecord, PREDICT_RECORD: PredictRecord, EVAL_RECORD: EvalRecord}


def read_record(data: Any, where: str = "record") -> Record:
    """A bench, predict or eval record from its JSON (files from before these records through ``read_legacy``)."""
    if isinstance(data, dict) and "record" in data:
        kind = data["record"]
        if kind not in _TYPES:
            raise LadderizeError(f"{where}: unknown record kind {kind!r}; known: {', '.join(_TYPES)}")
        return _TYPES[kind].from_json(data, where)
    return read_legacy(data, where)


def load_record(path: Path | str) -> Record:
    """Read a record file; bad JSON or an unknown format is a one-line ``LadderizeError``."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise LadderizeError(f"{path} is not valid JSON: {exc}") from None
    except OSError as exc:
        raise LadderizeError(f"cannot read {path}: {exc.strerror or exc}") from None
    return read_record(data, str(path))


def _check_header(data: Any, kind: str, where: str) -> None:
    if not isinstance(data, dict) or data.get("record") != kind:
        raise LadderizeError(f"{where} is not a {kind} record")
    if data.get("version") != RECORD_VERSION:
        raise LadderizeError(
            f"{where} is a {kind} record of version {data.get('version')!r}; this ladderize reads version {RECORD_VERSION}"
        )


def _need(data: dict[str, Any], name: str, where: str) -> Any:
    if name not in data:
        raise LadderizeError(f"{where} lacks {name!r}")
    return data[name]


def _row_list(data: dict[str, Any], where: str) -> list[Any]:
    rows = data.get("rows")
    if not isinstance(rows, list):
        raise LadderizeError(f"{where} has no 'rows' list")
    return rows


# --- files from before these records -------------------------------------------------------------

# Old bench row name -> record name (old bench rates were decode rates). The old ``tokens_per_s``
# (batch / decode_s_per_token) is derived from the decode time, so it is dropped.
_LEGACY_BENCH = {
    "gen_len": "decode_steps", "allreduce_count": "allreduces_per_decode_step",
    "speedup_vs_dense": "decode_speedup_vs_dense", "allreduce_share": "decode_allreduce_share",
    "issue_s_per_token": "decode_issue_s_per_token", "wait_s_per_token": "decode_wait_s_per_token",
    "gap_closed": "decode_gap_closed", "overlapped_allreduces": "overlapped_allreduces_per_decode_step",
    "speedup_vs_dense_min": "decode_speedup_vs_dense_min", "speedup_vs_dense_median": "decode_speedup_vs_dense_median",
    "speedup_vs_dense_max": "decode_speedup_vs_dense_max", "speedup_vs_dense_stderr": "decode_speedup_vs_dense_stderr",
    "tokens_per_s_min": "decode_tokens_per_s_min", "tokens_per_s_max": "decode_tokens_per_s_max",
}
_LEGACY_BENCH_KEPT = ("schedule", "layout", "tp", "batch", "prompt_len", "prefill_s", "decode_s_per_token", "comm",
                      "domino_chunks", "decode_s_per_token_runs", "decode_s_per_token_min", "decode_s_per_token_median",
                      "decode_s_per_token_max")


def read_legacy(data: Any, where: str = "record") -> Record:
    """A file written before these records (version 1), by its kind: eval, predict or bench."""
    if isinstance(data, dict) and data.get("kind") == EVAL_RECORD:
        return _legacy_eval(data)
    if isinstance(data, dict) and "interconnect" in data and "module_timings" in data:
        return _legacy_predict(data, where)
    if isinstance(data, dict) and isinstance(data.get("rows"), list) and data["rows"] and all(
        isinstance(r, dict) and "schedule" in r and ("tokens_per_s" in r or "decode_s_per_token" in r) for r in data["rows"]
    ):
        return _legacy_bench(data, where)
    raise LadderizeError(f"{where} is neither an eval record (ladderize eval --json) nor a bench or predict record")


def _legacy_eval(data: dict[str, Any]) -> EvalRecord:
    allreduces = data.get("allreduces_per_token") or {}
    if not isinstance(allreduces, dict):
        allreduces = {"total": allreduces, "overlappable": 0}
    return EvalRecord(
        checkpoint=str(data.get("checkpoint") or ""), layout=str(data.get("layout") or "unknown"),
        layout_ranges=dict(data.get("layout_ranges") or {}), num_layers=data.get("num_layers"),
        layers_converted=data.get("layers_converted"), allreduces_per_decode_step=allreduces.get("total"),
        overlappable_allreduces_per_decode_step=allreduces.get("overlappable"),
        history=list(data.get("history") or []), results=dict(data.get("results") or {}), lm_eval=dict(data.get("lm_eval") or {}),
        tasks=list(data.get("tasks") or []), limit=data.get("limit"), batch_size=data.get("batch_size"),
        max_length=data.get("max_length"), data=dict(data.get("data") or {}), eval_s=data.get("eval_s"),
        ladderize_version=data.get("ladderize_version"),
    )  # fmt: skip


def _legacy_bench(data: dict[str, Any], where: str) -> BenchRecord:
    meta = dict(data.get("meta") or {})
    rows = []
    for index, old in enumerate(data["rows"]):
        values = {k: old[k] for k in _LEGACY_BENCH_KEPT if k in old}
        values.update({new: old[k] for k, new in _LEGACY_BENCH.items() if k in old})
        if "decode_s_per_token" not in values:  # the old tokens_per_s was decode-only: batch / decode_s_per_token
            values["decode_s_per_token"] = old["batch"] / old["tokens_per_s"]
        values.setdefault("layout", "")
        values.setdefault("prefill_s", None)
        values.setdefault("allreduces_per_decode_step", None)
        rows.append(BenchRow.from_json(values, f"{where} row {index} (legacy bench)"))
    model = data.get("checkpoint") or meta.get("model") or "unknown"
    layout = meta.get("layout") or next((r.layout for r in rows if r.schedule == "native" and r.layout), "unknown")
    meta.pop("model", None)
    meta.pop("layout", None)
    annotations = {k: v for k, v in data.items() if k not in ("meta", "rows", "checkpoint")}
    return BenchRecord(str(model), str(layout), rows, meta, annotations)


def _legacy_predict(data: dict[str, Any], where: str) -> PredictRecord:
    decode_steps = int(data["new_tokens"]) - 1
    rows = []
    for index, old in enumerate(data.get("rows") or []):
        rows.append(PredictRow(
            schedule=old["schedule"], layout=old["layout"], tp=old["tp"], batch=old["batch"],
            prompt_len=data["prompt_tokens"], decode_steps=decode_steps, prefill_s=old["prefill_s"],
            decode_s_per_token=old["decode_s_per_token"], allreduces_per_decode_step=old["decode_allreduces_per_step"],
            e2e_speedup_vs_dense=old["speedup_vs_dense"],  # the old predict speed-up was end-to-end
            prefill_exposed_comm_s=old.get("prefill_exposed_comm_s"),
            decode_exposed_comm_s_per_token=old.get("decode_exposed_comm_s"), note=old.get("note", ""),
        ))  # fmt: skip
    dense = {r.config(): r for r in rows if r.schedule == DENSE_SCHEDULE}
    for row in rows:  # the decode speed-up was not written: derive it from the decode times
        if row.config() in dense:
            row.decode_speedup_vs_dense = row.speedups_against(dense[row.config()])[0]
    return PredictRecord(
        model=data["model"], interconnect=data["interconnect"], compute=data.get("compute") or {},
        prompt_len=data["prompt_tokens"], decode_steps=decode_steps, decode_kv_len=data.get("decode_kv_len"),
        domino_chunks=data.get("domino_chunks"), layout=data.get("layout"), schedules=data.get("schedules") or {},
        rows=rows, module_timings=list(data.get("module_timings") or []),
    )  # fmt: skip


def finite(value: Any) -> float | None:
    """``value`` as a float when it is a finite number (not a bool), else ``None``."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


__all__ = [
    "BUSY_CORES",
    "BENCH_RECORD",
    "DENSE_SCHEDULE",
    "EVAL_RECORD",
    "SENSITIVITY_RECORD",
    "PREDICT_RECORD",
    "RECORD_VERSION",
    "BenchRecord",
    "BenchRow",
    "EvalRecord",
    "PredictRecord",
    "PredictRow",
    "Record",
    "SpeedRow",
    "SpeedupSpread",
    "add_speedups",
    "measured_speedup",
    "e2e_tokens_per_s",
    "finite",
    "load_record",
    "read_legacy",
    "read_record",
]
