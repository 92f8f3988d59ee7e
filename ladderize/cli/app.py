"""The Typer app, its root options and the two consoles; the command modules register on ``app``."""

from __future__ import annotations

import typer

from . import options as opts
from ..progress import make_console  # wide off a terminal, so tables keep their width in logs


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
        from ..version import __version__

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
