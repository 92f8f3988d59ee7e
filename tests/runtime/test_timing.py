"""The one decode-timing formula (``runtime/timing.py``) on a fake engine with known costs."""

from __future__ import annotations

import pytest

from ladderize.runtime.timing import time_decode, worker_source


def test_decode_by_difference_recovers_the_step_cost_and_interleaves():
    calls = []

    def engine(name, prefill, step):
        def run(n):
            calls.append((name, n))
            return prefill + (n - 1) * step, [name] * n
        return run

    result = time_decode({"a": engine("a", 0.5, 0.01), "b": engine("b", 0.2, 0.03)}, gen=11, warmup=1, repeats=2)
    assert result["a"]["decode_s_per_token"] == pytest.approx(0.01)
    assert result["b"]["prefill_s"] == pytest.approx(0.2) and result["b"]["decode_s_per_token"] == pytest.approx(0.03)
    assert result["a"]["tokens"] == ["a"] * 11 and len(result["a"]["full_s"]) == 2
    assert result["b"]["decode_s_per_token_runs"] == pytest.approx([0.03, 0.03])
    # warm-up + 2 repeats, each engine's G then 1 tokens, engines interleaved repeat by repeat
    assert calls == [("a", 11), ("a", 1), ("b", 11), ("b", 1)] * 3


def test_bad_budgets_and_worker_source():
    with pytest.raises(ValueError, match="at least 2 new tokens"):
        time_decode({"a": lambda n: 1.0}, gen=1)
    namespace: dict = {}
    exec(compile(worker_source(), "timing.py", "exec"), namespace)  # what benchmark workers in other venvs run
    assert namespace["time_decode"]({"x": lambda n: float(n)}, gen=3, warmup=0, repeats=1)["x"]["decode_s_per_token"] == 1.0
