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

    try:
        app()
    except (LadderizeError, LayoutError) as exc:
        err_console.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except KeyboardInterrupt:
        err_console.print("[bold red]interrupted[/]")
        sys.exit(130)


# --- core: convert, pull, inspect -------------------------------------------------------------

# --- runtime: generate, bench ------------------------------------------------------------------

# --- predict -----------------------------------------------------------------------------------

# --- adapt, sensitivity ------------------------------------------------------------------------

# --- eval, report, demo ------------------------------------------------------------------------


if __name__ == "__main__":
    main()
