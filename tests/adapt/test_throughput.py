"""A run's pace: model FLOPs per token, MFU, the plan and projection lines (``adapt/plan/throughput.py``)."""

from __future__ import annotations

import torch

from ladderize.adapt.plan.throughput import MFU_FORMULA, Throughput, peak_flops_per_s, plan_line


def test_mfu_is_model_flops_over_the_processes_peak():
    pace = Throughput(processes=8, flops_per_token=6_000_000_000, peak_flops_per_s=989e12)
    record = pace.record(tokens=8 * 10_000 * 60, train_s=60.0)  # 10,000 tokens/s per process
    assert record["tokens_per_s"] == 80_000 and record["tokens_per_s_per_process"] == 10_000
    assert abs(record["mfu"] - 6e9 * 80_000 / (8 * 989e12)) < 1e-4 and record["mfu_formula"] == MFU_FORMULA
    assert "MFU 6.1%" in pace.per_process(80_000) and "10,000 tok/s/process" in pace.per_process(80_000)
    cpu = Throughput(processes=1, flops_per_token=1, peak_flops_per_s=None)
    assert "mfu" not in cpu.record(100, 1.0) and cpu.per_process(100.0) == ""  # no peak, no MFU; one process says nothing more
    assert peak_flops_per_s(torch.device("cpu")) is None


def test_plan_line_names_the_budget_and_its_parts():
    from ladderize.adapt.plan.batches import StepSplit

    line = plan_line(3_000_000_000, 715, StepSplit(1024, 8, 32), 4096)
    assert line == ("plan: 3,000,000,000 tokens = 715 steps x 1,024 sequences "
                    "(batch 1024 = 4 per process x 8 processes x 32 accumulated) x 4096 tokens")


def test_max_steps_stops_with_the_state_saved_and_resume_finishes_bit_identically(ladder_dir, text_file, tmp_path, capsys,
                                                                                   monkeypatch):
    import json

    from safetensors.torch import load_file

    from tests.cli_helpers import run_cli

    monkeypatch.setenv("LADDERIZE_PROGRESS_INTERVAL", "0")
    common = ["--data", text_file, "--objective", "kd", "--tokens", 8 * 2 * 32, "--seq-len", 32, "--batch-size", 2,
              "--lr", "1e-3", "--save-every", 5]
    code, _, stderr = run_cli(["adapt", ladder_dir, tmp_path / "whole", *common], capsys, monkeypatch)
    assert code == 0, stderr
    code, stdout, stderr = run_cli(["adapt", ladder_dir, tmp_path / "cut", *common, "--max-steps", 3], capsys, monkeypatch)
    assert code == 0, stderr
    assert "stopped after 3 step(s) (--max-steps 3)" in stdout and not (tmp_path / "cut").exists()
    state = json.loads((tmp_path / "cut.adapt-run" / "state" / "trainer_state.json").read_text())
    assert state["step"] == 3  # saved at the stop, not at the last --save-every (none yet)
    code, _, stderr = run_cli(["adapt", ladder_dir, tmp_path / "cut", *common, "--resume"], capsys, monkeypatch)
    assert code == 0 and "resumed from step 3" in stderr, stderr
    whole, cut = load_file(tmp_path / "whole" / "model.safetensors"), load_file(tmp_path / "cut" / "model.safetensors")
    assert whole.keys() == cut.keys() and all(torch.equal(whole[k], cut[k]) for k in whole)
    record = json.loads((tmp_path / "whole" / "ladderize.json").read_text())["history"][-1]["throughput"]
    assert record["processes"] == 1 and record["tokens_per_s"] > 0 and "mfu" not in record  # CPU: no peak to divide by
