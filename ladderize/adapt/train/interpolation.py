"""Weight interpolation (WiSE-FT): a joint stage's output moved part of the way back to the weights it started from.

``interpolate=ALPHA`` on a joint stage (``--stage kd:lr=5e-4,interpolate=0.75``) writes
``(1 - ALPHA) * start + ALPHA * trained`` for every parameter, where ``start`` is the checkpoint
the stage read (for the default recipe's kd stage: the sequential stage's output). The trained
end fits the calibration text most closely; the way back trades some of that fit for text the
stage never saw. Measured (docs/adapt-measurements.md, "Weight interpolation" and "Every kd variant on one
stage 1"): on ladder 15-29 at the 30m plan, kd at lr 5e-4 then ``interpolate=0.75`` is within the
batch-order noise of kd at the default rate; on ladder 10-29 at the 60m plan it loses LAMBADA, so it
is a setting, not a default.

The interpolation reads the start from disk after training, so resuming a killed stage changes
nothing; it is refused where the start on disk is not the weights training began from (head
grouping permutes heads first) and for the sequential stage (its output is assembled layer by layer).
"""

from __future__ import annotations

import torch

from ...errors import LadderizeError


def interpolate_weights(start: dict[str, torch.Tensor], end: dict[str, torch.Tensor], alpha: float) -> dict[str, torch.Tensor]:
    """``(1 - alpha) * start + alpha * end`` for every floating-point tensor (computed in fp32, kept in ``end``'s dtype
    and device); other tensors are ``end``'s. The two must hold the same names and shapes."""
    if start.keys() != end.keys() or any(start[k].shape != end[k].shape for k in end):
        raise LadderizeError("the two sets of weights hold different parameters: interpolate checkpoints of one layout")
    return {k: torch.lerp(start[k].to(v.device, torch.float32), v.float(), alpha).to(v.dtype) if v.is_floating_point() else v
            for k, v in end.items()}


def toward_start(model: torch.nn.Module, checkpoint: str, alpha: float) -> torch.nn.Module:
    """``model`` with its weights set to ``interpolate_weights(checkpoint's, model's, alpha)`` (in place)."""
    from ...checkpoint.io import load_model

    start = load_model(checkpoint, dtype=torch.float32).state_dict()
    with torch.no_grad():
        model.load_state_dict(interpolate_weights(start, model.state_dict(), alpha))
    return model
