"""Progress of long steps, on a terminal and in a log.

On a terminal, a long step (adapt, sensitivity, eval) shows a rich progress bar. When the
output is not a terminal (a log file, a pipe, CI), a bar prints nothing useful, so the same
updates become plain lines instead, one every ``LADDERIZE_PROGRESS_INTERVAL`` seconds
(default 15), plus the first and the last one::

    adapt 12/64 (19%)  layer 23  loss 0.0123  1,234 tok/s  elapsed 1m02s  ETA 4m30s

``ProgressLine`` decides when a line is due and formats it (no I/O: the demo hands its lines
to its own event callback); ``Progress`` prints them, or drives the bar on a terminal. Off a terminal,
``Progress`` also prints a heartbeat when no line came for an interval (a compile, a long batch): the last
line with its elapsed time moved on, so a log never stands still for longer than the interval.
``make_console`` builds the consoles of the command line: off a terminal they are wide, so
that tables keep their full width in logs instead of cutting headers to ``sche…``.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any

ENV_INTERVAL = "LADDERIZE_PROGRESS_INTERVAL"
DEFAULT_INTERVAL = 15.0
LOG_WIDTH = 200  # console width when the output is not a terminal


def progress_interval() -> float:
    """Seconds between two plain progress lines: ``$LADDERIZE_PROGRESS_INTERVAL``, else 15."""
    raw = os.environ.get(ENV_INTERVAL, "").strip()
    if not raw:
        return DEFAULT_INTERVAL
    try:
        value = float(raw)
    except ValueError:
        return DEFAULT_INTERVAL
    return value if value >= 0 else DEFAULT_INTERVAL


def counted(number: float, noun: str, plural: str | None = None) -> str:
    """``1 sequence``, ``2 sequences``, ``1,024 tokens``, ``0.5 epochs``: a count and its noun, the plural when not exactly one."""
    text = f"{number:,}" if isinstance(number, int) else f"{number:g}"
    return f"{text} {noun if number == 1 else plural or noun + 's'}"


def gib(value: float) -> str:
    """Bytes in GiB, as plans and disk lines print them: ``1.2 GiB``."""
    return f"{value / 2**30:,.1f} GiB"


def format_duration(seconds: float) -> str:
    """``42s``, ``4m10s``, ``1h02m``."""
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{(seconds % 3600) // 60:02d}m"


def make_console(stderr: bool = False):
    """A rich Console; off a terminal it is ``LOG_WIDTH`` wide (or ``$COLUMNS`` when wider) so tables are not cut."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    try:
        terminal = stream.isatty()
    except (AttributeError, ValueError):
        terminal = False
    if terminal:
        return Console(stderr=stderr)
    try:
        columns = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        columns = 0
    return Console(stderr=stderr, width=max(LOG_WIDTH, columns))


class ProgressLine:
    """When a plain progress line is due, and its text. No I/O.

    ``update`` returns the line for the first update (``quiet_start``: once ``interval`` seconds have passed since the
    start), for the last (``done == total``), when ``interval`` seconds have passed since the previous line, or when
    forced; else ``None``.
    Tokens per second are measured between two lines when ``tokens`` is given (else the
    caller's ``tokens_per_s``). A count that went down started over (the next stage of a
    recipe, shown on the same line): its first line takes the caller's rate, or the count
    over the time since the previous line, never a difference across the two counts. The ETA is the
    pace since the first line times the steps left, with ``elapsed`` the caller's (e.g. training
    time without loading) or the time since the first update; the first line shows ``ETA ?``: its
    step carries one-time costs (a sequential stage's first teacher pass) that would inflate it.
    """

    def __init__(self, label: str, total: int | None = None, *, interval: float | None = None,
                 clock: Callable[[], float] = time.monotonic, quiet_start: bool = False):
        self.label = label
        self.quiet_start = quiet_start
        self.total = total
        self.interval = progress_interval() if interval is None else interval
        self.clock = clock
        self.started = clock()
        self._last_time: float | None = None
        self._last_tokens: int | None = None
        self._first: tuple[float, int] | None = None  # (elapsed, done) at the first line of the current count
        self._last_done = 0
        self._said_final: float | None = None  # the count whose finished line was printed (not printed twice)

    def update(
        self,
        done: int,
        total: int | None = None,
        *,
        loss: float | None = None,
        tokens: int | None = None,
        tokens_per_s: float | None = None,
        layer: int | str | None = None,
        elapsed: float | None = None,
        extra: str | None = None,
        force: bool = False,
    ) -> str | None:
        if total is not None:
            self.total = total
        now = self.clock()
        final = self.total is not None and done >= self.total
        if self._last_time is None:
            due = not self.quiet_start or now - self.started >= self.interval
        else:
            due = now - self._last_time >= self.interval
        # a count that went down started over (the next stage of a recipe)
        restarted = done < self._last_done or (tokens is not None and self._last_tokens is not None and tokens < self._last_tokens)
        repeated = final and self._said_final == done and not restarted  # the finished count's line, said already
        if not (due or final or force) or (repeated and not force):
            return None
        self._said_final = done if final else None
        if restarted and tokens is not None and tokens_per_s is None and now > self._last_time:
            tokens_per_s = tokens / (now - self._last_time)  # a new count, begun after the previous line
        elif tokens is not None and self._last_tokens is not None and now > self._last_time and not restarted:
            tokens_per_s = (tokens - self._last_tokens) / (now - self._last_time)  # since the previous line
        elif tokens and tokens_per_s is None and now > self.started:
            tokens_per_s = tokens / (now - self.started)
        self._last_time, self._last_tokens, self._last_done = now, tokens, done
        spent = elapsed if elapsed is not None else now - self.started
        if self._first is None or restarted:
            self._first = (spent, done)
        first_spent, first_done = self._first
        pace = (spent - first_spent) / (done - first_done) if done > first_done else None
        return self.format(done, loss=loss, tokens_per_s=tokens_per_s, layer=layer, elapsed=spent, extra=extra, pace=pace)

    def format(self, done: int, *, loss: float | None = None, tokens_per_s: float | None = None,
               layer: int | str | None = None, elapsed: float = 0.0, extra: str | None = None,
               pace: float | None = None) -> str:
        """The line's text; ``pace`` (seconds per step) gives the ETA (``?`` without it)."""
        count = int(done)  # a count moved in fractions (a batch partway) shows its whole units; the percentage moves
        parts = [f"{self.label} {count}/{self.total} ({100 * done / self.total:.0f}%)" if self.total else f"{self.label} {count}"]
        details = self.details(loss=loss, tokens_per_s=tokens_per_s, layer=layer, extra=extra)
        if details:
            parts.append(details)
        parts.append(f"elapsed {format_duration(elapsed)}")
        if self.total and 0 < done < self.total:
            parts.append("ETA ?" if pace is None else f"ETA {format_duration(pace * (self.total - done))}")
        elif self.total and done >= self.total:
            parts.append("done")
        return "  ".join(parts)

    @staticmethod
    def details(*, loss: float | None = None, tokens_per_s: float | None = None, layer: int | str | None = None,
                extra: str | None = None) -> str:
        """The fields of a line after its count: layer, loss, tokens/s and any extra text."""
        parts = []
        if layer is not None:
            parts.append(f"layer {layer}")
        if loss is not None:
            parts.append(f"loss {loss:.4f}")
        if tokens_per_s is not None:
            parts.append(f"{tokens_per_s:,.0f} tok/s")
        if extra:
            parts.append(extra)
        return "  ".join(parts)


class Progress:
    """A progress bar on a terminal, plain ``ProgressLine`` lines on ``console`` otherwise.

    Use as a context manager; ``update`` takes ``ProgressLine.update``'s arguments and
    ``message`` prints a line above the bar (or in the log). Off a terminal, a line (the
    heartbeat) follows every ``interval`` seconds without one (module docstring); ``quiet_start``: no progress
    line before the first interval (a job shorter than it, or one refused early, prints none).
    """

    def __init__(self, label: str, console, *, total: int | None = None, interval: float | None = None,
                 terminal: bool | None = None, quiet_start: bool = False):
        import threading

        self.console = console
        self.label = label
        self.terminal = console.is_terminal if terminal is None else terminal
        self.line = ProgressLine(label, total, interval=interval, quiet_start=quiet_start)
        self._bar: Any = None
        self._task: Any = None
        self._lock = threading.RLock()  # the heartbeat's thread and the caller's share the line and its record
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None
        self._printed = self.line.clock()  # when the last line (progress or message) was printed
        self._last: tuple[float, dict[str, Any], float, float] | None = None  # (done, fields, elapsed, when) of the last update

    def __enter__(self) -> "Progress":
        if self.terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress, TextColumn, TimeElapsedColumn

            self._bar = RichProgress(
                TextColumn(f"[bold]{self.label}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                TextColumn("{task.description}"), console=self.console, transient=True,
            )
            self._bar.__enter__()
            self._task = self._bar.add_task("", total=self.line.total)
        elif self.line.interval > 0:
            import threading

            self._heartbeat = threading.Thread(target=self._beat, name=f"{self.label} heartbeat", daemon=True)
            self._heartbeat.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        if self._heartbeat is not None:
            self._heartbeat.join()
            self._heartbeat = None
        if self._bar is not None:
            self._bar.__exit__(*exc_info)
            self._bar = None

    def message(self, text: str, markup: bool = False) -> None:
        """Print ``text`` above the bar (or in the log); ``markup``: it holds rich markup (``[dim]...[/]``)."""
        with self._lock:
            target = self._bar.console if self._bar is not None else self.console
            target.print(text, highlight=False, markup=markup, soft_wrap=True)
            self._printed = self.line.clock()

    def update(self, done: float, total: int | None = None, **fields: Any) -> None:
        if self._bar is not None:
            if total is not None:
                self.line.total = total
            details = ProgressLine.details(**{k: v for k, v in fields.items() if k in ("loss", "tokens_per_s", "layer", "extra")})
            self._bar.update(self._task, completed=done, total=self.line.total, description=details)
            return
        with self._lock:
            now = self.line.clock()
            elapsed = fields.get("elapsed")
            self._last = (done, fields, now - self.line.started if elapsed is None else elapsed, now)
            text = self.line.update(done, total, **fields)
            if text is not None:
                self.message(text)

    def heartbeat(self) -> str | None:
        """The heartbeat's line when neither a line nor an update came for an interval: the last update's, its elapsed
        time moved on (the ETA unknown), or, after a finished count or before any, how long it has been quiet."""
        with self._lock:
            now = self.line.clock()
            quiet = now - self._printed
            if quiet < self.line.interval or (self._last is not None and now - self._last[3] < self.line.interval):
                return None  # a line came, or an update that the next due line shows
            if self._last is None or (self.line.total is not None and self._last[0] >= self.line.total):
                return f"{self.label}  working, {format_duration(quiet)} since the last line"
            done, fields, elapsed, when = self._last
            details = {k: v for k, v in fields.items() if k in ("loss", "layer", "extra")}
            return self.line.format(done, **details, elapsed=elapsed + now - when)

    def _beat(self) -> None:
        while not self._stop.wait(min(max(self.line.interval / 4, 0.05), 1.0)):  # a line at most a second late
            text = self.heartbeat()
            if text is not None:
                self.message(text)
