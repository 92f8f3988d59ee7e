"""Minimal reproducer (plain torch, no vLLM): inductor fuses a reader of a custom op's output ahead of the op.

A custom op that writes into a preallocated output -- ``(Tensor(a!) c, Tensor a, Tensor b) -> ()``, called on
``torch.empty`` exactly as vLLM's CPU GEMM ``_C.onednn_mm`` is -- feeds a Ladder-Residual layer loop:

    r_k = r_{k-1} + f_k(norm_k(r_{k-2}))      (a module reads the residual one module late)

Eager and ``torch.compile(dynamic=True)`` must agree to float32 rounding. With torch 2.13.0 on CPU the dense
flow (``norm_k(r_{k-1})``) does, the ladder flow does not (max |diff| about 9 at 6 layers): the generated
code fuses ``r_k = r_{k-1} + y_k`` into the kernel that computes ``norm(r_{k-1})``, which runs before the
custom op has written ``y_k`` -- the read of the mutated output lost its dependency on the mutation.
Fewer layers (1 or 2) happen to schedule correctly; ``torch._inductor.config.max_fusion_size = 1`` (no
fusion) or a functional op (``torch.mm``) instead of the out-variant op both give the right answer.

    python lab/repro_inductor_mutated_output_fusion.py            # exits 1 while the bug is there
    python lab/repro_inductor_mutated_output_fusion.py --functional  # the workaround: exits 0

This is why ladderize's vLLM plugin routes linear layers through ``F.linear`` when it compiles a ladder or
SPD layout on CPU (``ladderize/runtime/vllm/model.py``, ``FUNCTIONAL_LINEARS_WHEN_COMPILED``).
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

torch.library.define("ladderize_repro::mm_out", "(Tensor(a!) c, Tensor a, Tensor b) -> ()")


@torch.library.impl("ladderize_repro::mm_out", "CPU")
def _mm_out(c, a, b):
    torch.mm(a, b, out=c)


@torch.library.register_fake("ladderize_repro::mm_out")
def _mm_out_fake(c, a, b):
    return None


def linear_out_variant(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """vLLM's CPU linear in shape: allocate the output, let the op write into it."""
    out = torch.empty(x.shape[0], w.shape[1], dtype=x.dtype)
    torch.ops.ladderize_repro.mm_out(out, x, w)
    return out


def norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--functional", action="store_true", help="use torch.mm (the workaround)")
    args = parser.parse_args()
    linear = (lambda x, w: torch.mm(x, w)) if args.functional else linear_out_variant
    torch.manual_seed(0)
    d = 128
    weights = [(torch.randn(d, d) * 0.08, torch.randn(d, d) * 0.08, torch.rand(d) + 0.5, torch.rand(d) + 0.5)
               for _ in range(args.layers)]

    def forward(x: torch.Tensor, ladder: bool) -> torch.Tensor:
        residual = stale = x
        for w_attn, w_mlp, n1, n2 in weights:
            y = linear(norm(stale if ladder else residual, n1), w_attn)
            stale, residual = residual, residual + y
            y = linear(norm(stale if ladder else residual, n2), w_mlp)
            stale, residual = residual, residual + y
        return residual

    x = torch.randn(8, d)
    result = {"torch": torch.__version__, "layers": args.layers, "functional": args.functional}
    for flow in ("dense", "ladder"):
        eager = forward(x, flow == "ladder")
        compiled = torch.compile(lambda t, flow=flow: forward(t, flow == "ladder"), dynamic=True)(x)
        result[f"{flow}_max_abs_diff"] = (eager - compiled).abs().max().item()
    print(json.dumps(result))
    return 0 if max(result["dense_max_abs_diff"], result["ladder_max_abs_diff"]) < 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
