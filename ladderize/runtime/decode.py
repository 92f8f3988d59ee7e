"""Decoding on one rank: prefill, token-by-token decode (optionally a captured CUDA graph), sampling.

``Decoder`` drives a ``RankModel`` over its KV cache; ``static=True`` decodes with the position
as a tensor, so shapes are fixed (CUDA graphs, ``torch.compile``). ``generate_on_rank`` is the
loop every rank runs with the same logits and the same seed, so all ranks pick the same tokens.

``--compile`` (``compiled=True``) compiles the whole decode step (every layer, the all-reduces
and the LM head: one ``torch.compile`` of ``decode_forward``), never prefill, which runs eager.
One compiled function serves every shape: dynamo keeps one graph per (batch, cache length,
plan), each traced once and reused from then on (``dynamic=False``: static kernels, as CUDA
graphs want), under a recompile limit raised to ``COMPILED_SHAPES`` so that a benchmark's batch
sizes and schedules never hit torch's default limit of 8. With ``cuda_graphs`` the compiled step
is what the CUDA graph captures. The compile happens on the first decode step, which benchmarks
run untimed (``bench`` always warms up a compiled or graphed decoder first).

Compiled bfloat16 is not bit-identical to eager: inductor fuses and reorders the reductions
(norms, softmax), so logits differ in the last bits and greedy tokens may part after some
steps. In float32 the tokens equal eager's (tests).
"""

from __future__ import annotations

from typing import Callable

import torch

from ..errors import LadderizeError
from .engine import RankModel
from .sampling import Sampling  # the decoder's settings (light, checked before torch by the command line)
from .plan import CommPlan
from .kv_cache import KVCache


def pick_tokens(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator | None) -> torch.Tensor:
    """Next token per row of ``logits`` [B, V]. Every rank holds identical logits and the same seed."""
    if sampling.greedy:  # in float32, as transformers does: exact, and a bfloat16 argmax is slow on CPU
        return logits.float().argmax(dim=-1)
    scores = logits.float() / sampling.temperature
    if sampling.top_k > 0:
        kth = torch.topk(scores, min(sampling.top_k, scores.shape[-1]), dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if sampling.top_p < 1.0:
        ordered, index = scores.sort(dim=-1, descending=True)
        cumulative = ordered.softmax(-1).cumsum(-1)
        drop = cumulative - ordered.softmax(-1) > sampling.top_p  # keep the smallest set reaching top_p
        scores = scores.scatter(-1, index, ordered.masked_fill(drop, float("-inf")))
    probs = scores.softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


COMPILED_SHAPES = 64  # dynamo graphs one process may keep for the compiled decode step (torch's default limit: 8)
_compiled: Callable | None = None


def decode_forward(model: RankModel, tokens: torch.Tensor, position: torch.Tensor, cache: KVCache, plan: CommPlan) -> torch.Tensor:
    """One static decode step: logits [B, 1, V] of ``tokens`` [B, 1] at the 1-element ``position``; fills the cache."""
    return model.forward(tokens, position, cache, plan)


def compiled_decode_step() -> Callable:
    """``decode_forward`` under ``torch.compile`` (one per process; see the module docstring for shapes and limits)."""
    global _compiled
    if _compiled is None:
        import torch._dynamo.config as dynamo_config

        for name in ("recompile_limit", "cache_size_limit"):  # the name changed across torch versions
            if hasattr(dynamo_config, name):
                setattr(dynamo_config, name, max(getattr(dynamo_config, name), COMPILED_SHAPES))
        if hasattr(dynamo_config, "accumulated_recompile_limit"):
            dynamo_config.accumulated_recompile_limit = max(dynamo_config.accumulated_recompile_limit, 4 * COMPILED_SHAPES)
        _compiled = torch.compile(decode_forward, dynamic=False)
    return _compiled


class Decoder:
    """Prefill then token-by-token decode on one rank, optionally compiled and/or through a captured CUDA graph."""

    def __init__(
        self,
        model: RankModel,
        plan: CommPlan,
        batch: int,
        max_len: int,
        cuda_graphs: bool = False,
        static: bool = False,
        cache: KVCache | None = None,
        compiled: bool = False,
    ):
        self.model, self.plan = model, plan
        self.cache = cache if cache is not None else model.new_cache(batch, max_len)
        self._step_fn = compiled_decode_step() if compiled else decode_forward
        if compiled:
            self.plan = model.canonical_plan(plan)
        self.static = static or cuda_graphs or compiled
        self.cuda_graphs = cuda_graphs and model.device.type == "cuda"
        self._graph = None
        if self.static:
            self._tokens = torch.zeros(batch, 1, dtype=torch.long, device=model.device)
            self._position = torch.zeros(1, dtype=torch.long, device=model.device)

    def prefill(self, tokens: torch.Tensor, last_only: bool = True) -> torch.Tensor:
        """Logits of the prompt ``tokens`` [B, S] (the last position only, by default); fills the cache."""
        return self.model.forward(tokens, 0, self.cache, self.plan, last_only=last_only)

    def extend(self, tokens: torch.Tensor, position: int, last_only: bool = True) -> torch.Tensor:
        """Logits for ``tokens`` [B, S] that follow ``position`` cached tokens."""
        if tokens.shape[1] == 1 and self.static:
            return self._decode_static(tokens, position)
        return self.model.forward(tokens, position, self.cache, self.plan, last_only=last_only)

    def _decode_static(self, tokens: torch.Tensor, position: int) -> torch.Tensor:
        self._tokens.copy_(tokens)
        self._position.fill_(position)
        if not self.cuda_graphs:
            return self._step()
        if self._graph is None:
            self._capture()
        self._graph.replay()
        # the graph writes every step into the same buffer: a copy, so that a caller keeping several steps'
        # logits (scoring in pieces) does not see the last step's in all of them (B x V, small beside a step)
        return self._graph_logits.clone()

    def _step(self) -> torch.Tensor:
        """The static decode step on ``_tokens`` at ``_position``: compiled, or eager."""
        return self._step_fn(self.model, self._tokens, self._position, self.cache, self.plan)

    def _capture(self) -> None:
        """Record one decode step (communication included) into a CUDA graph, on the model's device (not merely the
        current one: a single rank may run on ``cuda:N``)."""
        device = self.model.device
        with torch.cuda.device(device):
            stream = torch.cuda.Stream(device)
            stream.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(stream):  # warm-up outside the graph (allocator, NCCL communicators, the compile)
                for _ in range(2):
                    self._step()
            torch.cuda.current_stream(device).wait_stream(stream)
            self._graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self._graph):
                self._graph_logits = self._step()


def generate_on_rank(
    decoder: Decoder,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    sampling: Sampling = Sampling(),
    eos_token_ids: tuple[int, ...] = (),
    pad_token_id: int = 0,
) -> torch.Tensor:
    """New tokens [B, <=K]: stops when every row has produced an EOS (rows that finished get padding)."""
    generator = None
    if not sampling.greedy:
        generator = torch.Generator(device=input_ids.device).manual_seed(sampling.seed)
    logits = decoder.prefill(input_ids)[:, -1]
    finite = torch.isfinite(logits).all()  # NaN logits pick token 0 forever; checked once at the end (no sync per step)
    position = input_ids.shape[1]
    finished = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
    eos = torch.tensor(eos_token_ids, device=input_ids.device, dtype=torch.long)
    out = []
    for index in range(max_new_tokens):
        token = pick_tokens(logits, sampling, generator)
        token = torch.where(finished, torch.full_like(token, pad_token_id), token)
        out.append(token)
        if eos.numel():
            finished |= torch.isin(token, eos)
            if bool(finished.all()):
                break
        if index + 1 < max_new_tokens:
            logits = decoder.extend(token[:, None], position)[:, -1]
            finite &= torch.isfinite(logits).all()
            position += 1
    if not bool(finite):
        raise LadderizeError("the model produced non-finite logits (NaN/Inf): its weights or activations overflow "
                             "(a float16 run, or a damaged checkpoint); no tokens returned")
    return torch.stack(out, dim=1) if out else input_ids.new_zeros(input_ids.shape[0], 0)


__all__ = ["COMPILED_SHAPES", "Decoder", "Sampling", "compiled_decode_step", "decode_forward", "generate_on_rank", "pick_tokens"]
