"""``ladderize bench`` without ``--tp``: 2 where the model runs at 2, else the smallest degree that runs it (said in one
line), oversubscribing a CPU with fewer cores; on the bundled SmolLM2-135M (9 heads) that is TP 3."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ladderize.cli import options as opts
from tests.cli_helpers import run_cli


@pytest.fixture
def two_cpu_cores(monkeypatch):
    monkeypatch.setattr("ladderize.hardware.cpu_cores", lambda: 2)
    monkeypatch.setattr("ladderize.runtime.host.cpu_cores", lambda: 2)
    monkeypatch.setattr("ladderize.runtime.host.no_cuda_here", lambda: True)


def test_default_tp_is_2_where_the_heads_split_in_two(two_cpu_cores):
    assert opts.bench_default_tp(None, "tiny", {}, None, "auto", False) == (2, False, None)


def test_default_tp_is_the_smallest_degree_that_runs_the_model(two_cpu_cores):
    tp, oversubscribe, line = opts.bench_default_tp(None, "smollm2-135m", {}, None, "auto", False)
    assert (tp, oversubscribe) == (3, True)
    assert line == ("--tp 3: the default --tp 2 cannot run this model (TP degree 2 does not divide the model's 9 query "
                    "heads); 3 ranks on 2 CPU cores, oversubscribed (timings will not mean much)")
    assert opts.bench_default_tp(None, "smollm2-135m", {}, None, "auto", True)[:2] == (3, True)  # asked for: no line about it
    assert "oversubscribed" not in opts.bench_default_tp(None, "smollm2-135m", {}, None, "auto", True)[2]


def test_default_tp_follows_spd_layers(two_cpu_cores):
    """SPD layers converted for TP=N run natively at N only: N is the default."""
    tp, _, line = opts.bench_default_tp(None, "tiny", {"spd": "1:3"}, 4, "auto", True)
    assert tp == 4 and "needs --tp 4" in line


@pytest.mark.slow
def test_bench_runs_on_the_bundled_model_with_default_tp(smollm2_dir: Path, monkeypatch, capsys):
    """The defaults' TP and oversubscription; small lengths and one round keep it short."""
    code, out, err = run_cli(["bench", smollm2_dir, "--batch", "1", "--prompt", "4", "--gen", "2", "--warmup", "0",
                              "--repeats", "1", "--schedules", "native,dense"], capsys, monkeypatch)
    assert code == 0, err
    assert err.startswith("--tp 3: the default --tp 2 cannot run this model"), err
    rows = [line for line in out.splitlines() if re.match(r"│ (native|dense) +│ +3 │ +1 │", line)]
    assert len(rows) == 2, out
