"""Benchmarks of the runtime: prefill and decode timings per (schedule, tp, batch), as ``BenchRow`` records.

Each configuration runs ``warmup`` untimed passes (with 0, still one untimed prefill and decode step,
so that one-time costs stay out of the first schedule's timing), then ``repeats`` timed passes of one
prefill (``prompt_len`` tokens per row) followed by ``gen_len`` decode steps; the row
reports medians. The schedules of one batch size run in interleaved rounds (one pass of
each per round), so that load changes on a shared machine hit them alike.
The row's names are those of ``ladderize.records`` (each says its phase and unit):
``decode_s_per_token`` is the time of one decode step (one new token per row), and
``decode_tokens_per_s`` and ``e2e_tokens_per_s`` follow from it and ``prefill_s``.
``allreduces_per_decode_step`` is the number of all-reduces a rank issues per decode step, and
``decode_allreduce_share`` the share of decode time the ranks spent blocked in communication:
measured (host time inside all-reduce calls and waits, averaged over ranks) on CPU; on
CUDA, where those calls only enqueue work, it is estimated as ``1 - upper_bound/decode``.

Rows of the same (tp, batch) are compared with the ``dense`` schedule by ``records.measured_speedup``:
``decode_speedup_vs_dense`` is the median over the rounds of round i of dense's decode time over round i of
this schedule's (which ran next to it), with ``decode_speedup_vs_dense_{min,median,max,stderr}``;
``e2e_speedup_vs_dense`` (with ``_min`` and ``_max``) the same for whole generations; and
``decode_gap_closed = (dense - this) / (dense - upper_bound)`` in decode time per token.

The spread of the repeats: ``decode_s_per_token_{min,median,max}`` and ``decode_tokens_per_s_{min,max}``
beside the medians, and the per-round times ``decode_s_per_token_runs`` and ``prefill_s_runs``.

The machine's load is measured before the run and during it (``runtime.timing.LoadWatch``: CPU cores other
processes kept busy) and kept in the record's meta, beside the load average.
"""

from __future__ import annotations

import dataclasses
import functools
import platform
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import torch
import torch.distributed as dist

from ..errors import LadderizeError
from ..model.layout import Layout, mode_flags
from ..records import BenchRecord, BenchRow, add_speedups, measured_speedup
from .decode import Decoder
from ..checkpoint.io import config_from_dict, load_config
from ..checkpoint.shapes import synthetic_presets
from ..checkpoint.architectures import synthetic_config
from ..checkpoint.shapes import ModelShape
from .tp_check import validate_tp
from .engine import RankModel
from ..checkpoint.placement import dtype_name, runtime_dtype, this_launch
from .generate import RuntimeOptions, resolve_linear
from .timing import LoadWatch, load_average
from ..hardware import cpu_cores
from .launch import LaunchSpec, RankContext, check_machine, run_ranks
from .plan import Schedule, build_plan, domino_chunks_for
from .tp_slicing import SafetensorsSource
from .weights import load_rank_weights, random_rank_weights

# Shapes for --synthetic (random weights): the one preset table (``checkpoint.shapes``), as config dicts.
SYNTHETIC_CONFIGS: dict[str, dict[str, Any]] = synthetic_presets()


@dataclass(frozen=True)
class ModelSource:
    """A checkpoint directory, or a synthetic shape (config dict) with random weights."""

    checkpoint: str | None = None
    synthetic: dict[str, Any] | None = None
    synthetic_name: str = ""
    layout_override: Layout | None = None  # native layout for a synthetic model (--<mode> ranges)

    @property
    def name(self) -> str:
        return self.checkpoint or f"synthetic:{self.synthetic_name}"

    def config_and_layout(self) -> tuple[Any, Layout]:
        config = load_config(self.checkpoint) if self.checkpoint is not None else config_from_dict(self.synthetic)
        return config, self.layout_override or config.layout


def synthetic_source(shape: str, ranges: Mapping[str, str | None] | None = None, spd_tp_size: int = 1) -> ModelSource:
    """``shape`` is a preset name (see ``SYNTHETIC_CONFIGS``) or a path to a config.json; ``ranges`` (mode name to the layers
    of that mode, ``{"ladder": "4:8"}``) its layout, dense without."""
    values, name = synthetic_config(shape)
    override = None
    if ranges and any(ranges.values()):
        override = Layout.from_mode_ranges(int(values["num_hidden_layers"]), ranges, spd_tp_size=spd_tp_size)
    return ModelSource(synthetic=values, synthetic_name=name, layout_override=override)


def model_source(
    checkpoint: str | Path | None, synthetic: str | None, ranges: Mapping[str, str | None] | None = None,
    spd_tp_size: int = 1,
) -> ModelSource:
    """What ``ladderize bench`` measures: a checkpoint (its own layout) or a ``--synthetic`` shape (layout from
    ``ranges``, mode name to ``--<mode>`` ranges), exactly one of the two."""
    if (checkpoint is None) == (synthetic is None):
        raise LadderizeError("give a checkpoint directory or --synthetic SHAPE" + (", not both" if checkpoint else ""))
    if synthetic is not None:
        return synthetic_source(synthetic, ranges, spd_tp_size)
    if ranges and any(ranges.values()):
        raise LadderizeError(f"{mode_flags()} set the layout of a synthetic model; a checkpoint brings its own")
    return ModelSource(checkpoint=str(checkpoint))


@dataclass(frozen=True)
class BenchSpec:
    schedules: tuple[str, ...] = ("native", "dense", "upper-bound", "domino")
    batches: tuple[int, ...] = (1, 4, 16)
    prompt_len: int = 128
    gen_len: int = 32
    warmup: int = 2
    repeats: int = 5
    seed: int = 0


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_once(
    context: RankContext, decoder: Decoder, prompt: torch.Tensor, gen_len: int
) -> tuple[float, float, float, float, float, float]:
    """One timed pass on this rank: ``(prefill_s, decode_s, exposed_comm_s, allreduces, issue_s, wait_s)``.

    All but the first are over decode; ``issue_s`` is the time inside the all-reduce calls (the
    whole all-reduce when blocking), ``wait_s`` the time inside ``wait()`` of in-flight ones.
    """
    comm, device = context.comm, context.device
    prompt_len = prompt.shape[1]
    context.barrier()
    _sync(device)
    start = time.perf_counter()
    token = decoder.prefill(prompt)[:, -1].argmax(-1)
    _sync(device)
    prefilled = time.perf_counter()
    comm.stats.reset()
    for index in range(gen_len):
        token = decoder.extend(token[:, None], prompt_len + index)[:, -1].argmax(-1)
    _sync(device)
    done = time.perf_counter()
    stats = comm.stats
    return prefilled - start, done - prefilled, stats.exposed_s, stats.allreduce_count, stats.issue_s, stats.wait_s


def _rank_model(source: ModelSource, options: RuntimeOptions, world: int, rank: int, seed: int, device, comm,
                max_len: int) -> tuple[RankModel, Layout, ModelShape]:
    """Rank ``rank`` of ``world``'s model of ``source`` (its checkpoint's shard, or random weights from ``seed``)."""
    config, layout = source.config_and_layout()
    dims = ModelShape.from_config(config)
    dtype = runtime_dtype(options.dtype, device)
    if source.checkpoint is not None:
        weights = load_rank_weights(SafetensorsSource(source.checkpoint), dims, layout, world, rank, dtype, device)
    else:
        weights = random_rank_weights(dims, world, rank, seed, dtype, device)
    model = RankModel(weights, config, comm, max_positions=max_len, compile_modules=options.compile, linear=options.linear)
    return model, layout, dims


def _bench_job(context: RankContext, source: ModelSource, spec: BenchSpec, options: RuntimeOptions) -> list[BenchRow]:
    max_len = spec.prompt_len + spec.gen_len + 1
    model, layout, dims = _rank_model(source, options, context.world_size, context.rank, spec.seed, context.device,
                                      context.comm, max_len)
    generator = torch.Generator().manual_seed(spec.seed)
    rows = []
    for batch in spec.batches:
        prompt = torch.randint(0, dims.vocab_size, (batch, spec.prompt_len), generator=generator).to(context.device)
        cache = model.new_cache(batch, max_len)  # shared: every run starts writing at position 0
        plans = [build_plan(layout, schedule, domino_chunks_for(batch, options.domino_chunks)) for schedule in spec.schedules]
        decoders = [
            Decoder(model, plan, batch, max_len, cuda_graphs=options.cuda_graphs,
                    static=options.static_decode, compiled=options.compile, cache=cache)
            for plan in plans
        ]
        runs: list[list[tuple[float, ...]]] = [[] for _ in plans]
        same = _same_as_dense(plans)  # domino with one chunk is the dense plan: it gets dense's timings, not its own noise
        warmup = untimed_rounds(spec.warmup, options)
        timed = [(index, decoder) for index, decoder in enumerate(decoders) if index not in same]
        if warmup == 0:
            # still one untimed prefill and decode step per schedule: one-time costs (first-touch allocation,
            # kernel selection) would otherwise land in the first schedule's timing
            for _, decoder in timed:
                _time_once(context, decoder, prompt, 1)
        # rounds interleave the schedules, so that a change of machine load hits all of them alike
        for round_index in range(warmup + spec.repeats):
            for index, decoder in timed:
                timing = _time_once(context, decoder, prompt, spec.gen_len)
                if round_index >= warmup:
                    runs[index].append(timing)
        for index, dense_index in same.items():
            runs[index] = runs[dense_index]
        for plan, decoder, timings in zip(plans, decoders, runs):
            decode_s = statistics.median(t[1] for t in timings)
            counted = int(round(statistics.median(t[3] for t in timings) / spec.gen_len))
            # a CUDA graph replays its all-reduces without running Python, so the counter sees none: the plan's count
            allreduces = plan.allreduces_per_forward if decoder.cuda_graphs else counted
            row = BenchRow(
                schedule=plan.schedule.value,
                layout=plan.layout.describe(),
                tp=context.world_size,
                batch=batch,
                prompt_len=spec.prompt_len,
                decode_steps=spec.gen_len,
                prefill_s=statistics.median(t[0] for t in timings),
                decode_s_per_token=decode_s / spec.gen_len,
                allreduces_per_decode_step=allreduces,
                comm=context.transport,
                decode_allreduce_share=statistics.median(t[2] / t[1] for t in timings),
                # per decode step, this rank: host time issuing all-reduces / waiting for in-flight ones
                decode_issue_s_per_token=statistics.median(t[4] for t in timings) / spec.gen_len,
                decode_wait_s_per_token=statistics.median(t[5] for t in timings) / spec.gen_len,
                domino_chunks=plan.chunks if plan.schedule is Schedule.DOMINO else None,
                overlapped_allreduces_per_decode_step=plan.overlapped_allreduces,
            )
            row.set_decode_runs([t[1] / spec.gen_len for t in timings], [t[0] for t in timings])
            rows.append(row)
        del decoders, cache
    if context.world_size > 1:  # average the measured communication share over ranks (outside timing)
        shares = [None] * context.world_size
        keys = ("decode_allreduce_share", "decode_issue_s_per_token", "decode_wait_s_per_token")
        dist.all_gather_object(shares, [[getattr(row, key) for key in keys] for row in rows])
        for index, row in enumerate(rows):
            for k, key in enumerate(keys):
                setattr(row, key, statistics.fmean(rank_values[index][k] for rank_values in shares))
    return rows


def untimed_rounds(warmup: int, options: RuntimeOptions) -> int:
    """The untimed rounds before the timed ones: ``--warmup``, and at least one for a compiled or graphed decoder,
    which compiles / captures on its first step."""
    return max(warmup, 1) if options.compile or options.cuda_graphs else warmup


def _same_as_dense(plans: list) -> dict[int, int]:
    """``{index: dense index}`` of the plans that run exactly the dense plan (domino with one chunk), where a dense
    plan is timed too."""
    dense = next((i for i, plan in enumerate(plans) if plan.schedule is Schedule.DENSE), None)
    if dense is None:
        return {}
    return {i: dense for i, plan in enumerate(plans) if plan.schedule is Schedule.DOMINO and plan.chunks == 1}


def decode_runner(
    source: ModelSource, batch: int, prompt_len: int, max_new_tokens: int, options: RuntimeOptions = RuntimeOptions(),
    device: str = "auto", seed: int = 0,
) -> Callable[[int], tuple[float, list[list[int]]]]:
    """One rank in this process (TP 1): ``run(n)`` generates ``n`` greedy tokens for a fixed random prompt with the
    runtime's own decode loop (``decode.generate_on_rank``: prefill, then the decode steps, compiled and/or graphed as
    ``options`` say) and returns ``(seconds, tokens)``: the form ``timing.time_decode`` takes. The model, its cache
    and any CUDA graph are built once and reused by every call."""
    from ..checkpoint.placement import resolve_device
    from .allreduce import Communicator
    from .decode import generate_on_rank

    target = resolve_device(device)
    max_len = prompt_len + max_new_tokens + 1
    model, layout, dims = _rank_model(source, options, 1, 0, seed, target, Communicator(1), max_len)
    decoder = Decoder(model, build_plan(layout, "native"), batch, max_len, cuda_graphs=options.cuda_graphs,
                      static=options.static_decode, compiled=options.compile)
    prompt = torch.randint(0, dims.vocab_size, (batch, prompt_len), generator=torch.Generator().manual_seed(seed)).to(target)

    def run(n: int) -> tuple[float, list[list[int]]]:
        if n > max_new_tokens:
            raise LadderizeError(f"this runner generates at most {max_new_tokens} tokens, asked for {n}")
        with torch.inference_mode():
            _sync(target)
            start = time.perf_counter()
            tokens = generate_on_rank(decoder, prompt, n)
            _sync(target)
            return time.perf_counter() - start, tokens.cpu().tolist()

    return run


def add_comparisons(rows: list[BenchRow], estimate_share: bool = False) -> None:
    """Add both speed-ups against dense (``records.add_speedups``: the rounds' median and range) and
    ``decode_gap_closed`` (and, on CUDA, the estimated communication share) in place."""
    add_speedups(rows)
    by_key = {(r.schedule, r.tp, r.batch): r for r in rows}
    for row in rows:
        dense = by_key.get(("dense", row.tp, row.batch))
        upper = by_key.get(("upper-bound", row.tp, row.batch))
        this = row.decode_s_per_token
        row.decode_gap_closed = None
        if dense and upper and dense.decode_s_per_token > upper.decode_s_per_token and not _noise(dense, upper) \
                and not _noise(dense, row):
            gap = dense.decode_s_per_token - upper.decode_s_per_token
            row.decode_gap_closed = (dense.decode_s_per_token - this) / gap
        if estimate_share:
            row.decode_allreduce_share = max(0.0, 1 - upper.decode_s_per_token / this) if upper else None


def _noise(dense: BenchRow, row: BenchRow) -> bool:
    """Whether ``row``'s difference from ``dense`` is within the noise of the rounds (``SpeedupSpread.within_noise`` of
    ``measured_speedup``): a gap that noise makes cannot be a fraction's denominator or numerator (it printed -301%)."""
    return measured_speedup(dense.decode_s_per_token_runs, row.decode_s_per_token_runs, dense.decode_s_per_token,
                            row.decode_s_per_token).within_noise()


def run_bench(
    source: ModelSource,
    tps: list[int],
    spec: BenchSpec = BenchSpec(),
    launch: LaunchSpec = LaunchSpec(),
    options: RuntimeOptions = RuntimeOptions(),
) -> BenchRecord | None:
    """Run every (schedule, batch) at each TP degree (one process group per degree).

    Under torchrun only rank 0 gets the result; the other ranks get ``None``.
    """
    config, layout = source.config_and_layout()
    dims = ModelShape.from_config(config)
    schedules = tuple(Schedule.parse(s).value for s in spec.schedules)
    if not schedules or not spec.batches:
        raise LadderizeError("bench needs at least one schedule and one batch size")
    if spec.gen_len < 1 or spec.prompt_len < 1 or spec.repeats < 1:
        raise LadderizeError("--prompt, --gen and --repeats must be at least 1")
    if spec.warmup < 0:
        raise LadderizeError(f"--warmup must be at least 0, got {spec.warmup}")
    spec = BenchSpec(schedules, spec.batches, spec.prompt_len, spec.gen_len, spec.warmup, spec.repeats, spec.seed)
    for tp in tps:
        check_machine(dataclasses.replace(launch, tp=tp))
        validate_tp(dims, layout, tp, options.allow_spd_mismatch or "native" not in schedules)
    device_type = launch.device_type
    linear = resolve_linear(options, device_type)
    rows: list[BenchRow] = []
    # under torchrun the other ranks are not this process's children: their work would count as another's
    watch = LoadWatch.start(during=not this_launch().by_launcher)
    for tp in tps:
        tp_launch = dataclasses.replace(launch, tp=tp)
        tp_rows = run_ranks(functools.partial(_bench_job, source=source, spec=spec, options=options), tp_launch)
        if tp_rows is None:  # a torchrun rank other than 0
            return None
        rows += tp_rows
    busy = watch.stop()
    add_comparisons(rows, estimate_share=device_type == "cuda")
    meta = {
        "params": dims.param_count(),
        "device": device_type,
        "device_name": torch.cuda.get_device_name() if device_type == "cuda" else platform.processor() or platform.machine(),
        "cpu_cores": cpu_cores(),
        "dtype": dtype_name(runtime_dtype(options.dtype, device_type)),
        "backend": launch.backend_name,
        "comm": launch.comm,
        "threads_per_rank": launch.threads_per_rank or None,
        "pin_cores": launch.pin_cores,
        "comm_nice": launch.comm_nice,
        "load_average": load_average(),
        "load_average_before": watch.load_average,
        "busy_cores_elsewhere": busy,  # {"before": cores other processes kept busy just before, "during": over the run}
        # the layout's shape, so a report without this checkpoint's eval still shows it (report.runs)
        "num_layers": layout.num_layers,
        "layers_converted": len(layout.converted_layers),
        "allreduces_per_token": layout.allreduces_per_token(),
        "warmup": untimed_rounds(spec.warmup, options),
        "repeats": spec.repeats,
        "domino_chunks": options.domino_chunks,
        "cuda_graphs": options.cuda_graphs,
        "compile": options.compile,
        "linear": linear.value,
        "torch": torch.__version__,
        "decode_allreduce_share_method": "upper-bound estimate" if device_type == "cuda" else "measured host time in all-reduce",
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    return BenchRecord(source.name, layout.describe(), rows, meta)


__all__ = [
    "SYNTHETIC_CONFIGS",
    "BenchSpec",
    "ModelSource",
    "add_comparisons",
    "decode_runner",
    "run_bench",
    "synthetic_source",
    "untimed_rounds",
]
