"""``ladderize eval`` and ``report``: lm-eval accuracy and the accuracy-vs-speed table."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..checkpoint.atomic import check_file_target
from . import options as opts
from . import render
from .app import app, console, err_console



@app.command("eval")
def eval_command(
    ckpt: Path = typer.Argument(..., help="A converted or plain Llama-family checkpoint directory."),
    tasks: str = typer.Option(..., "--tasks", help="Comma-separated: lambada_openai, wikitext2_valid, shakespeare, ppl:FILE or an lm-eval task."),
    limit: Optional[float] = typer.Option(None, help="Examples (documents) per task; a value below 1 is a fraction, as in lm-eval.", rich_help_panel=opts.DATA),
    batch_size: str = typer.Option("8", "--batch-size", help="lm-eval batch size: N, auto or auto:N.", rich_help_panel=opts.MEASURE),
    data_dir: Optional[Path] = typer.Option(None, "--data-dir", help="Folder of lambada_openai/ and wikitext-2/ (default: $LADDERIZE_DATA_DIR); a clone has slices in tests/data.", rich_help_panel=opts.DATA),
    max_length: Optional[int] = typer.Option(None, "--max-length", help="Context length (and perplexity window); default: the model's.", rich_help_panel=opts.DATA),
    bootstrap_iters: int = typer.Option(1000, "--bootstrap-iters", help="Bootstrap iterations for standard errors (lm-eval's CLI: 100000).", rich_help_panel=opts.MEASURE),
    json_path: Optional[Path] = opts.json_file_option(what="the eval record (lm-eval results + layout)"),
    verbose: bool = typer.Option(False, "--verbose", help="Show lm-eval's log messages.", rich_help_panel=opts.OUTPUT),
    device: str = opts.DEVICE_OPTION,
    dtype: str = opts.DTYPE_OPTION,
    backend: str = typer.Option("hf", "--backend", help="hf: lm-eval's HFLM around the model; vllm: lm-eval's vLLM backend with ladderize's plugin (the ladderize[vllm] extra).", rich_help_panel=opts.DEVICE),
    tp: int = typer.Option(1, "--tp", help="vLLM: tensor-parallel ranks per model (an SPD checkpoint: the degree it was converted for).", rich_help_panel=opts.SCALE),
    data_parallel: int = typer.Option(1, "--data-parallel", help="vLLM: model replicas that split the requests (lm-eval's; Ray, CUDA).", rich_help_panel=opts.SCALE),
    parallelize: bool = typer.Option(False, "--parallelize", help="hf: one model over this node's GPUs (HFLM's device map), for a model larger than one GPU.", rich_help_panel=opts.SCALE),
    eager: bool = typer.Option(False, "--eager", help="vLLM: no torch.compile or CUDA graphs (starts faster).", rich_help_panel=opts.DEVICE),
) -> None:
    """Evaluate a checkpoint with lm-eval (lm-eval's own HFLM around the model) and record the layout with the results.

    Runs on --device (auto: the GPU when there is one) in the checkpoint's dtype (as lm-eval's dtype=auto) unless
    --dtype says otherwise. Under accelerate launch / torchrun with several processes the requests are split
    as in lm-eval's data-parallel mode and rank 0 prints and writes the results. --parallelize spreads one model
    over this node's GPUs instead (HFLM's device map).

    --backend vllm runs lm-eval's vLLM backend on the checkpoint with ladderize's vLLM plugin: --tp N ranks per
    model, --data-parallel N replicas; the same tasks, metrics and record as HFLM's.

    The Hugging Face hub is off (HF_HUB_OFFLINE=1, HF_DATASETS_OFFLINE=1) unless either variable is set: a task
    whose data is not on this machine is refused in one line."""
    from ..eval.local_tasks import default_offline

    default_offline()  # first: the hub libraries read it when they are imported
    from ..eval.harness import parse_batch_size
    from ..eval.local_tasks import check_tasks, parse_task_list

    from ..checkpoint.placement import this_launch
    from ..eval.backends import EngineChoice, check_backend

    device, dtype_name = opts.check_placement(device, dtype, resolve=backend == "hf" and not parallelize)
    header = opts.check_checkpoint(ckpt)
    engine = EngineChoice(backend=backend.strip().lower(), tensor_parallel_size=tp, data_parallel_size=data_parallel,
                          parallelize=parallelize, eager=eager)
    check_backend(engine, header, device, this_launch().world)
    opts.check_weights(ckpt)
    parse_batch_size(batch_size)
    check_file_target(json_path, "--json file")
    check_tasks(parse_task_list(tasks), data_dir)  # names, data files and offline data, before lm-eval loads
    from ..checkpoint.atomic import write_json

    opts.quiet_libraries(verbose, vllm=engine.backend == "vllm")
    limit_value = int(limit) if limit is not None and limit >= 1 and float(limit).is_integer() else limit
    with render.RequestProgress(err_console, waiting=this_launch().main) as on_progress:
        from ..eval.harness import evaluate_checkpoint

        record = evaluate_checkpoint(
            ckpt, tasks, limit=limit_value, batch_size=batch_size, data_dir=data_dir,
            max_length=max_length, bootstrap_iters=bootstrap_iters, progress=on_progress, device=device, dtype=dtype_name,
            engine=engine,
        )  # fmt: skip
    if record is None:  # a rank other than 0 under data parallelism: rank 0 reports
        return
    console.print(render.eval_table(record))
    if json_path is not None:
        console.print(f"wrote {write_json(json_path.expanduser().absolute(), record)}", highlight=False, soft_wrap=True)


@app.command()
def report(
    runs: list[Path] = typer.Argument(..., help="Eval and bench JSON files, or folders holding them."),
    out: Path = opts.out_option(None, "Folder for report.md, report.csv and accuracy_vs_speedup.png.", required=True, panel=None),
    metric: Optional[str] = typer.Option(None, "--metric", help="The plot's quality metric: acc, perplexity, ... (default: accuracy first)."),
    task: Optional[str] = typer.Option(None, "--task", help="The plot metric's task (default: the one most layouts have)."),
) -> None:
    """Join eval and bench runs into an accuracy-vs-speed table (Markdown, CSV) and a Pareto plot (PNG)."""
    from ..report import write_report
    from ..report.plot import check_metric_name

    check_metric_name(metric)
    opts.check_output(out, "--out folder")
    if out.exists():
        opts.check_output(out / "report.md", "--out file")
    written = write_report(runs, out, metric=metric, task=task)
    render.print_report(console, written["report"])
    for key in ("markdown", "csv", "png"):
        empty = key == "png" and not written["plot"].get("points")
        console.print(f"wrote {written[key]}" + (" (no plot: no layout has both an accuracy and a speed-up)" if empty else ""),
                      highlight=False, soft_wrap=True)
