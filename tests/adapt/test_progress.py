"""Progress in a log: periodic plain lines from adapt (joint and sequential) and sensitivity, wide tables off a terminal."""

from __future__ import annotations

import re

from ladderize.adapt.sequential.layer_training import layer_summary
from ladderize.progress import LOG_WIDTH, ProgressLine, format_duration, make_console, progress_interval
from tests.cli_helpers import run_cli

LINE = re.compile(r"^adapt (\d+)/(\d+) \(\d+%\)")


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_progress_line_is_periodic_with_step_loss_rate_and_eta():
    clock = FakeClock()
    line = ProgressLine("adapt", 20, interval=10.0, clock=clock)
    printed = {}
    for step in range(1, 21):
        clock.now += 3.0  # a step every 3 s: lines at steps 1, 5 (12 s after), 9, 13, 17 and the last
        text = line.update(step, loss=1.0 / step, tokens=step * 600, elapsed=3.0 * step)
        if text is not None:
            printed[step] = text
    assert sorted(printed) == [1, 5, 9, 13, 17, 20]
    assert printed[5].startswith("adapt 5/20 (25%)")
    assert "loss 0.2000" in printed[5]
    assert "200 tok/s" in printed[5]  # 2,400 tokens in the 12 s since the previous line
    assert "ETA 45s" in printed[5]  # 12 s for the 4 steps since the first line, 15 to go
    assert "ETA ?" in printed[1]  # one step says nothing of the pace
    assert printed[20].endswith("done")
    assert line.update(20, force=True) is not None


def test_eta_leaves_out_the_first_steps_one_time_cost_and_restarts_with_the_count():
    """The demo's sequential stage: 38 s of teacher states before step 1, then 0.4 s a step (it said ETA 2h41m)."""
    clock = FakeClock()
    line = ProgressLine("adapt", 256, interval=0.0, clock=clock)
    assert "ETA ?" in line.update(1, elapsed=38.0)
    assert "ETA 1m26s" in line.update(41, elapsed=54.0)  # 16 s for 40 steps: 0.4 s a step, 215 to go
    # the next stage of a recipe counts again from 1: its pace is its own
    assert "ETA ?" in line.update(1, 10, elapsed=5.0)
    assert "ETA 14s" in line.update(3, 10, elapsed=9.0)  # 2 s a step, 7 to go


def test_a_count_moved_in_fractions_shows_whole_units_and_a_moving_percentage():
    clock = FakeClock()
    line = ProgressLine("eval rolling windows", 25, interval=0.0, clock=clock)
    assert line.update(0).startswith("eval rolling windows 0/25 (0%)")
    clock.now += 4.0
    assert line.update(0.5).startswith("eval rolling windows 0/25 (2%)")  # an eighth of a batch of 4
    clock.now += 4.0
    assert line.update(1.0).startswith("eval rolling windows 1/25 (4%)")


def test_a_quiet_log_gets_a_heartbeat_with_the_elapsed_time_moved_on():
    """Off a terminal, an interval without a line (a compile, a long batch) gets one: the last update's line with its
    elapsed time moved on, or how long it has been quiet."""
    import io
    import time

    from rich.console import Console

    from ladderize.progress import Progress

    out = io.StringIO()
    clock = FakeClock()
    progress = Progress("adapt", Console(file=out, width=200), interval=10.0, terminal=False)
    progress.line.clock, progress.line.started, progress._printed = clock, clock(), clock()
    assert progress.heartbeat() is None
    clock.now += 11.0
    assert progress.heartbeat() == "adapt  working, 11s since the last line"
    progress.update(0, 10, extra="caching the teacher's states")
    assert out.getvalue().startswith("adapt 0/10 (0%)  caching the teacher's states  elapsed 11s")
    clock.now += 9.0
    assert progress.heartbeat() is None  # a line 9 s ago
    clock.now += 6.0
    progress.update(0, extra="caching the teacher's states")  # not due: the next line shows it, so no heartbeat either
    assert progress.heartbeat() is None
    clock.now += 15.0
    assert progress.heartbeat() == "adapt 0/10 (0%)  caching the teacher's states  elapsed 41s"  # 11 s, then 30 s
    progress.update(10, 10)
    clock.now += 12.0
    assert progress.heartbeat() == "adapt  working, 12s since the last line"  # after a finished count

    out = io.StringIO()
    with Progress("eval", Console(file=out, width=200), interval=0.2, terminal=False) as live:  # the thread, in real time
        live.update(0, 4)
        time.sleep(1.0)
    beats = out.getvalue().splitlines()[1:]
    assert len(beats) >= 2 and all(line.startswith("eval 0/4 (0%)") for line in beats)
    time.sleep(0.5)
    assert out.getvalue().splitlines()[1:] == beats  # no line after the exit


def test_progress_interval_from_environment(monkeypatch):
    monkeypatch.setenv("LADDERIZE_PROGRESS_INTERVAL", "2.5")
    assert progress_interval() == 2.5
    monkeypatch.setenv("LADDERIZE_PROGRESS_INTERVAL", "soon")
    assert progress_interval() == 15.0
    assert [format_duration(s) for s in (4.4, 250, 3725)] == ["4s", "4m10s", "1h02m"]


def test_consoles_off_a_terminal_are_wide_enough_for_tables(capsys):
    from rich.table import Table

    console = make_console()
    assert not console.is_terminal and console.width >= LOG_WIDTH
    table = Table()
    for name in ("schedule", "decode ms/token", "tokens/s", "speed-up vs dense", "prefill ms", "tp", "batch", "layout"):
        table.add_column(name)
    table.add_row("upper-bound", "12.5", "80", "1.10x", "40.0", "3", "16", "ladder 15:30 + spd@tp3 0:3")
    console.print(table)
    out = capsys.readouterr().out
    assert "schedule" in out and "decode ms/token" in out and "…" not in out


def test_adapt_prints_periodic_progress_lines_when_not_a_terminal(ladder_dir, text_file, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("LADDERIZE_PROGRESS_INTERVAL", "0")  # a line per step
    args = ["adapt", ladder_dir, tmp_path / "joint", "--data", text_file, "--tokens", 256, "--seq-len", 32, "--batch-size", 2]
    code, stdout, stderr = run_cli(args, capsys, monkeypatch)
    assert code == 0, stderr
    lines = [line for line in stderr.splitlines() if LINE.match(line)]
    assert [LINE.match(line).groups() for line in lines] == [(str(i), "4") for i in range(1, 5)]
    for line in lines[:-1]:
        assert re.search(r"loss \d+\.\d{4}", line) and re.search(r"[\d,]+ tok/s", line) and " ETA " in line
    assert lines[-1].endswith("done")
    before_first_step = stderr[: stderr.index(lines[0])]  # the plan and the data, said while loading
    assert before_first_step.startswith("plan: 256 tokens = 4 steps x 2 sequences (batch 2) x 32 tokens")
    assert "data: 8 sequences of 32 tokens" in before_first_step

    monkeypatch.setenv("LADDERIZE_PROGRESS_INTERVAL", "3600")  # only the first and the last step
    code, _, stderr = run_cli([*args[:2], tmp_path / "joint2", *args[3:]], capsys, monkeypatch)
    assert code == 0, stderr
    assert [LINE.match(line).group(1) for line in stderr.splitlines() if LINE.match(line)] == ["1", "4"]


def test_sequential_adapt_names_the_layer_and_ends_with_a_per_layer_table(ladder_dir, text_file, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("LADDERIZE_PROGRESS_INTERVAL", "0")
    args = ["adapt", ladder_dir, tmp_path / "seq", "--data", text_file, "--local-schedule", "sequential", "--epochs", 1,
            "--tokens", 128, "--seq-len", 32, "--batch-size", 2]
    code, stdout, stderr = run_cli(args, capsys, monkeypatch)
    assert code == 0, stderr
    caching = [line for line in stderr.splitlines() if LINE.match(line) and "caching the teacher's states entering layer 2" in line]
    lines = [line for line in stderr.splitlines() if LINE.match(line) and line not in caching]
    # the states' caching moves from its first chunk: the embedding and layers 0-1, 2 chunks each (4 + 4 held-out rows)
    assert [LINE.match(line).groups() for line in caching] == [(str(i), "6") for i in range(7)]
    assert stderr.index(caching[-1]) < stderr.index(lines[0])
    layers = [re.search(r"layer (\d+)", line).group(1) for line in lines]
    assert layers == ["2", "2", "3", "3"]  # ladder layers 2 and 3, 2 steps each
    table = stdout[stdout.index("sequential adaptation, per layer"):]
    assert "loss before" in table and "loss after" in table
    rows = [[cell.strip() for cell in line.split("│")] for line in table.splitlines() if re.match(r"^\s*[23]\s", line)]
    assert [row[0] for row in rows] == ["2", "3"] and all(row[1] == "2" for row in rows)


def test_a_count_that_starts_over_gets_its_own_rate_not_a_negative_one():
    clock = FakeClock()
    line = ProgressLine("adapt", 4, interval=0.0, clock=clock)
    for step, tokens in ((1, 100), (2, 200), (3, 300)):  # stage 1: 100 tokens a second
        clock.now += 1.0
        assert "  100 tok/s" in line.update(step, tokens=tokens)
    clock.now += 2.0  # stage 2 starts its count again: 50 tokens in the 2 s since the last line
    assert "  25 tok/s" in line.update(1, 4, tokens=50)
    clock.now += 1.0
    assert "  50 tok/s" in line.update(2, tokens=100)
    clock.now += 1.0
    assert "  7 tok/s" in line.update(1, tokens=10, tokens_per_s=7.0)  # the caller's rate, when it gives one


def test_a_two_stage_recipe_never_prints_a_negative_rate(ladder_dir, text_file, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("LADDERIZE_PROGRESS_INTERVAL", "0")  # a line per step, across both stages
    args = ["adapt", ladder_dir, tmp_path / "two", "--data", text_file, "--seq-len", 32, "--batch-size", 2,
            "--stage", "seq-local:tokens=128,epochs=1", "--stage", "kd:tokens=128"]
    code, _, stderr = run_cli(args, capsys, monkeypatch)
    assert code == 0, stderr
    lines = [line for line in stderr.splitlines() if LINE.match(line) and "caching the teacher's states" not in line]
    assert [LINE.match(line).groups() for line in lines] == [(str(i), "4") for i in range(1, 5)] + [("1", "2"), ("2", "2")]
    rates = [float(re.search(r"(-?[\d,.]+) tok/s", line).group(1).replace(",", "")) for line in lines]
    assert len(rates) == 6 and all(rate > 0 for rate in rates), lines


def test_layer_summary_takes_the_evaluation_batch_losses_else_first_and_last_step():
    curve = [{"layer": 5, "loss_local": 4.0}, {"layer": 5, "loss_local": 2.0},
             {"layer": 5, "loss_local": 1.0, "eval_before": 3.5, "eval_after": 1.5, "eval_held_out": True},
             {"layer": 7, "loss_local": 3.0}]  # a curve from before the evaluation batch
    assert layer_summary(curve) == [{"layer": 5, "steps": 3, "before": 3.5, "after": 1.5, "held_out": True},
                                    {"layer": 7, "steps": 1, "before": 3.0, "after": 3.0, "held_out": None}]


def test_sensitivity_reports_progress_per_measured_suffix(dense_dir, text_file, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("LADDERIZE_PROGRESS_INTERVAL", "0")
    code, _, stderr = run_cli(["sensitivity", dense_dir, "--spd-tp", 3, "--data", text_file, "--samples", 2, "--seq-len", 32,
                               "--json", tmp_path / "s.json"], capsys, monkeypatch)
    assert code == 0, stderr
    counts = re.findall(r"^sensitivity (\d+)/(\d+)", stderr, flags=re.M)
    assert counts == [(str(i), "10") for i in range(1, 11)]  # 2 samples x (dense + 4 suffixes)
