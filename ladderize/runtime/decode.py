"""Decoding on one rank: prefill, token-by-token decode (optionally a captured CUDA graph), sampling.

``Decoder`` drives a ``RankModel`` over its KV cache; ``static=True`` decodes with the position
as a tensor, so shapes are fixed (CUDA graphs, ``torch.compile``). ``generate_on_rank`` is the
loop every rank runs with the same logits and the same seed, so all ranks pick the same tokens.
"""

from __future__ import annotations


import torch

from .engine import RankModel
from .sampling import Sampling  # the decoder's settings (light, checked before torch by the command line)
from .plan import CommPlan
from .state import KVCache


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


class Decoder:
    """Prefill then token-by-token decode on one rank, optionally through a captured CUDA graph."""

    def __init__(
        self,
        model: RankModel,
        plan: CommPlan,
        batch: int,
        max_len: int,
        cuda_graphs: bool = False,
        static: bool = False,
        cache: KVCache | None = None,
    ):
        self.model, self.plan = model, plan
        self.cache = cache if cache is not None else model.new_cache(batch, max_len)
        self.static = static or cuda_graphs
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
            return self.model.forward(self._tokens, self._position, self.cache, self.plan)
        if self._graph is None:
            self._capture()
        self._graph.replay()
        return self._graph_logits

    def _capture(self) -> None:
        """Record one decode step (communication included) into a CUDA graph. Unvalidated without a GPU."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm-up outside the graph (allocator, NCCL communicators)
            for _ in range(2):
                self.model.forward(self._tokens, self._position, self.cache, self.plan)
        torch.cuda.current_stream().wait_stream(stream)
        self._graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self._graph):
            self._graph_logits = self.model.forward(self._tokens, self._position, self.cache, self.plan)


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
            position += 1
    return torch.stack(out, dim=1) if out else input_ids.new_zeros(input_ids.shape[0], 0)


__all__ = ["Decoder", "Sampling", "generate_on_rank", "pick_tokens"]
