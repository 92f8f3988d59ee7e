"""``ladderize demo``: the main job, offline, with no flags."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from . import options as opts
from . import render
from .app import app, console, err_console

DEFAULT_OUT = Path("runs/demo")


@app.command()
def demo(
    ctx: typer.Context,
    out: Path = opts.out_option(DEFAULT_OUT, "Folder for checkpoints, eval and bench JSON, and the report (resumable).", panel=None),
    quick: bool = typer.Option(False, "--quick", help="The same path with tiny budgets (a few minutes; for CI)."),
    data_dir: Optional[Path] = typer.Option(None, "--data-dir", help="Add the real benchmarks found here (lambada_openai, wikitext-2).", rich_help_panel=opts.DATA),
    force: bool = opts.force_option("Start over: replace OUT."),
    verbose: bool = typer.Option(False, "--verbose", help="Show library log messages.", rich_help_panel=opts.OUTPUT),
    device: str = opts.DEVICE_OPTION,
    dtype: str = opts.DTYPE_OPTION,
) -> None:
    """The main job, offline: pull SmolLM2-135M, convert ladder and SPD layouts, adapt, evaluate, bench at TP=3, report."""
    import time
    from contextlib import nullcontext

    from rich.markup import escape

    from ..checkpoint.atomic import check_apart
    from ..demo.pipeline import run_demo
    from ..progress import Progress

    device, dtype_name = opts.check_placement(device, dtype)
    if getattr(ctx.get_parameter_source("out"), "name", None) == "DEFAULT":
        out.parent.mkdir(parents=True, exist_ok=True)  # the default runs/ is in .gitignore: no clone has it
    check_apart(out, [data_dir], "--out")  # --force replaces the demo folder
    opts.check_output(out, "--out folder")
    if out.exists():
        opts.check_output(out / "report.md", "--out file")
    opts.quiet_libraries(verbose)
    started = time.perf_counter()
    # on a terminal a spinner shows the demo is alive; in a log, a heartbeat line follows every interval without one
    log = Progress("demo", err_console, terminal=False) if not err_console.is_terminal else None

    def on_event(kind: str, message: str) -> None:
        elapsed = time.perf_counter() - started
        style = {"start": "bold cyan", "skip": "dim", "done": "green", "note": "yellow"}.get(kind, "default")
        line = f"[dim]{elapsed:7.1f}s[/] [{style}]{kind:>5}[/] {escape(message)}"
        if log is None:
            err_console.print(line, highlight=False, soft_wrap=True)
            return
        if kind == "start":
            log.label = f"demo, {message.split(':')[0][:60]}"
        log.message(line, markup=True)

    with log or nullcontext(), err_console.status("[bold]ladderize demo[/]", spinner="dots"):
        result = run_demo(out, quick=quick, data_dir=data_dir, force=force, on_event=on_event, device=device, dtype=dtype_name)
    render.print_report(console, result.report)
    console.print(f"report: {result.markdown}  (also {result.csv.name}, {result.png.name})", highlight=False, soft_wrap=True)
    if result.notes:
        for note in result.notes:
            console.print(f"[yellow]note:[/] {note}", highlight=False, soft_wrap=True)
