"""``ladderize predict --calibrate`` on this machine's CPU (tiny shape, bounded), and ``--profile`` reading it back."""

from __future__ import annotations

import json
import time

import pytest

from ladderize.errors import LadderizeError
from ladderize.predict.calibrate import allreduce_sizes, fit_allreduce, load_profile, run_calibration
from ladderize.predict.fit import ModuleTiming
from ladderize.predict.gpus import load_gpu_profile
from ladderize.predict.pipeline import prepare_prediction
from ladderize.predict.presets import ModelShape

from tests.cli_helpers import error_lines, run_cli

TINY = ModelShape("tiny", hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=8,
                  num_key_value_heads=4, head_dim=8, vocab_size=128)
CONFIG = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 8,
          "num_key_value_heads": 4, "vocab_size": 128, "model_type": "llama"}


def cpu_fabric(folder) -> "Path":
    """An interconnect profile that names no GPU: a CPU fabric, the one a CPU's profile may be priced against."""
    path = folder / "cpu-fabric.json"
    path.write_text(json.dumps({"algorithm": "ring", "launch_s": 5e-6, "latency_s": 2e-6, "bus_bytes_per_s": 5e9,
                                "overlap_slowdown": 0.0}))
    return path


def steady_timings(patch: pytest.MonkeyPatch, noise: dict | None = None) -> None:
    """Module times of a steady device (a roofline plus a fixed cost): what an idle GPU gives. A loaded 2-core CPU
    times these tiny shapes 4x apart from one run to the next, which the fit check (issue 37) refuses; ``noise``
    multiplies the time of modules of a given (kind, batch)."""
    from ladderize.predict import measured
    from ladderize.predict.work import roofline_s

    def measure(self, work):
        factor = (noise or {}).get((work.kind, work.batch), 1.0)
        return factor * (roofline_s(self._local(work), 2e10, 5e9) + 30e-6)

    patch.setattr(measured.MeasuredCompute, "device_rates", lambda self: (2e10, 5e9))
    patch.setattr(measured.MeasuredCompute, "_measure", measure)


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    folder = tmp_path_factory.mktemp("calibrate")
    out = folder / "profile.json"
    begin = time.perf_counter()
    with pytest.MonkeyPatch.context() as patch:
        steady_timings(patch)
        profile = run_calibration(TINY, (1, 2), (1, 2), prompt=16, gen=4, out=out, cache_dir=folder / "cache",
                                  device="cpu", repeats=2, max_call_s=0.05, max_bytes=64 * 2**20)
    return out, profile, time.perf_counter() - begin


def test_calibration_times_every_module_and_writes_a_profile(calibrated):
    out, profile, seconds = calibrated
    assert seconds < 120  # bounded on a loaded 2-core CPU
    data = json.loads(out.read_text())
    assert data["record"] == "ladderize-predict-profile" and data["interconnect"] is None
    assert "no all-reduce timed" in " ".join(data["notes"])  # one device: nothing to all-reduce with
    rows = data["timings"]
    assert len(rows) == 2 * 2 * 5  # (TP, batch) x (decode attention, mlp, head; prefill attention, mlp)
    assert all(r["source"] == "measured" and r["seconds"] > 0 for r in rows)
    assert {(r["phase"], r["kind"]) for r in rows} == {("decode", "attention"), ("decode", "mlp"), ("decode", "head"),
                                                      ("prefill", "attention"), ("prefill", "mlp")}
    gpu = profile.gpu
    assert gpu.name.startswith("CPU") and "measured on this device" in gpu.sources["peak_flops_per_s"]
    assert gpu.fit.weight_bytes_per_s > 0 and gpu.fit.kv_bytes_per_s > 0
    assert all(v >= 0 for v in gpu.fit.overhead_s.values())


def test_the_profile_is_what_predict_uses(calibrated, tmp_path):
    out, profile, _ = calibrated
    config = tmp_path / "tiny.json"
    config.write_text(json.dumps(CONFIG))
    gpu, interconnect = load_profile(out)
    assert gpu == profile.gpu and interconnect is None
    assert load_gpu_profile(out) == gpu
    fabric = cpu_fabric(tmp_path)
    plan = prepare_prediction(model=str(config), layout=None, ranges=None, tp="2", batch="1,2", prompt=16, gen=4,
                           interconnect=str(fabric), profile=out, schedules="dense,ladder", device="cpu")
    assert plan.interconnect.name == fabric.stem and plan.compute.gpu == gpu
    prediction = plan.run()
    for timing in prediction.module_timings:
        assert timing["seconds"] > 0
    # The profile's fitted column is the fit applied to the rows it was fitted on.
    for row in json.loads(out.read_text())["timings"]:
        assert row["fitted_s"] > 0 and row["error"] == pytest.approx(row["fitted_s"] / row["seconds"] - 1)


def test_calibrate_refuses_to_overwrite_and_needs_two_settings(calibrated, tmp_path):
    out, _, _ = calibrated
    with pytest.raises(LadderizeError, match="--force"):
        run_calibration(TINY, (1, 2), (1, 2), 16, 4, out, device="cpu")
    with pytest.raises(LadderizeError, match="at least two"):
        run_calibration(TINY, (1,), (1,), 16, 4, tmp_path / "p.json", device="cpu", cache_dir=tmp_path)


def test_allreduce_fit_recovers_a_two_protocol_curve():
    """The >1-GPU path's fit, on points drawn from a known curve (no second GPU here)."""
    ranks, steps, factor = 4, 6, 1.5
    truth = {"small_hop": 2e-6, "small_bw": 100e9, "large_hop": 8e-6, "large_bw": 300e9}
    sizes = allreduce_sizes(TINY, (1, 16, 64), 1024)
    small = [s for s in sizes if s <= 2**20]

    def seconds(n: int) -> float:
        a = steps * truth["small_hop"] + factor * n / truth["small_bw"]
        b = steps * truth["large_hop"] + factor * n / truth["large_bw"]
        return a if n in small else b

    points = [{"bytes": n, "seconds": seconds(n)} for n in sizes]
    assert 2 <= len(small) <= len(sizes) - 2
    profile = fit_allreduce(points, ranks, "measured")
    assert profile.latency_s == pytest.approx(truth["small_hop"], rel=1e-6)
    assert profile.small_bus_bytes_per_s == pytest.approx(truth["small_bw"], rel=1e-6)
    assert profile.large_latency_s == pytest.approx(truth["large_hop"], rel=1e-6)
    assert profile.bus_bytes_per_s == pytest.approx(truth["large_bw"], rel=1e-6)


def test_cli_calibrate_errors_are_one_line(tmp_path, capsys, monkeypatch):
    config = tmp_path / "tiny.json"
    config.write_text(json.dumps(CONFIG))
    code, _, err = run_cli(["predict", "--calibrate", "--model", config, "--device", "cpu"], capsys, monkeypatch)
    assert code == 2 and error_lines(err) == ["error: --calibrate writes a profile: give --profile FILE"]
    code, _, err = run_cli(["predict", "--model", config, "--profile", tmp_path / "missing.json"], capsys, monkeypatch)
    assert code == 2 and len(error_lines(err)) == 1 and "no such file" in err


def test_cli_calibrate_then_predict_with_the_profile(tmp_path, capsys, monkeypatch):
    config, profile = tmp_path / "tiny.json", tmp_path / "mine.json"
    config.write_text(json.dumps(CONFIG))
    steady_timings(monkeypatch)
    code, out, err = run_cli(["predict", "--calibrate", "--model", config, "--tp", "1,2", "--batch", "1", "--prompt", "16",
                              "--gen", "4", "--profile", profile, "--device", "cpu", "--cache-dir", tmp_path / "c"],
                             capsys, monkeypatch)
    assert code == 0, err
    assert "fit: weights" in out and f"wrote {profile}" in out.replace("\n", "")
    code, out, err = run_cli(["predict", "--model", config, "--tp", "2", "--batch", "1", "--prompt", "16", "--gen", "4",
                              "--profile", profile, "--schedules", "dense,ladder", "--json", tmp_path / "p.json",
                              "--interconnect", cpu_fabric(tmp_path)], capsys, monkeypatch)
    assert code == 0, err
    record = json.loads((tmp_path / "p.json").read_text())
    assert record["compute"]["device"] == json.loads(profile.read_text())["gpu"]["name"]
    assert record["interconnect"]["name"] == "cpu-fabric"  # no all-reduce measured on one device
    # Issue 35: a CPU's profile against a GPU fabric (the default h100-nvlink) is CPU compute against NVLink: refused.
    code, out, err = run_cli(["predict", "--model", config, "--tp", "2", "--batch", "1", "--prompt", "16", "--gen", "4",
                              "--profile", profile], capsys, monkeypatch)
    (line,) = error_lines(err)
    assert code == 2 and "calibrated on a CPU" in line and "GPU fabric" in line


def test_a_noisy_calibration_is_refused_and_writes_nothing(tmp_path, capsys, monkeypatch):
    """Issue 37 item 2: a CPU calibration whose worst fit error was +40,275% exited 0 and wrote the profile."""
    config, profile = tmp_path / "tiny.json", tmp_path / "noisy.json"
    config.write_text(json.dumps(CONFIG))
    steady_timings(monkeypatch, noise={("attention", 2): 40.0})  # one module 40x off: a loaded machine
    code, out, err = run_cli(["predict", "--calibrate", "--model", config, "--tp", "1,2", "--batch", "1,2", "--prompt",
                              "16", "--gen", "4", "--profile", profile, "--device", "cpu", "--cache-dir", tmp_path / "c"],
                             capsys, monkeypatch)
    (line,) = error_lines(err)
    assert code == 2 and "the fit misses" in line and "limit" in line and not profile.exists()


def test_a_bad_profile_is_refused_by_predict(calibrated, tmp_path, capsys, monkeypatch):
    """Issue 37 item 2: ``--profile`` with a profile written before the check (a bad fit) predicted without a word."""
    out, _, _ = calibrated
    data = json.loads(out.read_text())
    data["timings"][0]["error"] = 402.756  # as the profile: +40,275.6%
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    config = tmp_path / "tiny.json"
    config.write_text(json.dumps(CONFIG))
    code, _, err = run_cli(["predict", "--model", config, "--tp", "2", "--batch", "1", "--prompt", "16", "--gen", "4",
                            "--profile", bad], capsys, monkeypatch)
    (line,) = error_lines(err)
    assert code == 2 and f"profile {bad} refused" in line and "+40,275.6%" in line
