"""Run by tests/adapt/test_fsdp_teacher.py under torchrun (2 CPU processes, gloo): a sharded teacher computes what
the whole teacher computes, and each rank holds half of it; the blockwise kd loss gathers its head once, not per block."""

import json
import sys

import torch
import torch.distributed as dist
import torch.distributed.fsdp._fully_shard._fsdp_param_group as param_group

from ladderize.adapt.objectives import registry as objective_registry
from ladderize.adapt.train.sharded import _sharded_model
from ladderize.adapt.objectives.losses import blockwise_head_losses, teacher_kd_block_loss
from ladderize.adapt.train.fsdp import head_gathered
from ladderize.convert.residual_states import embed, logits_from, run_layers
from ladderize.checkpoint.io import load_config, load_model


def kd_of_heads(student, final, teacher, teacher_final):
    """The blockwise kd loss of ``student``'s head over ``final`` against ``teacher``'s over ``teacher_final``, the
    heads kept gathered as the sharded training keeps them."""
    heads = {"kd": lambda: (teacher_kd_block_loss(teacher, teacher_final, 1.0, "forward", 0, False, "cpu"),
                            final.shape[0] * final.shape[1])}
    return blockwise_head_losses(student, final, heads, (teacher,), head_gathered)["kd"]


def logits(model, ids):
    state, kwargs = embed(model, ids)
    state = run_layers(model, state, kwargs, 0, model.config.num_hidden_layers)
    return logits_from(model, state[0])


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
whole = load_model(sys.argv[1])
full_numel = sum(p.numel() for p in whole.parameters())
# the sharded training's teacher: built on the meta device, each unit sharded, each rank reading its rows
sharded = _sharded_model(load_config(sys.argv[1]), sys.argv[1], torch.float32, torch.device("cpu"), ())
local_numel = sum(p.to_local().numel() for p in sharded.parameters())
ids = torch.randint(3, 100, (2, 24), generator=torch.Generator().manual_seed(rank))
with torch.no_grad():
    diff = (logits(whole, ids) - logits(sharded, ids)).abs().max().item()
kinds = sorted({type(p).__name__ for p in sharded.parameters()})

# the kd loss in blocks of 16 tokens (3 blocks here): FSDP2's all-gathers, counted where its param groups call them
gathers = []
all_gather = param_group.foreach_all_gather
param_group.foreach_all_gather = lambda *args, **kwargs: gathers.append(1) or all_gather(*args, **kwargs)
objective_registry.LOGIT_BLOCK_BYTES = 4 * whole.config.vocab_size * 16
final = torch.randn(2, 24, whole.config.hidden_size, generator=torch.Generator().manual_seed(7))
student_final = final + 0.1
kd_sharded = kd_of_heads(whole, student_final, sharded, final).item()
kd_whole = kd_of_heads(whole, student_final, whole, final).item()
if rank == 0:
    print(json.dumps({"world": world, "diff": diff, "full": full_numel, "local": local_numel, "kinds": kinds,
                      "kd_diff": abs(kd_sharded - kd_whole), "kd_gathers": len(gathers)}), flush=True)
dist.destroy_process_group()
