"""An exponential moving average of the trained weights (``ema=DECAY`` on a joint stage).

After every optimizer step, ``average = decay * average + (1 - decay) * weights`` for each
trained parameter; the stage writes the average instead of its last weights. The average
starts at the weights the stage starts from (the first step's ``average`` is
``decay * start + (1 - decay) * weights_1``), with no bias correction, so after ``n`` steps the
start keeps a share of ``decay ** n``: it averages the end of the trajectory and, on a short
stage, pulls part of the way back to the start, as ``interpolate`` does in one step.

The average is part of the training state: a stateful object (``state_dict``, ``load_state_dict``) in the distributed
checkpoint of the parameters and AdamW in ``RUN_DIR/state/`` (``training_state.save_joint_state``), so a resumed
stage writes the same bytes as an uninterrupted one. It is kept in float32 on the parameters' device.

Measured (docs/adapt-measurements.md, "Every kd variant on one stage 1"): on SmolLM2-135M's ladder 15-29 and
10-29 kd stages its gains are within the spread of a second batch order, so it is a setting and the
default recipe does not set it.
"""

from __future__ import annotations

import torch

from ...errors import LadderizeError

class WeightEMA:
    """The moving average of ``params`` (named ``0``, ``1``, ... in their order)."""

    def __init__(self, params: list[torch.nn.Parameter], decay: float):
        self.params = params
        self.decay = decay
        self.average = [p.detach().float().clone() for p in params]

    @torch.no_grad()
    def update(self) -> None:
        """Move the average ``1 - decay`` of the way to the current weights."""
        current = [p.detach().float() for p in self.params]
        torch._foreach_lerp_(self.average, current, 1.0 - self.decay)

    @torch.no_grad()
    def write_into(self) -> None:
        """Set the parameters to the average (in their own dtype)."""
        for param, average in zip(self.params, self.average):
            param.copy_(average.to(param.dtype))

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The average, one tensor per parameter (``"0"``, ``"1"``, ...): what the training state holds of it."""
        return {str(i): average for i, average in enumerate(self.average)}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Take the average ``state`` holds (a resumed stage); it must hold these parameters' shapes."""
        if len(state) != len(self.average) or any(state[str(i)].shape != a.shape for i, a in enumerate(self.average)):
            raise LadderizeError("the saved average of the weights does not match the trained parameters; start again "
                                 "with --force")
        self.average = [state[str(i)].to(a.device, torch.float32) for i, a in enumerate(self.average)]
