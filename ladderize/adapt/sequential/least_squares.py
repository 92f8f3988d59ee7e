"""A closed-form start for the sequential training: ``o_proj`` and ``down_proj`` refit by ridge least squares.

Before a converted layer's first gradient step (``closed_form``, ``sequential_run.py``), each of its two
output projections is refit in turn, ``o_proj`` first, then ``down_proj`` with the new ``o_proj``: the
layer-wise reconstruction that GPTQ and SparseGPT solve, with the Gram matrix of the module's inputs.

For a module with weight ``W`` [D_out, D_in] and input ``Z`` [rows, D_in] on calibration batch b, the
layer's local loss (``objectives.layer_error``, the training's own objective) is a function of the module's
output ``Y = Z W^T`` through the layer's returned states ``(residual, stale)``, to which ``Y`` is added
(``ResidualStream.run``): both modules add their output to the residual, and the stale state the layer
returns is the state after its attention, which holds the attention's output where the attention
all-reduces (an SPD attention leaves the stream unchanged until its MLP). With every other value held
where it is, the loss is a sum of scaled squared errors of states that are affine in ``Y``, so

    loss_b(Y) = alpha_b * ||Y - T_b||^2 + const

autograd gives ``alpha_b`` (half the curvature) and ``T_b = Y_0 - grad_b / (2 alpha_b)`` at the current
output ``Y_0``. Where the loss compares the layer's last state alone, ``T_b`` is the residual the module must
still produce, ``target_out - (layer_out - Y_0)``; with student inputs and an attention that syncs, it is
that residual averaged with the post-attention one, each weighted as the loss weighs it. Over the calibration
set (its batches of ``batch_size`` rows in order, each weighted by its share of the rows) the fit is

    W = argmin  sum_b beta_b ||Z_b W^T - T_b||^2 + lam * ||W - W_0||^2,   lam = ridge * mean(diag(G))

with ``G = sum_b beta_b Z_b^T Z_b`` and ``C = sum_b beta_b Z_b^T T_b`` accumulated in float64 (``NormalEquations``:
memory does not grow with the tokens), solved by Cholesky on the layer's device (the CPU where it has no
float64). The ridge pulls towards the current weights, not towards zero.

``G`` is a mean over the calibration tokens, so a fixed ``ridge`` would weigh the current weights as much against
65,536 tokens as against 8,192. By default ``ridge = PRIOR_TOKENS / tokens``: the current weights count as much as
``PRIOR_TOKENS`` calibration tokens (a Gaussian prior around them). On SmolLM2-135M with ladder on layers 15-29,
WikiText-2 perplexity (16 x 512) after the refit alone, zero-shot 68.8: at 8,192 tokens ridge 0.01 / 0.1 / 1 / 3 / 10
gave 29.9 / 26.9 / 26.3 / 26.9 / 28.4; at 32,768 tokens ridge 0.1 / 1 gave 24.3 / 24.5; at 65,536 tokens ridge
0.01 / 0.125 gave 24.0 / 23.6. A small fixed ridge (0.01) fits the calibration set's tokens, not the text.

Exactness: ``down_proj`` is the layer's last module and its output is linear in its weight in every layout
(SPD: the sum of each rank's slice is one product with the concatenated slices' inputs), so its refit is exact
least squares of the loss and the loss after it is computed from ``G`` and ``C``. ``o_proj`` is exact where the
MLP does not read the attention's output (ladder: the MLP reads ``r_{k-1}``); a dense or SPD MLP reads it, and
there the fit holds the MLP's input where it is. Its new weight is kept only if the loss measured with it is not
higher than before.

The inputs ``Z`` are the module's own, through the block's own code: for the collection the module is wrapped
in ``_Recorder``, which ``modeling_ladder_llama._LayerKernels`` calls whole on each head group's (or MLP slice's)
zero-padded input, as it calls a peft wrapper; the inputs of one forward sum to ``Z``.

The refit is a pure function of the layer's input states and weights (batches in order, no randomness), so a
resumed run recomputes it bit for bit. Under data parallelism each process takes every ``world``-th batch and the
sums are all-reduced.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from ...errors import LadderizeError
from ..process_group import sum_over_processes
from ...convert.residual_states import State
from ..objectives.losses import layer_error, update_sums

if TYPE_CHECKING:
    from ...checkpoint.placement import LaunchRank
    from .layer_training import StateCache

PRIOR_TOKENS = 8_192  # the current weights weigh as much as this many calibration tokens (``default_ridge``)
FLOAT64_DEVICES = ("cpu", "cuda")  # device types that solve in float64; others solve on the CPU


@dataclass
class NormalEquations:
    """``G = sum beta Z^T Z`` [D_in, D_in] and ``C = sum beta Z^T T`` [D_in, D_out] of a linear map's fit, float64."""

    gram: torch.Tensor
    cross: torch.Tensor

    @classmethod
    def zeros(cls, inputs: int, outputs: int, device: torch.device | str = "cpu") -> NormalEquations:
        return cls(torch.zeros(inputs, inputs, dtype=torch.float64, device=device),
                   torch.zeros(inputs, outputs, dtype=torch.float64, device=device))

    def add(self, z: torch.Tensor, target: torch.Tensor, weight: float | torch.Tensor = 1.0) -> None:
        """Add rows ``z`` [..., D_in] whose image should be ``target`` [..., D_out], with weight ``beta``."""
        z = z.reshape(-1, z.shape[-1]).to(self.gram.device, torch.float64)
        target = target.reshape(-1, target.shape[-1]).to(self.gram.device, torch.float64)
        weight = torch.as_tensor(weight, dtype=torch.float64, device=self.gram.device)
        self.gram.addmm_(z.T, z * weight)
        self.cross.addmm_(z.T, target * weight)

    def solve(self, weight: torch.Tensor, ridge: float) -> tuple[torch.Tensor, float]:
        """``W`` [D_out, D_in] minimising ``sum beta ||Z W^T - T||^2 + lam ||W - weight||^2``, float64, and the
        change of the first sum from ``weight`` to ``W`` (never positive).

        Solved for the change: ``(G + lam I) Delta^T = C - G weight^T``, ``lam = ridge * mean(diag(G))``.
        """
        x0 = weight.to(self.gram.device, torch.float64).T  # [D_in, D_out]
        lam = ridge * self.gram.diagonal().mean()
        if not lam > 0:  # no input reached the module: nothing to fit
            return x0.T.clone(), 0.0
        residual = self.cross - self.gram @ x0
        eye = torch.eye(self.gram.shape[0], dtype=torch.float64, device=self.gram.device)
        factor = torch.linalg.cholesky(self.gram + lam * eye)
        delta = torch.cholesky_solve(residual, factor)
        change = (delta * (self.gram @ delta)).sum() - 2 * (delta * residual).sum()
        return (x0 + delta).T, change.item()


def default_ridge(tokens: int) -> float:
    """The ridge of a refit on ``tokens`` calibration tokens: ``PRIOR_TOKENS / tokens`` (the module docstring)."""
    return PRIOR_TOKENS / tokens


@dataclass
class ClosedForm:
    """One layer's refit: its local loss on the calibration set before and after, and the modules refit or kept."""

    layer: int
    before: float
    after: float
    fitted: tuple[str, ...]
    ridge: float
    kept: tuple[str, ...] = ()  # refit, but the measured loss rose, so the weight stayed

    def describe(self) -> str:
        kept = f"; {', '.join(self.kept)} kept: its refit raised the loss" if self.kept else ""
        return (f"layer {self.layer}: closed-form {', '.join(self.fitted)} (ridge {self.ridge:.3g}{kept}): "
                f"local loss {self.before:.4g} -> {self.after:.4g}")


class _Recorder(nn.Module):
    """Stands in for a plain ``nn.Linear`` during one forward and sums the inputs it is called on.

    A module that is not a bare ``nn.Linear`` is called whole by the layer (on each head group's or MLP slice's
    zero-padded input in SPD, and once on zeros for its constant term): the inputs sum to the module's input.
    """

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.base_layer = linear
        self.inputs: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.inputs = x if self.inputs is None else self.inputs + x
        return self.base_layer(x)


def _owner(layer: nn.Module, name: str) -> nn.Module:
    return layer.self_attn if name == "o_proj" else layer.mlp


@contextlib.contextmanager
def _recording(layer: nn.Module, name: str) -> Iterator[_Recorder]:
    owner = _owner(layer, name)
    linear = getattr(owner, name)
    if type(linear) is not nn.Linear:
        raise LadderizeError(f"closed_form refits bare linear layers; layer {layer.layer_idx}'s {name} is a "
                             f"{type(linear).__name__}")
    recorder = _Recorder(linear)
    setattr(owner, name, recorder)
    try:
        yield recorder
    finally:
        setattr(owner, name, linear)


def _direct(layer: nn.Module, name: str) -> tuple[float, float]:
    """How module ``name``'s output is added to the layer's returned ``(residual, stale)``: the residual holds
    both modules' outputs, the stale state (the state after the attention) the attention's where it syncs."""
    return 1.0, float(name == "o_proj" and layer.attn_op.allreduce)


def _batches(cache: StateCache, mode, teacher_out: State, inputs: State, batch_size: int, launch: LaunchRank
             ) -> Iterator[tuple[int, State, State, State, tuple[torch.Tensor, int] | None]]:
    """The calibration set in batches of ``batch_size`` rows, in order: the batch's rows, then the teacher's states
    entering and leaving the layer and the layer's inputs of those rows this process holds, on the device, and
    ``layer_error``'s ``shared`` (``None`` in one process). Under data parallelism every process joins every batch's
    sum of the teacher's update sums; a batch it holds no row of yields nothing."""
    on = cache.rows_on_device
    for start in range(0, cache.num_train, batch_size):
        rows = torch.arange(start, min(start + batch_size, cache.num_train))
        own = rows if not launch.several else cache.local(rows)
        t_in = (on(cache.teacher_state[0], own), on(cache.teacher_state[1], own))
        t_out = (on(teacher_out[0], own), on(teacher_out[1], own))
        shared = None
        if launch.several:
            sums = update_sums(mode, t_in, t_out)
            sum_over_processes([sums])
            shared = (sums, len(rows) * math.prod(t_out[0].shape[1:]))
            if len(own) == 0:
                continue
        yield len(rows), t_in, (on(inputs[0], own), on(inputs[1], own)), t_out, shared


def _solve_device(device: torch.device) -> torch.device:
    return device if device.type in FLOAT64_DEVICES else torch.device("cpu")


@torch.no_grad()
def _collect(cache: StateCache, layer: nn.Module, name: str, teacher_out: State, local_inputs: str, batch_size: int,
             launch: LaunchRank) -> tuple[NormalEquations, float]:
    """Module ``name``'s normal equations over the calibration set, and the layer's loss there (as it stands)."""
    linear = getattr(_owner(layer, name), name)
    weight = linear.weight.detach().float()
    direct = _direct(layer, name)
    inputs = cache.student_state if local_inputs == "student" else cache.teacher_state
    equations = NormalEquations.zeros(linear.in_features, linear.out_features, _solve_device(weight.device))
    total = torch.zeros((), dtype=torch.float64, device=weight.device)
    with _recording(layer, name) as recorder:
        for count, t_in, s_in, t_out, shared in _batches(cache, layer.mode, teacher_out, inputs, batch_size, launch):
            recorder.inputs = None
            with cache.autocast():
                s_out = layer(s_in[0], s_in[1], **cache.kwargs(len(s_in[0])))
            share = count / cache.num_train
            total += layer_error(layer.mode, t_in, s_out, t_out, local_inputs, shared=shared).double() * share
            z = recorder.inputs.float()  # [B, S, D_in]
            y0 = F.linear(z, weight)  # the module's output without its bias, [B, S, D_out]
            base = tuple(s.float() - c * y0 for s, c in zip(s_out[:2], direct))
            with torch.enable_grad():
                y = y0.clone().requires_grad_(True)
                loss = layer_error(layer.mode, t_in, tuple(b + c * y for b, c in zip(base, direct)), t_out, local_inputs,
                                   shared=shared)
                (grad,) = torch.autograd.grad(loss, y, create_graph=True)
                (curvature,) = torch.autograd.grad(grad, y, torch.ones_like(y))  # 2 alpha everywhere
            alpha = curvature.double().mean() / 2
            if alpha > 0:
                equations.add(z, y0 - grad.detach() / (2 * alpha).float(), share * alpha)
    sum_over_processes([equations.gram, equations.cross, total])
    return equations, total.item()


def refit_output_projections(cache: StateCache, layer: nn.Module, teacher_out: State, *, local_inputs: str,
                             batch_size: int, ridge: float | None = None, launch: LaunchRank | None = None) -> ClosedForm:
    """Refit ``layer``'s ``o_proj``, then its ``down_proj``, in place, by ridge least squares of its local loss on the
    calibration set (the module docstring); the loss before and after. ``ridge``: default ``default_ridge``."""
    from ...checkpoint.placement import LaunchRank

    launch = launch or LaunchRank()
    ridge = default_ridge(cache.num_train * cache.data.shape[1]) if ridge is None else ridge
    o_proj, down_proj = layer.self_attn.o_proj, layer.mlp.down_proj

    def collect(name: str) -> tuple[NormalEquations, float]:
        return _collect(cache, layer, name, teacher_out, local_inputs, batch_size, launch)

    equations, before = collect("o_proj")
    old = o_proj.weight.detach().clone()
    _assign(o_proj, equations.solve(old, ridge)[0])
    equations, middle = collect("down_proj")
    fitted, kept = ("o_proj", "down_proj"), ()
    if middle > before:  # only where the MLP reads the attention's output (dense, SPD): keep the old o_proj
        _assign(o_proj, old)
        fitted, kept = ("down_proj",), ("o_proj",)
        equations, middle = collect("down_proj")
    new, change = equations.solve(down_proj.weight, ridge)
    _assign(down_proj, new)
    return ClosedForm(cache.layer, before, middle + change, fitted, ridge, kept)


@torch.no_grad()
def _assign(linear: nn.Linear, weight: torch.Tensor) -> None:
    linear.weight.copy_(weight.to(linear.weight.device, linear.weight.dtype))
