"""The demo warns when the machine is busier than its cores, since its speed figures are then noise."""

from __future__ import annotations

from ladderize.demo import load_warning


def test_load_warning_only_above_the_core_count(monkeypatch):
    assert load_warning(load=2.0, cores=2) is None
    message = load_warning(load=7.5, cores=2)
    assert message is not None and message.startswith("load average 7.5 exceeds the 2 CPU cores") and "noise" in message
    monkeypatch.setattr("os.getloadavg", lambda: (9.0, 8.0, 7.0))
    monkeypatch.setattr("os.cpu_count", lambda: 4)
    assert load_warning().startswith("load average 9.0 exceeds the 4 CPU cores")
    monkeypatch.setattr("os.getloadavg", lambda: (3.0, 8.0, 7.0))
    assert load_warning() is None
