"""Which kernel runs the runtime's linears, and the weights in the form each kernel wants.

- ``gemv``: ``gemv.c`` for inputs of at most 8 rows (decode), ``F.linear`` for longer ones
  (prefill); dense weights. It streams the weights in order and is the fastest decode on
  CPU (see ``gemv.py``). It sums in another order than torch's kernels, so bfloat16 outputs
  can differ from ``F.linear``'s in the last bit.
- ``onednn``: the projections and the LM head converted once, at load time, to oneDNN's
  blocked layout (``torch.ops.mkldnn._reorder_linear_weight``) and multiplied with
  ``torch.ops.mkldnn._linear_pointwise``, the kernel inductor uses for frozen CPU linears.
  ``F.linear`` in bfloat16 runs on oneDNN too but converts the weight on *every* call,
  which in decode costs about as much as the product; packed, the products are
  bit-identical to ``F.linear``'s in bfloat16. The packed weights are opaque
  ``torch._mkldnn`` tensors and the embedding stays dense, so a tied LM head is held twice.
- ``aten``: plain ``F.linear`` (GPU, ``torch.compile``, and wherever the others cannot run).

``auto`` picks, in bfloat16, the first of gemv, onednn, aten that can run on the device; in
float32, gemv where it runs its AVX512 build, else aten. Measured on an AVX2-only EPYC (no
AVX512), 12-layer hidden-512 model, one thread, decode ms/token: float32 aten 28.2, gemv (AVX2)
28.8, onednn 33.6 (MKL's sgemv already streams float32 weights as fast as gemv.c, and oneDNN's
packed call costs more per product); bfloat16 gemv (AVX2) 24.7, aten 26.6 (``F.linear`` in
bfloat16 converts the weight on every call).
"""

from __future__ import annotations

import enum
from dataclasses import replace
from typing import Callable

import torch
import torch.nn.functional as F

from ..errors import LadderizeError, parse_choice
from . import gemv as gemv_kernel
from .weights import RankWeights

LinearFn = Callable[[torch.Tensor, torch.Tensor, "torch.Tensor | None"], torch.Tensor]


class LinearKernel(str, enum.Enum):
    AUTO = "auto"
    GEMV = "gemv"
    ONEDNN = "onednn"
    ATEN = "aten"

    @classmethod
    def parse(cls, text: "str | LinearKernel") -> "LinearKernel":
        return parse_choice(cls, text, "linear kernel")


def can_prepack(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether oneDNN can run packed linears for ``dtype`` on ``device`` (CPU, float32 or bfloat16)."""
    if device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    if dtype == torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return dtype == torch.float32


def _unavailable(kernel: LinearKernel, device: torch.device, dtype: torch.dtype) -> str | None:
    """Why ``kernel`` cannot run ``dtype`` on ``device``; None when it can."""
    if kernel is LinearKernel.ATEN:
        return None
    if device.type != "cpu":
        return f"--linear {kernel.value} runs on CPU only"
    if kernel is LinearKernel.ONEDNN:
        return None if can_prepack(device, dtype) else f"oneDNN cannot pack {dtype} linears here"
    return None if gemv_kernel.available(dtype) else f"gemv is unavailable: {gemv_kernel.unavailable_reason()}"


def auto_order(dtype: torch.dtype) -> tuple[LinearKernel, ...]:
    """The kernels ``auto`` tries before aten, best first, for ``dtype`` on this CPU (see the module docstring)."""
    if dtype == torch.float32:
        return (LinearKernel.GEMV,) if gemv_kernel.isa(dtype) == "avx512" else ()
    return (LinearKernel.GEMV, LinearKernel.ONEDNN)


def resolve_kernel(
    requested: "str | LinearKernel", device: torch.device, dtype: torch.dtype, compiled: bool = False
) -> LinearKernel:
    """The kernel to use: ``auto`` becomes the first of gemv, onednn, aten that can run; others are checked.

    Under ``torch.compile`` (``compiled``) it is always aten: inductor chooses its own kernels.
    """
    kernel = LinearKernel.parse(requested)
    if compiled:
        return LinearKernel.ATEN
    if kernel is LinearKernel.AUTO:
        for candidate in auto_order(dtype):
            if _unavailable(candidate, device, dtype) is None:
                return candidate
        return LinearKernel.ATEN
    reason = _unavailable(kernel, device, dtype)
    if reason is not None:
        raise LadderizeError(reason)
    return kernel


def prepack(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` [out, in] in oneDNN's layout for ``packed_linear`` (chosen for one-row inputs: decode)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), 1)


def packed_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, W, bias)`` for a weight from ``prepack``; ``x`` is ``[..., in]``."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def gemv_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear``, through ``gemv.c`` when ``x`` has at most ``gemv.MAX_ROWS`` rows."""
    if x.numel() <= gemv_kernel.MAX_ROWS * x.shape[-1]:
        return gemv_kernel.gemv(x, weight, bias)
    return F.linear(x, weight, bias)


def linear_fn(kernel: LinearKernel) -> LinearFn:
    """The linear of a resolved kernel (weights as ``prepare_weights`` left them)."""
    return {LinearKernel.GEMV: gemv_linear, LinearKernel.ONEDNN: packed_linear}.get(kernel, F.linear)


def prepare_weights(weights: RankWeights, kernel: LinearKernel) -> RankWeights:
    """``weights`` as ``kernel`` wants them: onednn packs every projection and the LM head (not the embedding)."""
    if kernel is not LinearKernel.ONEDNN:
        return weights
    layers = [replace(lw, qkv=prepack(lw.qkv), o=prepack(lw.o), gate_up=prepack(lw.gate_up), down=prepack(lw.down))
              for lw in weights.layers]
    return replace(weights, layers=layers, lm_head=prepack(weights.lm_head))


__all__ = [
    "LinearFn",
    "LinearKernel",
    "auto_order",
    "can_prepack",
    "gemv_linear",
    "linear_fn",
    "packed_linear",
    "prepack",
    "prepare_weights",
    "resolve_kernel",
]
