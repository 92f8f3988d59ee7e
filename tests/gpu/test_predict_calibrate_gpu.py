"""``--compute measured`` and ``--calibrate`` on a CUDA device: the same plumbing the CPU tests run."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none visible to torch)"),
]


def test_measured_compute_times_a_70b_tp8_decode_module_on_the_gpu(tmp_path):
    from ladderize.predict.fit import h100_table, table_shape
    from ladderize.predict.measured import MeasuredCompute
    from ladderize.predict.work import module_work

    compute = MeasuredCompute(cache_dir=tmp_path, device="cuda", repeats=3)
    assert compute.is_gpu and "CUDA graphs" in compute.label
    shape = table_shape(h100_table())
    seconds = compute.module_s(module_work(shape, "mlp", 8, 1, 1, 0))
    assert 5e-6 < seconds < 5e-3 and compute.source(module_work(shape, "mlp", 8, 1, 1, 0)) == "measured"


def test_calibrate_on_the_gpu_writes_a_profile_predict_reads(tmp_path):
    from ladderize.predict.calibrate import load_profile, run_calibration
    from ladderize.predict.presets import load_model_shape

    out = tmp_path / "gpu.json"
    profile = run_calibration(load_model_shape("llama-3.1-8b"), (4, 8), (1, 16), 256, 32, out, cache_dir=tmp_path,
                              device="cuda", repeats=3)
    data = json.loads(out.read_text())
    assert data["gpu"]["name"] == torch.cuda.get_device_name(0)
    assert all(r["source"] == "measured" for r in data["timings"])
    gpu, interconnect = load_profile(out)
    assert gpu.fit.weight_bytes_per_s > 1e11  # any datacenter GPU streams weights faster than 100 GB/s
    assert (interconnect is not None) == (torch.cuda.device_count() > 1)
    # Every timed module within 30% of its fit.
    assert all(abs(r["error"]) < 0.3 for r in data["timings"]), [r for r in data["timings"] if abs(r["error"]) >= 0.3]
    assert profile.gpu == gpu
