"""The step stack every strategy's run shares (``optimizer_step.OptimizerStep``): fp16's loss scaling gives plain
AdamW's update where the gradients are finite and skips the step where they are not, on one process and agreed by
every process over FSDP2 shards; the clip measures the global norm of sharded gradients as of whole ones."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from ladderize.adapt.train.optimizer_step import OptimizerStep, clip_gradients
from ladderize.checkpoint.placement import TrainingPrecision


def _pair(seed: int = 0) -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(seed)
    whole = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    copy = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    copy.load_state_dict(whole.state_dict())
    return whole, copy


def test_fp16_loss_scaling_on_one_process_steps_as_adamw_and_skips_a_step_that_is_not_finite():
    whole, scaled = _pair()
    reference = torch.optim.AdamW(whole.parameters(), lr=0.05)
    optimizer = torch.optim.AdamW(scaled.parameters(), lr=0.05)
    stack = OptimizerStep(optimizer, list(scaled.parameters()), torch.device("cpu"), TrainingPrecision(torch.float16, False),
                          casts_parameters=True, sharded=False)
    x = torch.randn(4, 6)
    whole(x).square().mean().backward()
    torch.nn.utils.clip_grad_norm_(whole.parameters(), 0.05)
    reference.step()
    stack.backward(scaled(x).square().mean())
    assert scaled[0].weight.grad.abs().max() > 1000 * whole[0].weight.grad.abs().max()  # scaled before the clip
    stack.clip(0.05)
    stack.step()
    for mine, theirs in zip(scaled.parameters(), whole.parameters()):
        torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-7)
        assert mine.grad is None  # dropped after the step
    scale = stack.scaler.get_scale()

    before = [p.detach().clone() for p in scaled.parameters()]
    stack.backward(scaled(x).square().mean())
    scaled[2].bias.grad[0] = float("nan")
    stack.clip(0.05)
    stack.step()
    assert all(torch.equal(a, b) for a, b in zip(before, scaled.parameters()))
    assert stack.scaler.get_scale() == scale / 2


def test_no_loss_scaling_outside_fp16_and_autocast_only_where_the_run_holds_float32_parameters():
    _, model = _pair()
    optimizer = torch.optim.AdamW(model.parameters())
    seen = []

    class Probe(torch.nn.Module):
        def forward(self, x):
            seen.append(torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None)
            return {"total": model(x).square().mean()}

    bf16 = TrainingPrecision(torch.bfloat16, False)
    for casts, expected in ((False, torch.bfloat16), (True, None)):
        stack = OptimizerStep(optimizer, list(model.parameters()), torch.device("cpu"), bf16, casts_parameters=casts)
        assert stack.scaler is None
        losses = stack.forward(Probe(), torch.randn(2, 6))
        assert seen[-1] == expected and losses["total"].dtype == torch.float32
    plain = OptimizerStep(optimizer, list(model.parameters()), torch.device("cpu"))  # the sequential stage's
    assert plain.scaler is None and plain.autocast is None
    plain.forward(Probe(), torch.randn(2, 6))
    assert seen[-1] is None


def test_fp16_loss_scaling_over_fsdp2_shards_agrees_on_every_process():
    worker = Path(__file__).with_name("loss_scale_worker.py")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(worker)], env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    reports = json.loads(done.stdout.strip().splitlines()[-1])
    assert sorted(report["rank"] for report in reports) == [0, 1]
    for report in reports:
        assert report["finite_diff"] <= 1e-7
        assert report["skipped"], report  # rank 0's own shards were finite: it skips by the shared verdict
        assert report["scale_after_inf"] == report["scale_after_finite"] / 2


def test_the_clip_of_whole_gradients_is_torch_s():
    whole, copy = _pair()
    x = torch.randn(4, 6)
    whole(x).square().sum().backward()
    copy(x).square().sum().backward()
    expected = torch.nn.utils.clip_grad_norm_(whole.parameters(), 0.01)
    assert torch.equal(clip_gradients(list(copy.parameters()), 0.01), expected)
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(whole.parameters(), copy.parameters()))
