"""The demo warns when other processes keep the CPU busy, since its speed figures are then noise."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from ladderize.demo.pipeline import load_warning
from ladderize.runtime.timing import busy_elsewhere, cpu_seconds


def test_load_warning_from_cores_busy_elsewhere(monkeypatch):
    assert load_warning(busy=0.2, cores=2) is None
    message = load_warning(busy=1.5, cores=2)
    assert message is not None and message.startswith("other processes keep 1.5 of the 2 CPU cores busy") and "noise" in message
    # where busy_elsewhere cannot measure (not Linux): the 1-minute load average above the core count, as before
    monkeypatch.setattr("ladderize.runtime.timing.busy_elsewhere", lambda window_s=1.0: None)
    monkeypatch.setattr("os.getloadavg", lambda: (9.0, 8.0, 7.0))
    monkeypatch.setattr("os.cpu_count", lambda: 4)
    assert load_warning().startswith("load average 9.0 exceeds the 4 CPU cores")
    monkeypatch.setattr("os.getloadavg", lambda: (3.0, 8.0, 7.0))
    assert load_warning() is None


@pytest.mark.skipif(not Path("/proc/stat").is_file(), reason="busy_elsewhere reads Linux's /proc/stat")
def test_busy_elsewhere_counts_other_processes_not_this_one():
    """The demo warned on an idle machine: the 1-minute load average still held its own previous bench.
    Work of this process (or of children it has reaped) is not 'elsewhere'; a spinning child that it
    has not reaped is."""
    spin = [sys.executable, "-c", "import time\nend = time.time() + 3\nwhile time.time() < end: pass"]
    child = subprocess.Popen(spin)
    try:
        time.sleep(0.3)  # the child is up and spinning
        with_child = busy_elsewhere(1.0)
    finally:
        child.wait()
    assert with_child is not None and with_child >= 0.5, with_child  # about one core (less when the CPU is shared)

    # this process's own work is measured (and so left out), whatever else runs beside the test
    import threading

    stop = threading.Event()

    def work() -> None:
        while not stop.is_set():
            sum(range(1000))

    thread = threading.Thread(target=work)
    first = cpu_seconds()
    thread.start()
    try:
        time.sleep(1.0)
    finally:
        stop.set()
        thread.join()
    last = cpu_seconds()
    own, machine = last[1] - first[1], last[0] - first[0]
    assert own >= 0.3, own  # about one core of its own spinning
    assert machine >= own - 0.05, (machine, own)  # the machine's busy time holds it (1-tick rounding)


def test_a_reused_bench_measured_under_load_is_said(tmp_path):
    """Issue 26 item 17: on a re-run the demo reused bench rows measured under load without a word."""
    import json

    from ladderize.demo.pipeline import DemoSettings, _bench

    events: list[tuple[str, str]] = []
    row = {"schedule": "native", "tp": 3, "batch": 1}
    busy = tmp_path / "ladder.json"
    busy.write_text(json.dumps({"rows": [row], "meta": {"load_average": [7.5, 6.0, 5.0], "cpu_cores": 2}}))
    note = _bench("ladder", tmp_path / "unused", busy, DemoSettings(), lambda kind, message: events.append((kind, message)))
    assert note is not None and "load average 7.5 on 2 CPU cores" in note and "noise" in note
    assert ("skip", "bench ladder (exists)") in events and ("note", note) in events
    idle = tmp_path / "spd.json"
    idle.write_text(json.dumps({"rows": [row], "meta": {"load_average": [0.4, 0.5, 0.5], "cpu_cores": 2}}))
    events.clear()
    assert _bench("spd", tmp_path / "unused", idle, DemoSettings(), lambda kind, message: events.append((kind, message))) is None
    assert events == [("skip", "bench spd (exists)")]


@pytest.mark.skipif(not Path("/proc/stat").is_file(), reason="LoadWatch reads Linux's /proc/stat")
def test_load_watch_measures_before_and_during_a_run():
    """Issue 64: a bench recorded the load average only after its run. A child that spins through the run and is not
    reaped by its end is another process's work: it shows in 'during'."""
    from ladderize.runtime.timing import LoadWatch

    watch = LoadWatch.start(window_s=0.2)
    spin = [sys.executable, "-c", "import time\nend = time.time() + 1.5\nwhile time.time() < end: pass"]
    child = subprocess.Popen(spin)
    try:
        time.sleep(1.2)
        busy = watch.stop()
    finally:
        child.wait()
    assert set(busy) == {"before", "during"} and busy["before"] is not None
    assert busy["during"] is not None and busy["during"] >= 0.5, busy  # about one core (less when the CPU is shared)
    assert LoadWatch.start(window_s=0.1, during=False).stop()["during"] is None
