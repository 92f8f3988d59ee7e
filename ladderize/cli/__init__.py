"""The ``ladderize`` command line: one Typer app, one module per verb group. Only this package prints.

A command parses its options (shared groups: ``options``), validates them, calls its pipeline in the
package (``convert.pipeline.convert_layout``, ``adapt.entrance.adapt_checkpoint``, ``predict.pipeline.prepare_prediction``,
``runtime.text.generate_text``, ...) and renders the result (tables: ``render``).

- ``app``: the Typer app, ``--version``, the consoles
- ``convert``: convert, pull, inspect; ``runtime``: generate, bench; ``predict``: predict
- ``adapt``: adapt, sample, sensitivity; ``evaluate``: eval, report; ``demo``: demo

Importing it imports neither torch nor transformers (``ladderize --help`` stays fast).
"""

from __future__ import annotations

import sys

from .app import app, err_console
# the command modules register their commands on ``app`` when imported (--help lists the workflow first: app.WORKFLOW)
from . import convert, runtime, predict, adapt, evaluate, demo  # noqa: E402,F401  isort: skip
from .options import check_ranges  # noqa: E402

check_ranges(app)  # every numeric option's range, checked as it is parsed

__all__ = ["app", "main"]


def main() -> None:
    """Console-script entry point: user errors become one line on stderr and exit code 2.

    SIGINT and SIGTERM raise ``Interrupted`` in every command, so ``finally`` blocks remove
    temp folders; the exit code is 130 (SIGINT) or 143 (SIGTERM), with one line saying so.

    A process started as ``ladderize`` (every launched rank) enables ``faulthandler``: a death by SIGABRT, SIGSEGV or
    SIGBUS prints every thread's Python stack to its stderr, so a rank's abort says where it was.

    Under a launcher (torchrun, accelerate launch) every process refuses alike, and the first process of each node
    (local rank 0: rank 0 on one node) alone prints the refusal (an ``error:`` line, a usage error or the interrupted
    line), so each node's log holds it once; the others exit with the same code in silence.
    """
    import os

    from ..checkpoint.placement import this_launch
    from ..errors import Interrupted, LadderizeError, exit_now, ignore_late_signals, install_interrupt_handlers, restore_handlers

    entry = sys._getframe(1).f_globals.get("__name__") == "__main__"  # the process's entry point, not a caller in-process
    if entry:  # a process that dies of SIGABRT, SIGSEGV or SIGBUS prints every thread's Python stack to its stderr
        import faulthandler

        faulthandler.enable(all_threads=True)
    if entry and "torch" not in sys.modules:  # a process `accelerate launch` started alone computes as one without it
        from ..checkpoint.placement import as_plain_process

        as_plain_process()
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
    speaks = this_launch().local_rank == 0  # the node's first process, or the only one
    try:
        if speaks:
            app()
        else:
            _run_silent_on_usage_error()
    except SystemExit:
        if entry:
            ignore_late_signals()  # finished: a late signal must not turn this exit code into 130
        raise
    except Exception as exc:
        layout = sys.modules.get("ladderize.model.layout")  # not imported: no LayoutError can have come
        if not isinstance(exc, LadderizeError) and not (layout is not None and isinstance(exc, layout.LayoutError)):
            raise
        if speaks:
            from rich.markup import escape

            err_console.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)  # 'ladderize[vllm]' as written
        else:
            _let_the_first_process_speak()
        sys.exit(2)
    except (Interrupted, KeyboardInterrupt) as exc:
        code, name = (exc.exit_code, exc.signame) if isinstance(exc, Interrupted) else (130, "SIGINT")
        hint = f"; {exc.hint}" if getattr(exc, "hint", "") else ""
        if speaks:
            err_console.print(f"[bold red]interrupted[/] ({name}){hint}", highlight=False, soft_wrap=True)
        if entry:
            exit_now(code)  # cleanup has run (finally blocks, ranks stopped): skip the slow interpreter teardown
        sys.exit(code)
    finally:
        if entry:
            ignore_late_signals()
        else:
            restore_handlers(previous_handlers)


def _run_silent_on_usage_error() -> None:
    """Run the app as a process other than the launcher's main one: a usage error (a bad option value, an unknown
    option) exits with its code and prints nothing, since the main process prints the same one."""
    import typer

    try:
        code = app(standalone_mode=False)  # the parser raises usage errors instead of printing them
    except typer.TyperException as exc:  # typer's usage errors (``BadParameter``, ``NoSuchOption``, ...)
        _let_the_first_process_speak()
        sys.exit(exc.exit_code)
    except typer.Abort:
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)  # an explicit exit's code, or 0 when the command returned


SILENT_EXIT_DELAY_S = 3.0


def _let_the_first_process_speak() -> None:
    """A silent process's refusal waits ``SILENT_EXIT_DELAY_S`` before it exits: the launcher ends every process at the
    first one's failure, and the node's first process, refusing the same at the same check, must have printed its line
    by then (else torchrun's SIGTERM cuts it off). A SIGTERM or SIGINT that reaches it while it waits (the launcher
    ending the job) ends it at once, in silence, with the refusal's exit code 2."""
    import signal
    import time

    from ..errors import exit_now

    def quietly(_signum, _frame):
        exit_now(2)

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, quietly)
    time.sleep(SILENT_EXIT_DELAY_S)
