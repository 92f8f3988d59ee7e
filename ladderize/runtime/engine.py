"""One rank's model: its shard of every layer and the forward pass under a ``CommPlan``.

Each rank holds the replicated embedding, norms and LM head plus its shard of every layer
(``weights.py``, sliced as ``tp_slicing.py`` says). A module computes a *partial* output from
its shard; the sum over ranks (the all-reduce) is the module's output. The ``CommPlan``'s
steps carry the layout's ``ModuleOp``s; ``hidden`` runs them through ``model/residual.py``'s
``ResidualStream``, the interpreter the HF and vLLM models use too, which owns the order of
reads, all-reduces and adds (including an SPD block's Y_r + MLP_r(LN2(X + Y_r)), reduced once).
This file supplies only the rank's kernels (``_RankKernels``: block math from ``model/block.py``
on fused weights with gemv/oneDNN/aten linears) and its all-reduce (``_CommReduction``: blocking,
or in flight while the next module computes). A new layer mode needs no branch here.

``static=True`` decode (``decode.Decoder``) drives cache writes and the attention mask by a
position *tensor*, so shapes are fixed, as CUDA graphs and ``torch.compile`` need. ``--compile``
compiles that whole decode step (``decode.compiled_decode_step``), never prefill; this file only
switches the linears to aten for it (inductor picks its own kernels).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F

from ..model.block import attention_partial, mlp_partial, qkv_heads, rms_norm
from ..model.layout import LayerMode, ModuleKind, module_program
from ..model.residual import ResidualStream, slots_before
from .allreduce import Communicator, InFlight
from .kernels import LinearKernel, linear_fn, prepare_weights, resolve_kernel
from .plan import CommPlan, StepKind
from .kv_cache import KVCache, RotaryTable
from .weights import LayerWeights, RankWeights


def activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The MLP activation of a config's ``hidden_act`` (``F.silu`` directly for Llama's)."""
    if name == "silu":
        return F.silu
    from transformers.activations import ACT2FN

    return ACT2FN[name]


class RankModel:
    """One rank's shard of the model and its forward pass under a ``CommPlan``."""

    def __init__(
        self,
        weights: RankWeights,
        config: Any,
        comm: Communicator,
        max_positions: int = 2048,
        compile_modules: bool = False,
        linear: str | LinearKernel = LinearKernel.AUTO,
    ):
        """``linear``: the kernel of the projections and the LM head (``kernels.py``); ``compile_modules``: the decode
        step will run compiled (``decode.Decoder(compiled=True)``), so the linears are aten's."""
        self.device, self.dtype = weights.embed.device, weights.embed.dtype
        self.kernel = resolve_kernel(linear, self.device, self.dtype, compiled=compile_modules)
        self.w = prepare_weights(weights, self.kernel)
        self.linear = linear_fn(self.kernel)
        self.dims, self.comm = weights.dims, comm
        self.heads, self.kv_heads = weights.heads_local, weights.kv_heads_local
        self.head_dim, self.eps = self.dims.head_dim, self.dims.rms_norm_eps
        self.group = self.heads // self.kv_heads  # query heads per local KV head (fewer under KV replication)
        self.act = activation(self.dims.hidden_act)
        self.rope = RotaryTable(config, max_positions, self.device, self.dtype)
        self.plans: dict[CommPlan, CommPlan] = {}  # one object per equal plan: a compiled step's guards match it again

    def canonical_plan(self, plan: CommPlan) -> CommPlan:
        """The first plan equal to ``plan`` this model ran (so that the compiled decode step is not retraced for a
        new but equal plan object)."""
        return self.plans.setdefault(plan, plan)

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        """An empty KV cache for ``batch`` rows of up to ``max_len`` tokens (the rotary table grows to match)."""
        self.rope.ensure(max_len)
        return KVCache.allocate(
            self.dims.num_layers, batch, self.kv_heads, max_len, self.head_dim, self.device, self.dtype
        )

    # modules: each returns this rank's partial output (before the sum) --------------------------
    # They take tensors, not the LayerWeights object, so that torch.compile traces them once for all layers.

    def _qkv_rotated(self, h, w_qkv, b_qkv, cos, sin):
        """q [B, S, Hl, hd], k and v [B, S, Kl, hd], with rotary applied to q and k together."""
        return qkv_heads(self.linear(h, w_qkv, b_qkv), self.heads, self.kv_heads, self.head_dim, cos, sin)

    def _attention_partial(self, h, w_qkv, b_qkv, w_o, keys, values, cos, sin, start: int) -> torch.Tensor:
        """``h`` [B, S, D] -> this rank's heads through its ``o_proj`` columns, [B, S, D]."""
        batch, seq, _ = h.shape
        q, k, v = self._qkv_rotated(h, w_qkv, b_qkv, cos, sin)
        end = start + seq
        keys[:, :, start:end] = k.transpose(1, 2)  # cache [B, Kl, T, hd]
        values[:, :, start:end] = v.transpose(1, 2)
        keys, values = keys[:, :, :end], values[:, :, :end]
        if seq == 1:  # decode: fold each KV head's query group into the query axis, no mask needed
            q = q.reshape(batch, self.kv_heads, self.group, self.head_dim)
            out = F.scaled_dot_product_attention(q, keys, values)  # [B, Kl, G, hd]
        else:
            mask = None
            if start > 0:  # a chunk after cached tokens: query i sees keys <= start + i
                key_pos = torch.arange(end, device=h.device)
                mask = key_pos[None, :] <= key_pos[start:, None]
            out = F.scaled_dot_product_attention(
                q.transpose(1, 2), keys, values, attn_mask=mask, is_causal=start == 0, enable_gqa=self.group > 1
            ).transpose(1, 2)  # [B, S, Hl, hd]
        return attention_partial(out.reshape(batch, seq, self.heads * self.head_dim), w_o, self.linear)

    def _attention_partial_static(self, h, w_qkv, b_qkv, w_o, keys, values, cos, sin, position) -> torch.Tensor:
        """Decode (S = 1) with the position as a 1-element tensor: fixed shapes, capturable in a CUDA graph."""
        batch = h.shape[0]
        q, k, v = self._qkv_rotated(h, w_qkv, b_qkv, cos, sin)
        keys[:, :, position] = k.transpose(1, 2)  # index_put_: inductor writes the cache in place (no copy of it)
        values[:, :, position] = v.transpose(1, 2)
        visible = torch.arange(keys.shape[2], device=h.device) <= position  # [T]
        q = q.reshape(batch, self.kv_heads, self.group, self.head_dim)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=visible[None, None, None, :])
        return attention_partial(out.reshape(batch, 1, self.heads * self.head_dim), w_o, self.linear)

    def _mlp_partial(self, h, w_gate_up, b_gate_up, w_down) -> torch.Tensor:
        """``h`` [B, S, D] -> this rank's MLP slice through its ``down_proj`` columns, [B, S, D]."""
        gate, up = self.linear(h, w_gate_up, b_gate_up).chunk(2, dim=-1)  # gate|up fused: [B, S, 2 * Il]
        return mlp_partial(gate, up, w_down, self.act, self.linear)

    def _attention(self, lw: LayerWeights, h, keys, values, position):
        if isinstance(position, torch.Tensor):
            cos, sin = self.rope.at_tensor(position)
            return self._attention_partial_static(h, lw.qkv, lw.qkv_bias, lw.o, keys, values, cos, sin, position)
        cos, sin = self.rope.at(position, h.shape[1])
        return self._attention_partial(h, lw.qkv, lw.qkv_bias, lw.o, keys, values, cos, sin, position)

    def _mlp(self, lw: LayerWeights, h):
        return self._mlp_partial(h, lw.gate_up, lw.gate_up_bias, lw.down)

    def step_partial(self, kind: StepKind, lw: LayerWeights, x: torch.Tensor, keys, values, position):
        """One step alone on input ``x``: ``(partial, bias)``, its output being ``x + (sum_r(partial) + bias)``.

        For timing one module (``predict/measured.py``) and for tests; it runs the step's ``ModuleOp``s
        (of a one-layer program) through ``ResidualStream`` and keeps the partial the all-reduce would sum.
        """
        # an SPD block: the first mode of the table whose attention drops its all-reduce (and reads r_{k-1}); a single
        # module: the dense layer's
        mode = (LayerMode.with_traits(attention_allreduce=False, reads_stale=False) if kind is StepKind.SPD_BLOCK
                else LayerMode.with_traits(converted=False))
        program = module_program((mode,))
        ops = program if kind is StepKind.SPD_BLOCK else program[:1] if kind is StepKind.ATTENTION else program[1:]
        kernels, capture = _RankKernels(self, (lw,), keys, values, position), _Capture()
        stream = ResidualStream(x, slots=slots_before(program, ops[0].k - 1))
        for op in ops:
            stream.run(op, kernels, capture)
        bias = None
        for extra in stream.pending_bias:
            bias = extra if bias is None else bias if extra is None else bias + extra
        return capture.partial, bias

    # forward ---------------------------------------------------------------------------------

    def hidden(self, tokens: torch.Tensor, position: int | torch.Tensor, cache: KVCache, plan: CommPlan) -> torch.Tensor:
        """Final hidden states [B, S, D] (before the final norm) of ``tokens`` [B, S] at ``position``.

        ``position`` is the index of the first token: an int, or (static decode) a 1-element tensor.
        Each step's ``ModuleOp``s run through ``model/residual.ResidualStream``, one stream per domino
        chunk; this rank supplies the kernels (``_RankKernels``) and the all-reduce (``_CommReduction``).
        """
        x = F.embedding(tokens, self.w.embed)  # [B, S, D], replicated
        bounds = _chunk_bounds(tokens.shape[0], plan.chunks)
        streams = [ResidualStream(x[lo:hi]) for lo, hi in bounds]
        reduction = _CommReduction(self.comm, plan.communicate)
        chunked = len(streams) > 1
        for step in plan.steps:
            keys, values = cache.keys[step.layer], cache.values[step.layer]
            for (lo, hi), stream in zip(bounds, streams):  # domino: chunk i's all-reduce overlaps chunk i+1
                kernels = _RankKernels(self, self.w.layers, keys[lo:hi] if chunked else keys, values[lo:hi] if chunked else values, position)
                for op in step.ops:
                    stream.run(op, kernels, reduction, overlap=step.overlapped)
        outs = [stream.resolve() for stream in streams]
        return outs[0] if len(outs) == 1 else torch.cat(outs)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits [B, S, V] of final hidden states [B, S, D] (final norm, then the LM head)."""
        return self.linear(rms_norm(hidden, self.w.final_norm, self.eps), self.w.lm_head, None)

    def forward(
        self, tokens: torch.Tensor, position: int | torch.Tensor, cache: KVCache, plan: CommPlan, last_only: bool = False
    ) -> torch.Tensor:
        """Logits [B, S, V] (or [B, 1, V] with ``last_only``) and the cache filled for these tokens."""
        hidden = self.hidden(tokens, position, cache, plan)
        return self.logits(hidden[:, -1:] if last_only else hidden)


class _RankKernels:
    """``residual.ModuleKernels`` of one rank: its shard's partials (norm included) and the biases.

    ``layers[op.layer]`` is the layer's ``LayerWeights``; ``keys``/``values`` the step's KV cache (of its chunk).
    """

    __slots__ = ("model", "layers", "keys", "values", "position")

    def __init__(self, model: "RankModel", layers, keys, values, position):
        self.model, self.layers, self.keys, self.values, self.position = model, layers, keys, values, position

    def attention(self, op, h: torch.Tensor) -> torch.Tensor:
        model, lw = self.model, self.layers[op.layer]
        return model._attention(lw, rms_norm(h, lw.ln1, model.eps), self.keys, self.values, self.position)

    def mlp(self, op, h: torch.Tensor) -> torch.Tensor:
        model, lw = self.model, self.layers[op.layer]
        return model._mlp(lw, rms_norm(h, lw.ln2, model.eps))

    def bias(self, op) -> torch.Tensor | None:
        lw = self.layers[op.layer]
        return lw.o_bias if op.kind is ModuleKind.ATTENTION else lw.down_bias

    def spd_attention(self, op, h: torch.Tensor) -> list[torch.Tensor]:
        return [self.attention(op, h)]  # this rank's head group: one share

    def spd_mlp(self, op, h: torch.Tensor, share: int) -> torch.Tensor:
        return self.mlp(op, h)


class _Capture:
    """``residual.Reduction`` that keeps the partial instead of summing it (``RankModel.step_partial``)."""

    partial: torch.Tensor | None = None

    def start(self, partial: torch.Tensor, overlap: bool) -> torch.Tensor:
        self.partial = partial
        return partial

    def wait(self, handle: torch.Tensor) -> torch.Tensor:
        return handle


class _CommReduction:
    """``residual.Reduction`` over the ``Communicator``: ``overlap`` issues the all-reduce async (``InFlight``)."""

    __slots__ = ("comm", "communicate")

    def __init__(self, comm: Communicator, communicate: bool):
        self.comm, self.communicate = comm, communicate

    def start(self, partial: torch.Tensor, overlap: bool) -> InFlight:
        return self.comm.all_reduce(partial, overlap, self.communicate)

    def wait(self, handle: InFlight) -> torch.Tensor:
        return handle.wait()


def _chunk_bounds(batch: int, chunks: int) -> list[tuple[int, int]]:
    chunks = max(1, min(chunks, batch))
    edges = [round(i * batch / chunks) for i in range(chunks + 1)]
    return list(zip(edges[:-1], edges[1:]))


__all__ = ["RankModel", "activation"]
