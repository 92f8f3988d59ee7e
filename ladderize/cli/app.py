"""The Typer app, its root options and the two consoles; the command modules register on ``app``."""

from __future__ import annotations

import typer
from typer.core import TyperGroup

from . import options as opts
from ..progress import make_console  # wide off a terminal, so tables keep their width in logs

HELP = ("Convert Llama-family checkpoints to Ladder Residual / Sync-Point-Drop layouts, adapt, evaluate and benchmark them."
        "\n\nStart with 'ladderize demo': the whole job on the default model, offline. "
        "Step by step: pull -> convert -> adapt -> eval -> bench.")
WORKFLOW = ("demo", "pull", "convert", "adapt", "eval", "bench")  # listed first by --help, in the order a run takes them


class _Commands(TyperGroup):
    """``ladderize --help`` lists the workflow's commands first (``WORKFLOW``), then the others as registered."""

    def list_commands(self, ctx) -> list[str]:
        names = super().list_commands(ctx)
        return [name for name in WORKFLOW if name in names] + [name for name in names if name not in WORKFLOW]


app = typer.Typer(
    name="ladderize",
    cls=_Commands,
    help=HELP,
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
    # (``--help`` shows ``HELP``, the app's)


opts.hide_flag_types()

console = make_console()
err_console = make_console(stderr=True)
