"""Linear kernels: weights prepacked once for oneDNN on CPU, or plain ``F.linear``.

On CPU, ``F.linear`` in bfloat16 runs through oneDNN and converts the ``[out, in]`` weight
to oneDNN's blocked layout on *every* call; in decode (one row per step) that conversion
costs about as much as the product itself. ``prepack`` does the conversion once, at load
time (``torch.ops.mkldnn._reorder_linear_weight``), and ``packed_linear`` then runs the
product on the packed weight (``torch.ops.mkldnn._linear_pointwise``, the kernel inductor
uses for frozen CPU linears). In bfloat16 the result is bit-identical to ``F.linear``; in
float32 it replaces MKL's sgemv by oneDNN's, which sums in another order (differences of
order 1e-7 relative). The packed weight is an opaque ``torch._mkldnn`` tensor: it serves
only ``packed_linear``, so the dense weights stay where anything else needs them.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

LinearFn = Callable[[torch.Tensor, torch.Tensor, "torch.Tensor | None"], torch.Tensor]


def can_prepack(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether oneDNN can run packed linears for ``dtype`` on ``device`` (CPU, float32 or bfloat16)."""
    if device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    if dtype == torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return dtype == torch.float32


def prepack(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` [out, in] in oneDNN's layout for ``packed_linear`` (chosen for one-row inputs: decode)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), 1)


def packed_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, W, bias)`` for a weight from ``prepack``; ``x`` is ``[..., in]``."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def linear_kernel(packed: bool) -> LinearFn:
    """The linear that matches how the weights are stored."""
    return packed_linear if packed else F.linear


__all__ = ["LinearFn", "can_prepack", "linear_kernel", "packed_linear", "prepack"]
