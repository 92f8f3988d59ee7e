"""Run by tests/adapt/test_optimizer_step.py under torchrun (2 CPU processes, gloo): the step stack's fp16 loss
scaling over FSDP2 shards. A step with finite gradients equals plain AdamW on the whole model; a step where one rank's
shard of a gradient is not finite is skipped on every rank, and the scale backs off on every rank."""

import json

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

from ladderize.adapt.train.optimizer_step import OptimizerStep
from ladderize.checkpoint.placement import TrainingPrecision

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
whole = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
sharded = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
sharded.load_state_dict(whole.state_dict())
for layer in (sharded[0], sharded[2]):
    fully_shard(layer)
fully_shard(sharded)
reference = torch.optim.AdamW(whole.parameters(), lr=0.05)
optimizer = torch.optim.AdamW(sharded.parameters(), lr=0.05)
stack = OptimizerStep(optimizer, list(sharded.parameters()), torch.device("cpu"), TrainingPrecision(torch.float16, False),
                      casts_parameters=True, sharded=True)
x = torch.randn(4, 6)


def full(model):
    return torch.cat([(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().flatten() for p in model.parameters()])


# a finite step: the same update as plain AdamW on the whole model
whole(x).square().mean().backward()
torch.nn.utils.clip_grad_norm_(whole.parameters(), 0.05)
reference.step()
stack.backward(sharded(x).square().mean())
stack.clip(0.05)
stack.step()
finite_diff = (full(whole) - full(sharded)).abs().max().item()
scale_after_finite = stack.scaler.get_scale()

# a step whose gradient is not finite in rank 1's shard only: skipped everywhere
before = full(sharded)
stack.backward(sharded(x).square().mean())
if rank == 1:
    sharded[0].weight.grad.to_local().view(-1)[0] = float("inf")
stack.clip(0.05)
stack.step()
report = {"rank": rank, "finite_diff": finite_diff, "scale_after_finite": scale_after_finite,
          "skipped": torch.equal(before, full(sharded)), "scale_after_inf": stack.scaler.get_scale()}
reports = [None] * dist.get_world_size()
dist.all_gather_object(reports, report)
if rank == 0:  # one line: the processes' prints could interleave
    print(json.dumps(reports))
dist.destroy_process_group()
