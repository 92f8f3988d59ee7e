"""Decode timing by difference: the one formula behind every decode figure that times whole generations.

A generation of G new tokens is one prefill (which yields the first token) and G - 1 decode steps, so

    prefill_s          = median(time of generating 1 token)
    decode_s_per_token = (median(time of G tokens) - median(time of 1 token)) / (G - 1)

``time_decode`` runs each engine's ``run(n)`` (generate exactly n new tokens; return seconds, or
``(seconds, tokens)``) after untimed warm-up, interleaving the engines repeat by repeat so that a change
of machine load hits all of them alike. Standard library only: benchmark workers in other virtual
environments (vLLM's, llama.cpp's) execute this file's text (``worker_source``).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

Run = Callable[[int], Any]  # n new tokens -> seconds, or (seconds, tokens)


def _timed(run: Run, n: int) -> tuple[float, Any]:
    out = run(n)
    return (float(out[0]), out[1]) if isinstance(out, tuple) else (float(out), None)


def time_decode(runs: Mapping[str, Run], gen: int, warmup: int = 1, repeats: int = 3) -> dict[str, dict[str, Any]]:
    """Per engine: prefill_s, decode_s_per_token (the formula above), the raw runs and the last tokens."""
    if gen < 2:
        raise ValueError(f"decode timing needs at least 2 new tokens, got {gen}")
    if repeats < 1:
        raise ValueError(f"decode timing needs at least 1 timed repeat, got {repeats}")
    full: dict[str, list[float]] = {name: [] for name in runs}
    one: dict[str, list[float]] = {name: [] for name in runs}
    tokens: dict[str, Any] = {}
    for repeat in range(warmup + repeats):
        for name, run in runs.items():
            elapsed, tokens[name] = _timed(run, gen)
            first, _ = _timed(run, 1)
            if repeat >= warmup:
                full[name].append(elapsed)
                one[name].append(first)
    return {
        name: {
            "gen": gen,
            "full_s": full[name],
            "one_s": one[name],
            "prefill_s": statistics.median(one[name]),
            "decode_s_per_token": (statistics.median(full[name]) - statistics.median(one[name])) / (gen - 1),
            "decode_s_per_token_runs": [(f - o) / (gen - 1) for f, o in zip(full[name], one[name])],
            "tokens": tokens[name],
        }
        for name in runs
    }


def load_average() -> list[float]:
    """The machine's 1/5/15-minute load averages, rounded (recorded beside every timing)."""
    return [round(x, 2) for x in os.getloadavg()]


def cpu_seconds() -> tuple[float, float] | None:
    """(the machine's busy CPU seconds since boot, steal included; this process's and its reaped
    children's CPU seconds), from Linux's ``/proc/stat`` and ``os.times``; None where unreadable."""
    try:
        with open("/proc/stat") as stat:
            ticks = [int(v) for v in stat.readline().split()[1:9]]  # user nice system idle iowait irq softirq steal
        machine = (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
    own = os.times()
    return machine, own[0] + own[1] + own[2] + own[3]


def busy_elsewhere(window_s: float = 1.0) -> float | None:
    """CPU cores that other processes keep busy over the next ``window_s`` seconds: the machine's busy
    time less this process's (``cpu_seconds``), per second. Unlike the load average it leaves out this
    process's own recent work (a demo's previous step) and threads waiting on I/O. None where
    ``cpu_seconds`` cannot read (not Linux)."""
    first = cpu_seconds()
    time.sleep(window_s)
    last = cpu_seconds()
    if first is None or last is None:
        return None
    return round(max(0.0, (last[0] - first[0]) - (last[1] - first[1])) / window_s, 2)


class LoadWatch:
    """The machine's load around a timed run: the CPU cores other processes kept busy just before it
    (``busy_elsewhere`` over ``window_s``) and during it (``cpu_seconds`` at its start and its end: the
    work of child processes counts as this process's once they are reaped), and the load average before it."""

    def __init__(self, before: float | None, load_average_before: list[float], started: tuple[float, float] | None):
        self.before, self.load_average, self.started = before, load_average_before, started
        self.wall = time.perf_counter()

    @classmethod
    def start(cls, window_s: float = 0.5, during: bool = True) -> "LoadWatch":
        """Measure the load before the run, then start watching it (``during=False``: before only, for a run whose
        other processes are not this process's children)."""
        before = busy_elsewhere(window_s)
        return cls(before, load_average(), cpu_seconds() if during else None)

    def stop(self) -> dict[str, float | None]:
        """``{"before": cores, "during": cores}`` busy elsewhere; None where not measured."""
        during = None
        end, elapsed = cpu_seconds(), time.perf_counter() - self.wall
        if self.started is not None and end is not None and elapsed > 0:
            others = (end[0] - self.started[0]) - (end[1] - self.started[1])
            during = round(max(0.0, others) / elapsed, 2)
        return {"before": self.before, "during": during}


def worker_source() -> str:
    """This module's text, for a benchmark worker to ``exec`` where ladderize is not installed."""
    return Path(__file__).read_text()


__all__ = ["LoadWatch", "busy_elsewhere", "cpu_seconds", "load_average", "time_decode", "worker_source"]
