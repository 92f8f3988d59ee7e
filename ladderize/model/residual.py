"""The one interpreter of the residual program: the order of reads, all-reduces and adds.

``layout.module_program`` says, per module, which complete residual state its norm reads
(``ModuleOp.reads``), whether it ends in an all-reduce, whether that all-reduce may still run
while the next module computes (``overlaps_next``), and whether it is an SPD MLP that also reads
its rank's own attention partial. ``ResidualStream.run`` executes one ``ModuleOp``; the HF model
(``modeling_ladder_llama.py``), the TP runtime (``runtime/engine.py``) and the vLLM model
(``runtime/vllm/model.py``) all drive their layer loops through it. They supply only:

- ``ModuleKernels``: a module's partial output from its (un-normalised) input, norm included,
  and the biases to add once after the sum over ranks;
- a ``Reduction``: how partials are summed over ranks (``start`` issues, ``wait`` completes).

For module k with partial p_k (this rank's share) and bias b_k, the stream computes

    h   = r_{op.reads}                      (waits for r_{k-1}'s all-reduce only when it reads r_{k-1})
    r_k = r_{k-1} + (Reduce(p_k) + b_k)     (module k's all-reduce is issued first; the previous
                                             module's is waited on after it)

An SPD attention (no all-reduce) keeps its partial ``Y_r`` on the rank and leaves the stream
unchanged (the state after it is its input X); the SPD MLP then computes ``block.spd_share``
``Y_r + MLP_r(LN2(X + Y_r (+ b_O)))`` and

    out = X + ((Reduce(sum of the shares this device holds) + b_O) + b_down)

A device may hold several ranks' shares of an SPD block (the HF model holds all N head groups
on one device): ``ModuleKernels.spd_attention`` returns one ``Y_r`` per share it holds.

Depends on torch and the sibling ``layout``/``block`` modules only: it travels beside the
modeling file in a converted checkpoint (``auto_map``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Protocol

import torch

from .block import spd_share
from .layout import ModuleKind, ModuleOp


class ProgramError(RuntimeError):
    """A ``ModuleOp`` read a state the stream does not hold (the ops were run out of order)."""


class ModuleKernels(Protocol):
    """What a caller supplies per module: kernels and biases. ``h`` is the module's input, before its norm."""

    def attention(self, op: ModuleOp, h: torch.Tensor) -> torch.Tensor:
        """This device's attention partial ``f(LN1(h))`` (its heads through its ``o_proj`` columns)."""

    def mlp(self, op: ModuleOp, h: torch.Tensor) -> torch.Tensor:
        """This device's MLP partial ``f(LN2(h))`` (its slice through its ``down_proj`` columns)."""

    def bias(self, op: ModuleOp) -> torch.Tensor | None:
        """The bias added once, after the reduction (None: none, or already inside the partial)."""

    def spd_attention(self, op: ModuleOp, h: torch.Tensor) -> Sequence[torch.Tensor]:
        """The ``Y_r`` of every SPD share this device holds (one per TP rank; all N on one device)."""

    def spd_mlp(self, op: ModuleOp, h: torch.Tensor, share: int) -> torch.Tensor:
        """``MLP_r(LN2(h))`` of the SPD share ``share`` (an index into ``spd_attention``'s list)."""


class Reduction(Protocol):
    """How partials are summed over ranks. ``start`` may return before the sum is done."""

    def start(self, partial: torch.Tensor, overlap: bool) -> Any:
        """Issue the sum of ``partial``; ``overlap``: it may stay in flight until ``wait``."""

    def wait(self, handle: Any) -> torch.Tensor:
        """The summed tensor of a ``start``."""


class Complete:
    """The reduction of a device that holds every rank's share: the partial is already the sum."""

    def start(self, partial: torch.Tensor, overlap: bool) -> torch.Tensor:
        return partial

    def wait(self, handle: torch.Tensor) -> torch.Tensor:
        return handle


COMPLETE = Complete()


def _plus(x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return x if bias is None else x + bias


def slots_before(program: Sequence[ModuleOp], index: int) -> tuple[int, int]:
    """The module numbers ``(cur, prev)`` of the two states a stream holds before ``program[index]``.

    ``cur`` is r_{k-1} as the program defines it (an SPD attention adds nothing, so its input
    stands for its output) and ``prev`` the state before that; both are 0 at the start (r_{-1} = r_0).
    """
    cur = prev = 0
    for op in program[:index]:
        if op.allreduce:
            cur, prev = op.k, cur
    return cur, prev


def layer_program(program: Sequence[ModuleOp], layer: int) -> tuple[ModuleOp, ModuleOp, tuple[int, int]]:
    """Layer ``layer``'s two modules and the slots a stream holds before them (``slots_before``), numbered from the
    layer's own start: every module number less ``2 * layer``, so its modules are 1 and 2, the state entering it is 0
    and the earlier ones negative.

    The stream only compares module numbers with one another, so a shift computes the same. What it buys: layers of
    one kind read the same numbers, and ``torch.compile``, for which a module's integers are constants of its graph,
    traces one graph for all of them instead of one per layer (``adapt/train/compilation.py``). ``ModuleOp.layer`` keeps
    the layer's own index.
    """
    base = 2 * layer
    attention, mlp = (replace(op, k=op.k - base, reads=op.reads - base) for op in program[base : base + 2])
    cur, prev = slots_before(program, base)
    return attention, mlp, (cur - base, prev - base)


class ResidualStream:
    """The residual states of one stream of tokens, advanced one ``ModuleOp`` at a time.

    Holds ``cur`` (r_{k-1}: complete, or ``prev`` + an all-reduce in flight), ``prev`` (the
    complete state before it) and an SPD attention's local partials until its MLP. The TP
    runtime keeps one stream per domino chunk.
    """

    __slots__ = ("cur", "prev", "cur_k", "prev_k", "pending", "pending_bias", "reduction", "local")

    def __init__(self, cur: torch.Tensor, prev: torch.Tensor | None = None, slots: tuple[int, int] = (0, 0)):
        """``cur`` = r_{k-1}, ``prev`` = the state before it (default ``cur``: r_{-1} = r_0); ``slots``
        their module numbers (``slots_before``)."""
        self.cur, self.prev = cur, cur if prev is None else prev
        self.cur_k, self.prev_k = slots
        self.pending: Any = None  # the handle of cur's all-reduce while it is in flight
        self.pending_bias: tuple[torch.Tensor | None, ...] = ()
        self.reduction: Reduction = COMPLETE  # the reduction that issued ``pending``
        self.local: tuple[ModuleOp, Sequence[torch.Tensor]] | None = None  # SPD: its attention op and Y_r

    def resolve(self) -> torch.Tensor:
        """Wait for the pending all-reduce (if any) and return the complete ``cur``."""
        if self.pending is not None:
            reduced = self.reduction.wait(self.pending)
            for bias in self.pending_bias:
                reduced = _plus(reduced, bias)
            self.cur = self.prev + reduced
            self.pending, self.pending_bias = None, ()
        return self.cur

    def read(self, op: ModuleOp) -> torch.Tensor:
        """The state module ``op`` reads: ``prev`` without waiting, or ``cur`` (waiting for it)."""
        if op.reads == self.cur_k:
            return self.resolve()
        if op.reads == self.prev_k:
            return self.prev
        raise ProgramError(f"module {op.k} reads r_{op.reads}; the stream holds r_{self.cur_k} and r_{self.prev_k}")

    def run(
        self, op: ModuleOp, kernels: ModuleKernels, reduction: Reduction | None = None, overlap: bool | None = None
    ) -> None:
        """Run module ``op``: read, compute its partial, issue its all-reduce, then wait for the previous one.

        ``overlap`` (default ``op.overlaps_next``) is passed to ``reduction.start``; a caller that
        splits the batch (domino) sets it for every all-reduce. ``reduction`` defaults to ``COMPLETE``
        (read from the module's globals, not a default argument: torch.compile traces it there).
        """
        reduction = COMPLETE if reduction is None else reduction
        h = self.read(op)
        if op.kind is ModuleKind.ATTENTION:
            if not op.allreduce:  # SPD: Y_r stays on the rank until the MLP's all-reduce
                self.local = (op, kernels.spd_attention(op, h))
                return
            partial, biases = kernels.attention(op, h), (kernels.bias(op),)
        elif op.reads_local_partial:  # SPD MLP: sum_r (Y_r + MLP_r(LN2(X + Y_r (+ b_O)))), one all-reduce
            if self.local is None or self.local[0].k != op.k - 1:
                raise ProgramError(f"SPD MLP module {op.k} ran without its attention's partial")
            (attn_op, local), self.local = self.local, None
            o_bias = kernels.bias(attn_op)
            partial = None
            for index, y in enumerate(local):
                share = spd_share(h, y, o_bias, lambda x, i=index: kernels.spd_mlp(op, x, i))
                partial = share if partial is None else partial + share
            biases = (o_bias, kernels.bias(op))
        else:
            partial, biases = kernels.mlp(op, h), (kernels.bias(op),)
        handle = reduction.start(partial, op.overlaps_next if overlap is None else overlap)
        self.prev = self.resolve()  # the previous module's all-reduce: waited on only now
        self.prev_k, self.cur_k = self.cur_k, op.k
        self.cur, self.pending, self.pending_bias, self.reduction = None, handle, biases, reduction

    def run_all(
        self, ops: Sequence[ModuleOp], kernels: ModuleKernels, reduction: Reduction | None = None
    ) -> torch.Tensor:
        """Run ``ops`` in order and return the complete final state."""
        for op in ops:
            self.run(op, kernels, reduction)
        return self.resolve()


__all__ = ["COMPLETE", "Complete", "ModuleKernels", "ProgramError", "Reduction", "ResidualStream", "layer_program", "slots_before"]
