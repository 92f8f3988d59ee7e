"""--device/--dtype: every command that computes takes them, and a bad one is one line and exit 2 before any work."""

from __future__ import annotations

import json
import time

import pytest

from tests.cli_helpers import error_lines, run_cli

COMMANDS = {
    "convert": ["convert", "missing-src", "{tmp}/out", "--head-grouping"],
    "adapt": ["adapt", "missing-ckpt", "{tmp}/out"],
    "sample": ["sample", "missing-src", "{tmp}/out.jsonl"],
    "sensitivity": ["sensitivity", "missing-src", "--spd-tp", "2", "--json", "{tmp}/s.json"],
    "eval": ["eval", "missing-ckpt", "--tasks", "shakespeare"],
    "generate": ["generate", "missing-ckpt", "--prompt", "hi"],
    "bench": ["bench", "--synthetic", "tiny", "--tp", "1", "--batch", "1"],
    "predict": ["predict", "--model", "llama-3.1-8b", "--compute", "measured"],
    "demo": ["demo", "--out", "{tmp}/demo"],
}


def _args(name: str, tmp_path) -> list[str]:
    return [part.replace("{tmp}", str(tmp_path)) for part in COMMANDS[name]]


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_device_and_dtype_typos_are_one_line_at_once(name, tmp_path, capsys, monkeypatch):
    for option, value, message in (("--device", "cudda", "unknown device 'cudda'"), ("--dtype", "fp13", "unknown dtype 'fp13'")):
        started = time.perf_counter()
        code, _, stderr = run_cli([*_args(name, tmp_path), option, value], capsys, monkeypatch)
        lines = error_lines(stderr)
        assert code == 2 and len(lines) == 1 and message in lines[0], (name, stderr)
        assert time.perf_counter() - started < 5  # < 1 s idle: nothing is loaded before the check


@pytest.mark.parametrize("name", ["adapt", "convert", "demo", "eval", "predict", "sample", "sensitivity", "bench"])
def test_cuda_without_a_gpu_is_one_line(name, tmp_path, capsys, monkeypatch):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    code, _, stderr = run_cli([*_args(name, tmp_path), "--device", "cuda"], capsys, monkeypatch)
    lines = error_lines(stderr)
    assert code == 2 and len(lines) == 1 and "torch sees no CUDA device" in lines[0], stderr


def test_predict_pipeline_from_python_matches_the_command(tmp_path, capsys, monkeypatch):
    from ladderize.predict.pipeline import run_prediction

    path = tmp_path / "p.json"
    code, _, stderr = run_cli(["predict", "--model", "llama-3.1-8b", "--tp", "1,2", "--batch", "1,4", "--compute", "roofline",
                               "--json", path], capsys, monkeypatch)
    assert code == 0, stderr
    result = run_prediction(model="llama-3.1-8b", tp="1,2", batch="1,4", compute="roofline")
    assert json.loads(json.dumps(result.to_record().to_json()))["rows"] == json.loads(path.read_text())["rows"]
