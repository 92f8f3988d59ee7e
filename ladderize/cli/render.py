"""The tables of the command line (rich ``Table``s built from results; ``ladderize.cli`` prints them).

No computation here: each function turns a result the packages return into what a command shows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.table import Table


def titled(title: str, **options: Any) -> Table:
    """A table at least as wide as its title: rich wraps a title to the table's width, which folded a checkpoint path
    mid-word under a narrow table (in logs too); now only the console's own width can fold it."""
    return Table(title=title, min_width=len(title), **options)


def inspection(path: Path) -> tuple[Table, str]:
    """A checkpoint's layer runs (table) and its summary lines (rich markup)."""
    from ..convert.inspect import inspect_checkpoint
    from ..model.layout import LayerMode

    info = inspect_checkpoint(path)
    table = titled(info["path"], title_justify="left", show_edge=False)
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
        note = f" (tp={info['spd_tp_size']})" if LayerMode(mode).traits.tp_dependent else ""
        table.add_row(f"{first}:{last + 1}", mode + note, str(LayerMode(mode).allreduces_per_layer * (last - first + 1)))
    ar = info["allreduces_per_token"]
    summary = (
        f"layout: [bold]{info['layout']}[/]   parameters: {info['parameters']:,}   dtype: {info['dtype']}\n"
        f"all-reduces per token: {ar['total']} ({ar['overlappable']} overlappable by ladder, "
        f"{ar['total'] - ar['overlappable']} blocking)"
    )
    return table, summary


def _cell(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def rounds_text(untimed: int, timed: int) -> str:
    """The rounds of a bench, as its progress line and its table's title both say them."""
    return f"{untimed + timed} round(s) ({untimed} untimed, {timed} timed)"


def bench_table(result: Any, name: str) -> Table:
    """``ladderize bench``'s rows. Each speed-up is shown as everywhere else (``report.formats.format_speedup``: the
    rounds' median, their range, ``~`` when the range straddles 1.00x); a gap that noise makes is ``n/a``, domino
    with one chunk is said to be the dense path it is, and a bench measured while other processes took the CPU
    says so (``BenchRecord.load_note``)."""
    from ..report.formats import NOISE_NOTE, format_speedup

    first = result.rows[0]
    timed = len(first.decode_s_per_token_runs) or int(result.meta.get("repeats") or 0)
    table = titled(f"{name}: {result.layout}, {result.meta['device']} {result.meta['dtype']}, "
                   f"prompt {first.prompt_len}, gen {first.decode_steps}, "
                   f"{rounds_text(int(result.meta.get('warmup') or 0), timed)}: medians of the timed")
    for column in ("schedule", "tp", "batch", "prefill ms", "decode ms/tok", "decode tok/s", "all-reduces/step",
                   "decode comm share", "decode vs dense", "e2e vs dense", "decode gap closed"):
        table.add_column(column, justify="left" if column == "schedule" else "right")
    uppers = {(row.tp, row.batch) for row in result.rows if row.schedule == "upper-bound"}
    notes = []
    load = result.load_note("this bench")
    if load:
        notes.append(f"load: {load}")
    if any(row.tp == 1 for row in result.rows):
        notes.append("TP 1: no all-reduce to hide or drop, so every schedule does the same work there; its speed-ups "
                     "measure noise")
    for row in result.rows:
        schedule_name = row.schedule + (f" x{row.domino_chunks}" if row.domino_chunks else "")
        if row.schedule == "domino" and row.domino_chunks == 1:
            schedule_name += " = dense"
            _add_note(notes, f"domino x1: a batch of {row.batch} cannot be split, so domino runs the dense path (its timings are dense's)")
        speedups = [row.decode_speedup(), row.e2e_speedup()]
        if any(speedup is not None and speedup.within_noise() for speedup in speedups):
            _add_note(notes, NOISE_NOTE)
        gap = _cell(row.decode_gap_closed, ".0%").replace("-0%", "0%")
        if row.decode_gap_closed is None and (row.tp, row.batch) in uppers and row.schedule != "dense":
            gap = "n/a"
            _add_note(notes, "n/a gap closed: the dense vs upper-bound gap, or this row's difference from dense, is within the rounds' noise")
        table.add_row(
            schedule_name, str(row.tp), str(row.batch), f"{row.prefill_s * 1e3:.1f}", f"{row.decode_s_per_token * 1e3:.2f}",
            f"{row.decode_tokens_per_s:.1f}", str(row.allreduces_per_decode_step), _cell(row.decode_allreduce_share, ".0%"),
            *("-" if speedup is None else format_speedup(speedup) for speedup in speedups),
            gap,
        )
    if notes:
        table.caption = "\n".join(notes)
    return table


def _add_note(notes: list[str], note: str) -> None:
    if note not in notes:
        notes.append(note)


def predict_table(result: Any, prompt: int, gen: int) -> tuple[Table, list[str]]:
    """``ladderize predict``'s rows, a section per (TP, batch), and the notes their marks refer to."""
    table = Table(title=f"prompt {prompt}, {gen} new tokens; each speed-up against the same phase of dense (same TP, batch)")
    for column in ("TP", "batch", "schedule", "prefill ms", "decode ms/tok", "e2e tok/s", "e2e speed-up",
                   "prefill speed-up", "decode speed-up", "exposed comm ms/tok"):
        table.add_column(column, justify="left" if column == "schedule" else "right")
    notes: list[str] = []
    previous = None
    for row in result.rows:
        if previous is not None and (row.tp, row.batch) != previous:
            table.add_section()
        previous = (row.tp, row.batch)
        mark = ""
        if row.note:
            if row.note not in notes:
                notes.append(row.note)
            mark = f" [{notes.index(row.note) + 1}]"
        table.add_row(
            str(row.tp), str(row.batch), row.layout + mark, f"{row.prefill_s * 1e3:.2f}", f"{row.decode_s_per_token * 1e3:.3f}",
            f"{row.e2e_tokens_per_s:,.1f}", f"{row.e2e_speedup_vs_dense:.3f}x", f"{row.prefill_speedup_vs_dense:.3f}x",
            f"{row.decode_speedup_vs_dense:.3f}x",
            f"{row.decode_exposed_comm_s_per_token * 1e3:.3f}",
        )
    return table, notes


def module_table(result: Any) -> Table:
    """``ladderize predict --show-modules``: one rank's module timings."""
    modules = Table(title=f"one rank's modules: {result.compute_label}")
    for column in ("phase", "module", "TP", "batch", "q_len", "kv_len", "ms", "source"):
        modules.add_column(column, justify="left" if column in ("phase", "module", "source") else "right")
    for entry in result.module_timings:
        modules.add_row(entry["phase"], entry["kind"], str(entry["tp"]), str(entry["batch"]), str(entry["q_len"]),
                        str(entry["kv_len"]), f"{entry['seconds'] * 1e3:.4f}", entry["source"])
    return modules


def predict_header(plan: Any) -> list[str]:
    """What ``ladderize predict`` predicts: the model, the interconnect and the compute model (plain text)."""
    shape, profile = plan.request.model, plan.interconnect
    return [f"model: {shape.name} ({shape.num_parameters / 1e9:.1f}B parameters, {shape.num_hidden_layers} layers)",
            f"interconnect: {profile.name}: {profile.description}", f"compute: {plan.compute.label}"]


def adapt_summary(result: Any) -> list[str]:
    """The last lines of ``ladderize adapt``: steps, tokens, time, final loss, and where any kept state is."""
    last = result.curve[-1] if result.curve else {}
    calibration = "" if result.calibration_tokens is None else f" (calibration set {result.calibration_tokens:,} tokens)"
    from ..adapt.plan.budget import duration
    from ..progress import counted

    pace = getattr(result, "throughput", None) or {}
    rate = f" ({pace['tokens_per_s']:,.0f} tokens/s, {pace['tokens_per_s_per_process']:,.0f} per process" + (
        f", MFU {100 * pace['mfu']:.1f}%" if "mfu" in pace else "") + ")" if pace else ""
    if "layer" in last:  # sequential: the curve's last loss is the last layer's last step, not the model's; the table says more
        loss = f"last layer ({last['layer']}) final step loss {last.get('loss_total', float('nan')):.4f}"
    else:
        loss = f"final loss {last.get('loss_total', float('nan')):.4f}"
    wall = getattr(result, "wall_s", None)
    resumed = getattr(result, "resumed_from_step", 0) > 0  # then the training time counts the earlier attempts too
    minutes, every = f"{result.train_s / 60:.1f} min", " over every attempt" if resumed else ""
    if wall is None:
        spent = f"{minutes}{' training' + every if resumed else ''}{rate}"
    else:  # this command's wall time as measured, then the training seconds the rate counts
        spent = (f"{duration(wall)} wall time{' this attempt' if resumed else ''} ({minutes} training{every}"
                 + (f", {rate[2:]}" if rate else ")"))
    lines = [f"adapted {counted(result.steps, 'step')}, {counted(result.tokens, 'token')} trained{calibration}, {spent}; "
             f"{loss} -> {result.out}"]
    if result.state_dir is not None:
        lines.append(f"training state kept in {result.state_dir} (remove it when done)")
    return lines


def stopped_at_max_steps(result: Any, max_steps: int | None) -> str:
    """The last line of ``adapt --max-steps``: where it stopped, its pace, and how to continue."""
    pace = result.throughput or {}
    rate = f" at {pace['tokens_per_s']:,.0f} tokens/s ({pace['tokens_per_s_per_process']:,.0f} per process)" if pace else ""
    where = f"; the training state is in {result.state_dir}" if result.state_dir else ""
    return (f"stopped after {result.steps} step(s) (--max-steps {max_steps}), {result.tokens:,} tokens trained{rate}{where}: "
            f"run the same command with --resume and without --max-steps to continue the whole budget")


def layer_summary_table(curve: list[dict]) -> Table:
    """The sequential schedule's per-layer table: each layer's local loss on one fixed batch before and after its training."""
    from ..adapt.sequential.layer_training import layer_summary

    entries = layer_summary(curve)
    held = {entry["held_out"] for entry in entries}
    where = ("held-out batch" if held == {True} else "calibration batch" if held == {False}
             else "first and last step" if held == {None} else "fixed batch")
    table = Table(title=f"sequential adaptation, per layer (local loss on the same {where} before and after)",
                  title_justify="left", show_edge=False)
    for name in ("layer", "steps", "loss before", "loss after", "change"):
        table.add_column(name, justify="right")
    for entry in entries:
        before, after = entry["before"], entry["after"]
        change = f"{100 * (after - before) / before:+.1f}%" if before else ""
        table.add_row(str(entry["layer"]), str(entry["steps"]), f"{before:.4f}", f"{after:.4f}", change)
    return table


def sensitivity_table(report: Any, mode_name: str, data: str) -> Table:
    """``ladderize sensitivity``'s blocks, from the last backwards: the perplexity with each block and every later
    one converted, its total increase over dense, and the step this block adds (which ranks and classifies it)."""
    table = Table(title=f"{mode_name} sensitivity (dense ppl {report.dense_ppl:.2f} on {report.samples} x {report.seq_len} of {data}); "
                  "each row converts its block and every row above it")
    for column in ("layer", "ppl, it and later blocks", "total vs dense", "step of this block", "category (by step)"):
        table.add_column(column, justify="left" if column.startswith("category") else "right")
    for block in report.blocks:
        table.add_row(str(block.layer), f"{block.ppl_suffix:.2f}", f"{100 * block.increase_vs_dense:+.2f}%",
                      f"{100 * block.delta:+.2f}%", block.category)
    return table


def eval_table(record: dict) -> Table:
    """An eval record's headline metrics with their standard errors."""
    from ..eval.harness import headline_metrics

    where = f" on {record['device']}, {record['dtype']}" if record.get("device") else ""
    if record.get("backend") == "vllm":
        where += f", vLLM at TP {record.get('tensor_parallel_size') or 1}"
    if (record.get("processes") or 1) > 1:
        where += f" x {record['processes']} {'replicas' if record.get('backend') == 'vllm' else 'processes'}"
    table = titled(f"{record['layout']}  ({record['checkpoint']}){where}", title_justify="left", show_edge=False)
    table.add_column("task")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_column("± stderr", justify="right")
    for task, metric, value in headline_metrics(record["results"]):
        stderr = record["results"][task].get(f"{metric}_stderr,none")
        table.add_row(task, metric, f"{value:.4f}", f"{stderr:.4f}" if isinstance(stderr, (int, float)) else "")
    return table


def report_table(report: Any) -> Table:
    """The accuracy-vs-speed report as a table (``report.formats.markdown`` is its form off a terminal)."""
    from ..report.formats import table_rows

    table = Table(show_edge=False)
    for index, name in enumerate(report.columns()):
        table.add_column(name, justify="left" if index == 0 else "right")
    for row in table_rows(report):
        table.add_row(*row)
    return table


def print_report(console: Any, report: Any) -> None:
    """The report on a terminal as a table; piped or logged, its Markdown table, unwrapped."""
    from ..report.formats import markdown

    if not console.is_terminal:
        console.print(markdown(report), highlight=False, soft_wrap=True, markup=False)
        return
    console.print(report_table(report))


class RequestProgress:
    """The eval progress callback ``(kind, done, total, tokens)``: a bar per lm-eval request kind (one runs at a time).

    ``waiting``: from entry until the first request, an ``eval`` bar (in a log, its heartbeat after an interval without a
    line) shows the model and the tasks loading; ``False`` where another process reports (a rank other than 0)."""

    def __init__(self, console: Any, waiting: bool = True):
        self.console = console
        self.waiting = waiting
        self.kind: str | None = None
        self.bar: Any = None

    def __enter__(self) -> "RequestProgress":
        from ..progress import Progress

        if self.waiting:
            self.bar = Progress("eval", self.console).__enter__()
        return self

    def __call__(self, kind: str, done: int, total: int, tokens: int) -> None:
        from ..progress import Progress

        if self.kind != kind:
            self.close()
            label = "eval rolling windows" if kind == "loglikelihood_rolling" else "eval loglikelihood requests"
            self.kind, self.bar = kind, Progress(label, self.console).__enter__()
        self.bar.update(done, total, tokens=tokens)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.__exit__(None, None, None)
            self.bar = None

    def __exit__(self, *exc_info) -> None:
        self.close()
