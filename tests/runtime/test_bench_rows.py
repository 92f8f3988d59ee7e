"""Benchmark bookkeeping that needs no processes: comparisons against dense, synthetic shapes, one-rank runs."""

from __future__ import annotations

import json

import pytest

from ladderize.errors import LadderizeError
from ladderize.records import BenchRow
from ladderize.runtime.bench import SYNTHETIC_CONFIGS, BenchSpec, add_comparisons, run_bench, synthetic_source
from ladderize.runtime.launch import LaunchSpec


def row(schedule: str, decode_s: float, batch: int = 1, prefill_s: float | None = None) -> BenchRow:
    return BenchRow(schedule=schedule, layout="dense", tp=2, batch=batch, prompt_len=16, decode_steps=8, prefill_s=prefill_s,
                    decode_s_per_token=decode_s, allreduces_per_decode_step=4, decode_allreduce_share=0.5)


def test_speedup_and_gap_closed():
    rows = [row("dense", 0.010), row("upper-bound", 0.006), row("native", 0.007), row("domino", 0.011)]
    add_comparisons(rows)
    by = {r.schedule: r for r in rows}
    assert by["native"].decode_speedup_vs_dense == pytest.approx(10 / 7)
    assert by["native"].decode_gap_closed == pytest.approx(0.75)
    assert by["domino"].decode_gap_closed == pytest.approx(-0.25)
    assert by["upper-bound"].decode_gap_closed == pytest.approx(1.0) and by["dense"].decode_gap_closed == 0.0


def test_comparisons_without_dense_or_on_cuda():
    rows = [row("native", 0.007), row("upper-bound", 0.006)]
    add_comparisons(rows, estimate_share=True)
    assert rows[0].decode_speedup_vs_dense is None and rows[0].decode_gap_closed is None
    assert rows[0].decode_allreduce_share == pytest.approx(1 - 6 / 7)


def test_speedups_compare_each_phase_with_the_same_phase():
    """Decode speed-up from decode times, end-to-end from both phases: prefill 0.1 s, 8 decode steps."""
    rows = [row("dense", 0.010, prefill_s=0.1), row("native", 0.007, prefill_s=0.1)]
    add_comparisons(rows)
    native = rows[1]
    assert native.decode_speedup_vs_dense == pytest.approx(10 / 7)
    assert native.decode_tokens_per_s == pytest.approx(1 / 0.007)
    assert native.e2e_tokens_per_s == pytest.approx(9 / (0.1 + 8 * 0.007))  # the prefill's token and 8 more
    assert native.e2e_speedup_vs_dense == pytest.approx((0.1 + 8 * 0.010) / (0.1 + 8 * 0.007))
    assert native.e2e_speedup_vs_dense < native.decode_speedup_vs_dense  # the prefill did not get faster


def test_synthetic_shapes(tmp_path):
    source = synthetic_source("cpu-512", {"ladder": "4:8"})
    config, layout = source.config_and_layout()
    assert config.hidden_size == 512 and layout.describe() == "ladder 4:8"
    path = tmp_path / "config.json"
    path.write_text(json.dumps(dict(SYNTHETIC_CONFIGS["tiny"], layer_modes=["dense", "spd", "spd", "dense"], spd_tp_size=2)))
    config, layout = synthetic_source(str(path)).config_and_layout()
    assert layout.describe() == "spd@tp2 1:3"
    with pytest.raises(LadderizeError, match="neither a preset"):
        synthetic_source("nope")


def test_single_rank_bench_runs_in_process():
    result = run_bench(
        synthetic_source("tiny"), [1], BenchSpec(("native", "upper-bound", "domino"), (1, 2), 4, 2, 0, 1), LaunchSpec(tp=1)
    )
    assert [(r.schedule, r.batch) for r in result.rows] == [
        ("native", 1), ("upper-bound", 1), ("domino", 1), ("native", 2), ("upper-bound", 2), ("domino", 2)
    ]
    assert all(r.allreduces_per_decode_step == 0 for r in result.rows)  # one rank has nothing to sum
    assert result.meta["params"] > 0 and result.layout == "dense"


def test_warmup_zero_still_runs_one_untimed_step_per_schedule(monkeypatch):
    """Issue 26 item 10: with --warmup 0 the first schedule's first timed pass absorbed one-time costs (0.01x vs dense)."""
    import ladderize.runtime.bench as bench

    calls: list[int] = []
    real = bench._time_once

    def counting(context, decoder, prompt, gen_len):
        calls.append(gen_len)
        return real(context, decoder, prompt, gen_len)

    monkeypatch.setattr(bench, "_time_once", counting)
    spec = BenchSpec(schedules=("native", "dense"), batches=(1,), prompt_len=4, gen_len=3, warmup=0, repeats=1)
    record = run_bench(synthetic_source("tiny"), [1], spec, LaunchSpec(tp=1, device="cpu"))
    assert calls == [1, 1, 3, 3]  # an untimed prefill + one decode step for each schedule, then the timed passes
    assert len(record.rows) == 2 and record.meta["warmup"] == 0
    with pytest.raises(LadderizeError, match="--warmup must be at least 0"):
        run_bench(synthetic_source("tiny"), [1], BenchSpec(warmup=-1), LaunchSpec(tp=1, device="cpu"))


def _with_runs(schedule: str, runs: list[float], **kwargs) -> BenchRow:
    bench_row = row(schedule, sorted(runs)[len(runs) // 2], **kwargs)
    bench_row.set_decode_runs(runs)
    return bench_row


def test_gap_closed_is_none_when_the_gap_is_noise():
    """Issue 37 item 3: dense and upper-bound whose rounds overlap made 'decode gap closed' print -301%."""
    rows = [_with_runs("dense", [0.0100, 0.0104, 0.0098]), _with_runs("upper-bound", [0.0101, 0.0097, 0.0099]),
            _with_runs("native", [0.0110, 0.0112, 0.0111])]
    add_comparisons(rows)
    assert rows[2].decode_gap_closed is None and rows[1].decode_gap_closed is None
    assert not rows[2].decode_speedup().within_noise()  # slower every round


def test_gap_closed_is_none_when_the_row_is_within_noise_of_dense():
    rows = [_with_runs("dense", [0.010, 0.011, 0.009]), _with_runs("upper-bound", [0.005, 0.005, 0.005]),
            _with_runs("native", [0.0095, 0.0115, 0.0101])]
    add_comparisons(rows)
    assert rows[2].decode_speedup().within_noise() and rows[2].decode_gap_closed is None
    assert rows[1].decode_gap_closed is not None  # a real gap stays measured


def test_domino_at_batch_1_is_the_dense_path_with_dense_timings(monkeypatch):
    """Issue 37 item 3: 'domino x1' at batch 1 showed 1.07x and 33% gap closed; it is the dense plan."""
    from ladderize.model.layout import Layout
    from ladderize.runtime.plan import build_plan

    dense, domino = build_plan(Layout.dense(2), "dense"), build_plan(Layout.dense(2), "domino", 1)
    assert domino.steps == dense.steps and domino.overlapped_allreduces == 0
    result = run_bench(synthetic_source("tiny"), [1], BenchSpec(("dense", "domino"), (1,), 4, 2, 0, 3), LaunchSpec(tp=1))
    by = {r.schedule: r for r in result.rows}
    assert by["domino"].domino_chunks == 1
    assert by["domino"].decode_s_per_token_runs == by["dense"].decode_s_per_token_runs
    assert by["domino"].decode_speedup_vs_dense == 1.0


def test_bench_table_says_noise_and_dense_path():
    from rich.console import Console

    from ladderize.cli.render import bench_table
    from ladderize.records import BenchRecord

    rows = [_with_runs(name, runs, prefill_s=0.1) for name, runs in (
        ("dense", [0.010, 0.011, 0.009]), ("upper-bound", [0.0101, 0.0097, 0.0099]), ("native", [0.0095, 0.0115, 0.0101]),
        ("domino", [0.010, 0.011, 0.009]))]
    rows[3].domino_chunks = 1
    add_comparisons(rows)
    console = Console(width=250, record=True)
    console.print(bench_table(BenchRecord("m", "dense", rows, {"device": "cpu", "dtype": "float32"}), "m"))
    text = console.export_text()
    assert "domino x1 = dense" in text and "~" in text and "n/a" in text and "noise" in text
    native = next(line for line in text.splitlines() if line.lstrip("│ ").startswith("native"))
    assert "~" in native and native.rstrip(" │").endswith("n/a") and "-0%" not in text
