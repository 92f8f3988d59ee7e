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


def test_a_reused_bench_measured_under_load_is_said(tmp_path):
    """Issue 26 item 17: on a re-run the demo reused bench rows measured under load without a word."""
    import json

    from ladderize.demo import DemoSettings, _bench

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
