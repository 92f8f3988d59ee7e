"""Precision, loss scaling, clipping and the optimizer step: one stack under every strategy's run (``trainer.Trainer``
drives it; the run only wraps its model and synchronises its gradients) and under the sequential stage's layers
(``layer_training.train_layer``), each piece a plain torch call, torchtitan's way:

- **The forward's precision** (``placement.training_precision``): a run that holds float32 parameters computes under
  ``torch.autocast`` in the compute dtype; a run whose parameters reach the forward already cast (FSDP2's
  ``MixedPrecisionPolicy``: ``JointRun.casts_parameters``) computes as it is. Autocast losses come out in float32.
- **Loss scaling** under fp16 (``torch.amp.GradScaler``): the loss is scaled before its backward, the gradients
  unscaled before the clip, and a step whose gradients hold an inf or a NaN is skipped with a smaller scale. Where the
  gradients are sharded (``StrategyEntry.shards``) each process sees only its shards, so the processes agree on a skip
  (``ShardedGradScaler``: one all-reduce of the verdict).
- **The clip** measures the global 2-norm of the gradients, of sharded ones (DTensors) too (``clip_gradients``).
- **The step**: AdamW's step (through the scaler under fp16), then the gradients dropped.
"""

from __future__ import annotations

from typing import Any

import torch

from ...checkpoint.placement import TrainingPrecision


class OptimizerStep:
    """What every run's step does around its forward and backward: ``forward`` (autocast where the run's parameters are
    float32), ``backward`` (scaled under fp16), ``clip``, ``step``; ``scaler`` is the fp16 loss scaler (None
    otherwise), a stateful object of the training state. Without a ``precision`` (the sequential stage, which
    autocasts each layer's forward itself and takes no fp16) it is the backward, the clip and the step alone."""

    def __init__(self, optimizer: torch.optim.Optimizer, params: list[torch.nn.Parameter], device: torch.device,
                 precision: TrainingPrecision | None = None, *, casts_parameters: bool = False, sharded: bool = False):
        self.optimizer, self.params, self.device = optimizer, params, device
        self.autocast = None if casts_parameters else precision
        self.scaler: Any = None
        if precision is not None and precision.autocast is torch.float16:
            if sharded:
                from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

                self.scaler = ShardedGradScaler(device.type)
            else:
                self.scaler = torch.amp.GradScaler(device.type)

    def forward(self, module: torch.nn.Module, *inputs: Any) -> dict[str, torch.Tensor]:
        """``module(*inputs)``'s losses (a dict of tensors), under the run's autocast where it has one, and then in
        float32."""
        if self.autocast is None:
            return module(*inputs)
        with self.autocast.context(self.device):
            losses = module(*inputs)
        return {name: value.float() for name, value in losses.items()}

    def backward(self, loss: torch.Tensor) -> None:
        """The backward of ``loss``, scaled under fp16."""
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def clip(self, max_norm: float) -> torch.Tensor:
        """Clip the gradients (unscaled first under fp16) to the global 2-norm ``max_norm``; returns the norm."""
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        return clip_gradients(self.params, max_norm)

    def step(self) -> None:
        """AdamW's step (skipped, with a smaller scale, where fp16 gradients are not finite), then the gradients
        dropped."""
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def clip_gradients(params: list[torch.nn.Parameter], max_norm: float) -> torch.Tensor:
    """Clip the gradients of ``params`` (plain tensors, or DTensor shards) to the global 2-norm ``max_norm``
    (``torch.nn.utils.clip_grad_norm_``'s arithmetic); returns the norm."""
    from torch.distributed.tensor import DTensor

    grads = [p.grad for p in params if p.grad is not None]
    total = torch.nn.utils.get_total_norm(grads, 2.0)
    if isinstance(total, DTensor):  # each rank's norm of its shards: the full tensor is the global norm
        total = total.full_tensor()
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return total
