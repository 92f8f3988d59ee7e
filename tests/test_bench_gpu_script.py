"""benchmarks/bench_gpu.py without a GPU: its arguments, its refusal (one line, exit 2), the JSON record (atomic, no
overwrite without --force) and the plot run anywhere; the GPU parts are not run here."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench_gpu():
    spec = importlib.util.spec_from_file_location("bench_gpu", ROOT / "benchmarks" / "bench_gpu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_arguments(bench_gpu):
    args = bench_gpu.parse_args(["--out", "x/run", "--batches", "1,16", "--modes", "eager,graphs+compile", "--skip", "adapt"])
    assert args.batches == (1, 16) and args.modes == ["eager", "graphs+compile"] and args.skip == {"adapt"}
    assert args.shapes == ["llama-1b", "llama-8b"] and args.prompt == 128
    quick = bench_gpu.parse_args(["--quick"])
    assert quick.shapes == ["llama-1b"] and quick.batches == (1,) and quick.repeats == 1
    for bad in (["--modes", "turbo"], ["--skip", "everything"], ["--gen", "1"], ["--batches", "one"], ["--shapes", "llama-3b-typo"],
                ["--warmup", "0"]):
        with pytest.raises(SystemExit) as info:
            bench_gpu.parse_args(bad)
        assert info.value.code == 2


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where torch sees no CUDA device")
def test_refuses_without_cuda_in_one_line(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_gpu.py"), "--out", str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 2
    assert done.stderr.strip() == "bench_gpu: needs a CUDA device (torch sees none); nothing was run"
    assert not list(tmp_path.iterdir())


def test_record_and_plot(bench_gpu, tmp_path):
    rows = [{"shape": s, "batch": b, "mode": m, "prompt": 128, "gen": 64, "decode_ms_per_token": t, "floor_ms_per_token": 4.98}
            for s in ("llama-1b", "llama-8b") for b in (1, 16) for m, t in (("eager", 19.0), ("graphs+compile", 7.2))]
    record = {"record": bench_gpu.RECORD, "device_name": "test", "torch": torch.__version__, "decode": {"rows": rows}}
    stem = tmp_path / "out" / "bench_gpu"
    path = bench_gpu.write_record(record, stem, force=False)
    assert json.loads(path.read_text()) == record
    with pytest.raises(SystemExit, match="exists; pass --force"):
        bench_gpu.write_record(record, stem, force=False)
    bench_gpu.write_record({**record, "torch": "other"}, stem, force=True)
    assert json.loads(path.read_text())["torch"] == "other"
    png = bench_gpu.plot(record, stem.with_suffix(".png"))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in png.parent.iterdir()) == ["bench_gpu.json", "bench_gpu.png"]  # no temp files left
