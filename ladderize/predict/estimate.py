"""``ladderize predict``: per (TP degree, batch, schedule) latency and throughput from module costs.

For every TP degree and batch size it prices one rank's modules (``compute``), the all-reduces that end
them (``interconnect``), and simulates the prefill step and an average decode step under each schedule
(``schedule``). Returned values only; the CLI prints.

Conventions (those of the Ladder authors' gpt-fast benchmark, so that the calibration is like for like):

* prefill runs the whole prompt and yields the first new token; then ``new_tokens - 1`` decode steps
  (the rows' ``decode_steps``); rows are ``ladderize.records.PredictRow``: ``e2e_tokens_per_s =
  batch * new_tokens / (prefill_s + (new_tokens - 1) * decode_s_per_token)`` and ``decode_tokens_per_s =
  batch / decode_s_per_token``, and each speed-up compares one phase with the same phase of ``dense``;
* a decode step is priced at the mean KV length over the generation, ``prompt + new_tokens / 2``
  (attention cost is linear in the KV length, so the mean step has the mean cost);
* activations and all-reduces are bf16; the LM head is replicated on every rank and applied to the
  last position only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from ..errors import LadderizeError
from ..model.layout import LayerMode, Layout, LayoutError, check_tp_divides, kv_heads_per_rank, mode_flags
from ..records import PredictRecord, PredictRow, add_speedups
from .compute import ComputeModel
from .work import ModuleWork, module_work
from .interconnect import InterconnectProfile
from .presets import ModelShape
from .simulate import ModuleCost, StepTiming, simulate_step

# The schedules that are not one mode on every layer (each mode's whole-model what-if comes from the table).
OTHER_SCENARIOS = {
    "domino": "dense model, batch (or prompt) split into chunks whose all-reduces overlap the next chunk",
    "upper-bound": "no communication at all",
    "layout": f"the given layout (--layout, or {mode_flags()} ranges)",
}


def scenario_names() -> tuple[str, ...]:
    """Predict's schedules in order: every mode of the table on every layer (``dense``, ``ladder``, ``spd``: its
    what-if), then ``domino``, ``upper-bound`` and ``layout``."""
    return (*(mode.value for mode in LayerMode), *OTHER_SCENARIOS)


def scenario_help(name: str) -> str:
    """A schedule in words: a mode's what-if (``ModeTraits.what_if``), or ``OTHER_SCENARIOS``'s."""
    return OTHER_SCENARIOS[name] if name in OTHER_SCENARIOS else LayerMode(name).what_if


@dataclass(frozen=True)
class PredictRequest:
    model: ModelShape
    tps: tuple[int, ...]
    batches: tuple[int, ...]
    prompt_tokens: int
    new_tokens: int
    interconnect: InterconnectProfile
    layout: Layout | None = None
    schedules: tuple[str, ...] = field(default_factory=scenario_names)
    domino_chunks: int = 2

    def validate(self) -> None:
        if not self.tps or not self.batches:
            raise LadderizeError("give at least one TP degree and one batch size")
        if min(self.tps) < 1 or min(self.batches) < 1:
            raise LadderizeError("TP degrees and batch sizes must be positive")
        if self.prompt_tokens < 1 or self.new_tokens < 1:
            raise LadderizeError("--prompt and --gen must be at least 1 token")
        if self.domino_chunks < 1:
            raise LadderizeError("--domino-chunks must be at least 1")
        unknown = [s for s in self.schedules if s not in scenario_names()]
        if unknown:
            raise LadderizeError(f"unknown schedule(s) {', '.join(unknown)}: choose from {', '.join(scenario_names())}")
        if self.layout is not None and self.layout.num_layers != self.model.num_hidden_layers:
            raise LayoutError(
                f"the layout has {self.layout.num_layers} layers but {self.model.name} has {self.model.num_hidden_layers}"
            )
        for tp in self.tps:
            check_tp_divides(  # KV heads replicate when tp exceeds them, as in the runtime
                tp, self.model.num_attention_heads, self.model.num_key_value_heads, self.model.intermediate_size,
                replicate_kv=True,
            )


@dataclass
class Prediction:
    request: PredictRequest
    compute_label: str
    compute_device: str
    compute_on_gpu: bool
    rows: list[PredictRow] = field(default_factory=list)
    module_timings: list[dict[str, Any]] = field(default_factory=list)

    def to_record(self) -> PredictRecord:
        """The ``ladderize predict --json`` record."""
        r = self.request
        layout = None
        if r.layout is not None:
            layout = {"describe": r.layout.describe(), **r.layout.ranges(), "spd_tp_size": r.layout.spd_tp_size}
        return PredictRecord(
            model=r.model.to_dict(), interconnect=r.interconnect.to_dict(),
            compute={"label": self.compute_label, "device": self.compute_device, "on_gpu": self.compute_on_gpu},
            prompt_len=r.prompt_tokens, decode_steps=r.new_tokens - 1,
            decode_kv_len=decode_kv_len(r.prompt_tokens, r.new_tokens), domino_chunks=r.domino_chunks, layout=layout,
            schedules={s: scenario_help(s) for s in r.schedules}, rows=list(self.rows),
            module_timings=self.module_timings,
        )  # fmt: skip


def decode_kv_len(prompt_tokens: int, new_tokens: int) -> int:
    """Mean keys per decode step over a generation of ``new_tokens`` after a ``prompt_tokens`` prompt."""
    return prompt_tokens + max(1, round(new_tokens / 2))


def rank_memory_bytes(model: ModelShape, tp: int, batch: int, context_tokens: int) -> float:
    """One rank's weights (replicated embedding and LM head included) plus its KV cache, in bytes."""
    d, hd = model.hidden_size, model.head_dim
    heads, kv_heads = model.num_attention_heads // tp, kv_heads_per_rank(tp, model.num_key_value_heads)
    layer = d * (heads + 2 * kv_heads) * hd + heads * hd * d + 3 * d * model.intermediate_size // tp
    weights = model.num_hidden_layers * layer + 2 * model.vocab_size * d
    kv_cache = model.num_hidden_layers * batch * context_tokens * 2 * kv_heads * hd
    return model.dtype_bytes * (weights + kv_cache)


@dataclass(frozen=True)
class _PhaseCosts:
    attention: ModuleCost
    mlp: ModuleCost
    head_s: float
    overlap_slowdown: float  # how much this phase's all-reduce slows the compute it overlaps


class _Pricer:
    """Prices modules and all-reduces for one request, recording every module timing once."""

    def __init__(self, request: PredictRequest, compute: ComputeModel):
        self.request = request
        self.compute = compute
        self.records: dict[tuple, dict[str, Any]] = {}

    def _module_s(self, phase: str, tp: int, work: ModuleWork) -> float:
        seconds = self.compute.module_s(work)
        key = (phase, tp, work.key())
        if key not in self.records:
            self.records[key] = {
                "phase": phase, "kind": work.kind, "tp": tp, "batch": work.batch, "q_len": work.q_len,
                "kv_len": work.kv_len, "seconds": seconds, "source": self.compute.source(work),
            }
        return seconds

    def phase(self, phase: str, tp: int, batch: int, q_len: int, kv_len: int, chunks: int = 1) -> _PhaseCosts:
        """Per-chunk module costs; ``chunks`` > 1 prices one of that many chunks (no head: it runs once)."""
        m = self.request.model
        ar_bytes = batch * q_len * m.hidden_size * m.dtype_bytes
        allreduce_s = self.request.interconnect.allreduce_s(ar_bytes, tp)
        costs = {}
        for kind in ("attention", "mlp"):
            work = module_work(m, kind, tp, batch, q_len, kv_len)
            costs[kind] = ModuleCost(self._module_s(phase, tp, work), allreduce_s)
        head_s = 0.0 if chunks > 1 else self._module_s(phase, tp, module_work(m, "head", tp, batch, 1, 0))
        slowdown = self.request.interconnect.overlap_slowdown_for(
            ar_bytes, tp, memory_bound=phase == "decode", one_wave_gemms=self.compute.one_wave_gemms)
        return _PhaseCosts(costs["attention"], costs["mlp"], head_s, slowdown)


def _domino_split(batch: int, q_len: int, kv_len: int, chunks: int) -> tuple[int, int, int, str] | None:
    """Chunk shape (batch, q_len, kv_len) and what was split, or None when nothing can be split."""
    if chunks <= 1:
        return None
    if batch % chunks == 0:
        return batch // chunks, q_len, kv_len, "batch"
    if q_len >= chunks and q_len == kv_len:
        # Sequence chunks of a causal prompt: chunk i attends over i/n of it; price the mean chunk.
        return batch, q_len // chunks, round(kv_len * (chunks + 1) / (2 * chunks)), "prompt"
    return None


def _modes_of(request: PredictRequest) -> dict[str, tuple[LayerMode, ...]]:
    """The per-layer modes each schedule runs: whole-model what-ifs, plus the given layout."""
    layers = request.model.num_hidden_layers
    modes = {mode.value: (mode,) * layers for mode in LayerMode}  # each mode's what-if: every layer that mode
    dense = LayerMode.with_traits(converted=False)
    modes |= {"domino": (dense,) * layers, "upper-bound": (dense,) * layers}
    if request.layout is not None:
        modes["layout"] = request.layout.modes
    return modes


def _simulate_schedule(
    request: PredictRequest, pricer: _Pricer, schedule: str, modes: Sequence[LayerMode], tp: int, batch: int,
    shapes: dict[str, tuple[int, int]], costs: dict[str, _PhaseCosts],
) -> tuple[dict[str, StepTiming], str]:
    """Prefill and decode timings of one schedule, and a note when something needs saying."""
    timings: dict[str, StepTiming] = {}
    note = ""
    for phase, (q_len, kv_len) in shapes.items():
        cost, chunks = costs[phase], 1
        if schedule == "domino" and tp > 1:  # at TP 1 nothing communicates: domino is the dense path
            split = _domino_split(batch, q_len, kv_len, request.domino_chunks)
            if split is not None:
                chunks = request.domino_chunks
                chunk = pricer.phase(phase, tp, *split[:3], chunks=chunks)
                cost = _PhaseCosts(chunk.attention, chunk.mlp, cost.head_s, chunk.overlap_slowdown)
            elif phase == "decode":
                note = f"batch {batch} does not split into {request.domino_chunks} chunks: decode as dense"
        timings[phase] = simulate_step(
            modes, cost.attention, cost.mlp, head_s=cost.head_s, overlap_slowdown=cost.overlap_slowdown,
            chunks=chunks, communicate=schedule != "upper-bound" and tp > 1,
        )
    layout = request.layout
    if schedule == "layout" and layout is not None and layout.tp_dependent_layers and layout.spd_tp_size != tp:
        note = (f"SPD layers were converted for TP={layout.spd_tp_size}; at TP={tp} their outputs differ "
                "(speed is still as shown)")
    return timings, note


UPPER_BOUND_SLACK = 1.01  # a schedule faster than the no-communication bound by more than this is noise


def check_upper_bound(results: dict[str, tuple[dict[str, StepTiming], str]], bound: dict[str, StepTiming], tp: int,
                      batch: int, label: str, cache: str = "") -> None:
    """Refuse a row that beats the no-communication upper bound of its own (TP, batch): no schedule can, so the
    module timings behind it are noise (a loaded CPU timing chunked and whole modules apart)."""
    for schedule, (timings, _) in results.items():
        for phase in ("prefill", "decode"):
            if timings[phase].total_s * UPPER_BOUND_SLACK < bound[phase].total_s:
                ratio = bound[phase].total_s / timings[phase].total_s
                raise LadderizeError(
                    f"{schedule} {phase} at TP {tp}, batch {batch} comes out {ratio:.2f}x faster than the "
                    f"no-communication upper bound: the module timings ({label}) are noise; rerun on an idle machine"
                    + (f" with another --cache-dir (timings are kept in {cache})" if cache else "")
                    + " or leave --compute out"
                )


def predict(request: PredictRequest, compute: ComputeModel) -> Prediction:
    """Price every (TP, batch, schedule) of ``request`` with ``compute`` and the request's interconnect."""
    request.validate()
    modes_of = _modes_of(request)
    schedules = [s for s in request.schedules if s in modes_of]
    if "dense" not in schedules:
        schedules.insert(0, "dense")  # speed-ups are relative to it
    pricer = _Pricer(request, compute)
    prediction = Prediction(request, compute.label, compute.device_name, compute.is_gpu)
    prompt, gen = request.prompt_tokens, request.new_tokens
    shapes = {"prefill": (prompt, prompt), "decode": (1, decode_kv_len(prompt, gen))}

    for tp in request.tps:
        for batch in request.batches:
            costs = {phase: pricer.phase(phase, tp, batch, q, kv) for phase, (q, kv) in shapes.items()}
            results = {
                s: _simulate_schedule(request, pricer, s, modes_of[s], tp, batch, shapes, costs) for s in schedules
            }
            fit_note = ""
            needed = rank_memory_bytes(request.model, tp, batch, prompt + gen)
            if compute.memory_bytes and needed > compute.memory_bytes:
                fit_note = (f"needs {needed / 1e9:.0f} GB per rank (weights + KV cache), more than the "
                            f"{compute.memory_bytes / 1e9:.0f} GB of {compute.device_name}")
            bound = results.get("upper-bound") or _simulate_schedule(
                request, pricer, "upper-bound", modes_of["upper-bound"], tp, batch, shapes, costs)
            check_upper_bound(results, bound[0], tp, batch, compute.label, str(getattr(compute, "cache_path", "") or ""))
            dense_timings = results["dense"][0]
            rows = []
            for schedule in schedules:
                timings, note = results[schedule]
                if schedule == "domino" and not note and timings["decode"].total_s > dense_timings["decode"].total_s:
                    note = "each decode chunk re-reads the weights, so chunked decode is slower than dense"
                prefill, decode = timings["prefill"], timings["decode"]
                rows.append(
                    PredictRow(
                        schedule=schedule,
                        layout=request.layout.describe() if schedule == "layout" and request.layout else schedule,
                        tp=tp, batch=batch, prompt_len=prompt, decode_steps=gen - 1,
                        prefill_s=prefill.total_s, decode_s_per_token=decode.total_s,
                        allreduces_per_decode_step=decode.num_allreduces,
                        prefill_exposed_comm_s=prefill.exposed_comm_s, decode_exposed_comm_s_per_token=decode.exposed_comm_s,
                        note="; ".join(n for n in (fit_note, note) if n),
                    )
                )
            add_speedups(rows)
            for row in rows:
                row.prefill_speedup_vs_dense = dense_timings["prefill"].total_s / row.prefill_s
            prediction.rows += rows
    prediction.module_timings = list(pricer.records.values())
    return prediction


def layout_from_checkpoint(path: Path | str) -> tuple[Layout, ModelShape]:
    """The layout and shape stored in a checkpoint's config.json (through the one config reader, ``load_config``)."""
    from ..checkpoint.io import load_config

    folder = Path(path).expanduser()
    if folder.is_file():
        folder = folder.parent
    if not (folder / "config.json").is_file():
        raise LadderizeError(f"--layout {path}: no config.json in {folder}")
    try:
        config = load_config(folder)
    except LadderizeError as exc:
        raise LadderizeError(f"--layout {path}: cannot load its config: {exc}") from None
    return config.layout, ModelShape.from_config(config, folder.name)


def select_scenarios(text: str | None, has_layout: bool) -> tuple[str, ...]:
    if not text:
        return tuple(s for s in scenario_names() if s != "layout" or has_layout)
    chosen = tuple(s.strip() for s in text.split(",") if s.strip())
    if "layout" in chosen and not has_layout:
        raise LadderizeError(f"schedule 'layout' needs --layout or {mode_flags()}")
    return chosen


def rows_for(prediction: Prediction, schedules: Sequence[str] | None = None) -> list[PredictRow]:
    return [r for r in prediction.rows if schedules is None or r.schedule in schedules]
