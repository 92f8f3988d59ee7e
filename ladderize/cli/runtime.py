"""``ladderize generate`` and ``bench``: the tensor-parallel runtime."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Optional

import typer

from ..checkpoint.atomic import check_file_target
from . import options as opts
from . import render
from .app import app, console, err_console



def _runtime_launch(tp: int, device: str, backend: str, oversubscribe: bool, threads_per_rank: int = 0,
                    pin_cores: bool = False, comm: str = "auto"):
    from ..runtime.launch import LaunchSpec

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
    temperature: float = typer.Option(0.0, help="0 = greedy (default); > 0 samples.", rich_help_panel=opts.SAMPLING),
    top_k: int = typer.Option(0, "--top-k", help="Sample from the k most likely tokens (0 = all).", rich_help_panel=opts.SAMPLING),
    top_p: float = typer.Option(1.0, "--top-p", help="Nucleus sampling mass.", rich_help_panel=opts.SAMPLING),
    seed: int = typer.Option(0, help="Sampling seed (the same on every rank).", rich_help_panel=opts.SAMPLING),
    schedule: str = typer.Option("native", help="native, dense, upper-bound (wrong outputs) or domino.", rich_help_panel=opts.RUNTIME),
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
    from ..runtime.sampling import Sampling, check_sampling

    from ..errors import LadderizeError

    sampling = Sampling(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
    check_sampling(sampling)
    if not prompt and not chat:
        raise LadderizeError("the prompt is empty")
    opts.check_schedules([schedule])
    opts.check_placement(device, dtype)
    opts.check_runtime_checkpoint(checkpoint, [tp], allow_spd_mismatch or schedule.strip().lower() != "native")
    opts.check_ranks([tp], device, oversubscribe)
    from ..runtime.generate import RuntimeOptions
    from ..runtime.text import generate_text
    options = RuntimeOptions(
        dtype=dtype, allow_spd_mismatch=allow_spd_mismatch, cuda_graphs=cuda_graphs, compile=compile_modules, linear=linear
    )
    launch = _runtime_launch(tp, device, backend, oversubscribe, comm=comm)
    if not json_output and not err_console.is_terminal:
        err_console.print(f"generating up to {max_new_tokens} tokens on {tp} rank(s)...", highlight=False)
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
@opts.mode_options(panel=opts.SYNTHETIC_LAYOUT)
def bench_cmd(
    checkpoint: Optional[Path] = typer.Argument(None, help="Checkpoint directory (or use --synthetic)."),
    synthetic: Optional[str] = typer.Option(
        None, "--synthetic", help="Random weights of a shape: a preset (tiny, smollm2-135m, llama-8b, ...) or a config.json."
    ),
    tp: Optional[str] = typer.Option(None, "--tp", show_default=False, help=(
        "Tensor-parallel degree(s), comma-separated (default: 2, or the least that runs the model; one line says).")),
    batch: str = typer.Option("1,4,16", "--batch", help="Batch sizes, comma-separated."),
    prompt: int = typer.Option(128, "--prompt", help="Prompt tokens per row."),
    gen: int = typer.Option(32, "--gen", help="Decode steps per row (the prefill yields one more token)."),
    schedules: str = typer.Option("native,dense,upper-bound,domino", help="Comma-separated: native, dense, upper-bound, domino."),
    json_path: Optional[Path] = opts.json_file_option(what="the rows and metadata"),
    warmup: int = typer.Option(2, help="Untimed runs first (0: still one step per schedule).", rich_help_panel=opts.MEASURE),
    repeats: int = typer.Option(5, help="Timed runs; the medians are reported.", rich_help_panel=opts.MEASURE),
    domino_chunks: int = typer.Option(2, "--domino-chunks", help="Micro-batches of the domino schedule.", rich_help_panel=opts.MEASURE),
    ranges: dict[str, Optional[str]] = None,  # --ladder, --spd, ...: one option per converted mode (``opts.mode_options``)
    spd_tp: Optional[int] = opts.spd_tp_option(" (default: the first --tp)", panel=opts.SYNTHETIC_LAYOUT),
    dtype: str = opts.DTYPE_OPTION,
    device: str = opts.DEVICE_OPTION,
    backend: str = opts.BACKEND_OPTION,
    comm: str = opts.COMM_OPTION,
    oversubscribe: bool = opts.OVERSUBSCRIBE_OPTION,
    threads_per_rank: int = typer.Option(0, "--threads-per-rank", help="CPU threads per rank (0 = cores / ranks).", rich_help_panel=opts.RUNTIME),
    pin_cores: bool = typer.Option(False, "--pin-cores", help="CPU: bind each rank to its own cores.", rich_help_panel=opts.RUNTIME),
    allow_spd_mismatch: bool = opts.ALLOW_SPD_MISMATCH_OPTION,
    cuda_graphs: bool = opts.CUDA_GRAPHS_OPTION,
    compile_modules: bool = opts.COMPILE_OPTION,
    linear: str = opts.LINEAR_OPTION,
    seed: int = typer.Option(0, help="Seed of the random prompts (and synthetic weights).", rich_help_panel=opts.MEASURE),
) -> None:
    """Benchmark prefill and decode per schedule, TP degree and batch size; print a table, save JSON."""
    from ..errors import LadderizeError
    from ..model.layout import tp_degree_for
    from ..parsing import parse_int_list

    if (checkpoint is None) == (synthetic is None):
        raise LadderizeError("give a checkpoint directory or --synthetic SHAPE" + (", not both" if checkpoint else ""))
    batches = parse_int_list(batch, "--batch")
    opts.check_schedules([s.strip() for s in schedules.split(",") if s.strip()])
    opts.check_placement(device, dtype)
    chosen = None
    if tp is None:
        default, oversubscribe, chosen = opts.bench_default_tp(checkpoint, synthetic, ranges, spd_tp, device, oversubscribe)
        tp = str(default)
    tps = list(parse_int_list(tp, "--tp"))
    spd_tp_size = tp_degree_for(ranges, spd_tp, default=tps[0], default_from="the first --tp")
    if checkpoint is not None:
        opts.check_runtime_checkpoint(checkpoint, tps, allow_spd_mismatch or "native" not in schedules)
    else:
        opts.check_synthetic(synthetic, ranges, spd_tp_size, tps, allow_spd_mismatch or "native" not in schedules)
    check_file_target(json_path, "--json file")
    opts.check_ranks(tps, device, oversubscribe)
    from ..checkpoint.placement import this_launch
    from ..progress import Progress

    if chosen is not None and this_launch().main:
        err_console.print(chosen, highlight=False, soft_wrap=True)

    # the spinner below shows nothing in a log: a heartbeat line every interval there, from the libraries' loading on
    log = Progress("bench", err_console, terminal=False) if not err_console.is_terminal and this_launch().main else None
    with log or contextlib.nullcontext():
        from ..runtime.bench import BenchSpec, model_source, run_bench, untimed_rounds
        from ..runtime.generate import RuntimeOptions

        source = model_source(checkpoint, synthetic, ranges, spd_tp_size)
        spec = BenchSpec(schedules=tuple(s.strip() for s in schedules.split(",") if s.strip()), batches=batches,
                         prompt_len=prompt, gen_len=gen, warmup=warmup, repeats=repeats, seed=seed)
        options = RuntimeOptions(
            dtype=dtype, allow_spd_mismatch=allow_spd_mismatch, domino_chunks=domino_chunks, cuda_graphs=cuda_graphs,
            compile=compile_modules, linear=linear,
        )
        rounds = render.rounds_text(untimed_rounds(warmup, options), repeats)
        if log is not None:  # say what runs, and how much
            log.message(f"benchmarking {source.name} at TP {tp}: {len(spec.schedules)} schedule(s) x {len(batches)} batch "
                        f"size(s) x {rounds} of a {prompt}-token prefill and {gen} decode steps; the table comes at the end")
        with err_console.status(f"benchmarking {source.name} at TP {tp}..."):
            result = run_bench(source, tps, spec, _runtime_launch(max(tps), device, backend, oversubscribe, threads_per_rank,
                                                                  pin_cores, comm), options)
    if result is None:  # a torchrun rank other than 0: rank 0 prints
        return
    console.print(render.bench_table(result, source.name))
    if json_path is not None:
        console.print(f"wrote {opts.write_json(json_path, result.to_json())}")
