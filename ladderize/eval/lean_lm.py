"""lm-eval's ``HFLM`` with the memory of one batch of hidden states, not of full-vocabulary log-probs.

Where ``ladderize eval`` spent its memory (SmolLM2-135M, 49,152-token vocabulary, fp32):
``HFLM._loglikelihood_tokens`` runs the whole batch through the model, keeps the logits of
every position, ``[batch, length, vocab]``, and makes a log-softmax copy of them. A batch of
8 rolling windows of about 1,300 tokens is 2 GB per copy; the model's logits, their
log-softmax and the previous batch's log-softmax (still referenced while the next batch is
computed) were alive together, about 6 GB, beside a KV cache the model built for nothing
(``use_cache`` defaults to on).

``LeanHFLM`` keeps lm-eval's batching, request order, padding and caching exactly and
changes only how a batch is scored: the model's backbone gives the hidden states
``[batch, length, hidden]`` (no KV cache); then, row by row, the LM head and the log-softmax
run on at most ``chunk`` continuation positions at a time, and only the log-prob of each
continuation token and the greedy token are kept. The sum is taken over the same ``[1,
seq]`` vector lm-eval sums, so results are lm-eval's (tests compare them). When lm-eval's
one-token-continuation cache hands back several requests for one row, that row's
continuation log-probs are materialised as lm-eval does (one row, not the batch).

Every tensor of the scoring lives on the model's device (``self.device``: lm-eval takes it from
the model it is handed); only the two numbers of each answer come back to the host.
``batch_size="auto"`` (and ``auto:N``) sizes the batches as lm-eval does (``_batch_scheduler``:
its largest-batch search, which runs the full forward and so sizes for lm-eval's own memory, a
safe bound for the lean scoring) and then scores them lean.

Models whose logits are not ``lm_head(model(...).last_hidden_state)`` (e.g. with logit
soft-capping), seq2seq models and a model spread over several devices (``parallelize``) use ``HFLM`` unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from lm_eval.models.huggingface import HFLM
from lm_eval.models.utils import Collator
from lm_eval.models.utils_hf import pad_and_concat

DEFAULT_CHUNK = 256  # continuation positions per LM-head call: 256 x 49,152 x 4 bytes = 50 MB
# (request kind, requests done, requests total, tokens through the model); within a batch ``done`` moves in fractions,
# a decoder layer at a time, so a batch that takes minutes shows its pace from its first layer
ProgressFn = Callable[[str, float, int, int], None]


class LeanHFLM(HFLM):
    """``HFLM`` that scores a batch without holding its ``[batch, length, vocab]`` logits (module docstring)."""

    def __init__(self, *args, chunk: int = DEFAULT_CHUNK, progress: ProgressFn | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.chunk = max(1, int(chunk))
        self.progress = progress
        self._kind, self._done, self._total, self._tokens = "loglikelihood", 0, 0, 0
        self._batch = (0, 0)  # (requests, tokens) of the batch in the model, for the progress within it

    # --- progress: one count over a request list (rolling windows are counted as lm-eval batches them) ---

    def loglikelihood(self, requests, disable_tqdm: bool = False):
        self._start("loglikelihood", len(requests))
        return super().loglikelihood(requests, disable_tqdm=True)

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
        windows = 0
        for request in requests:
            tokens = len(self.tok_encode(request.args[0]))
            windows += max(1, math.ceil(tokens / self.max_length))
        self._start("loglikelihood_rolling", windows)
        return super().loglikelihood_rolling(requests, disable_tqdm=True)

    def _start(self, kind: str, total: int) -> None:
        self._kind, self._done, self._total, self._tokens = kind, 0, total, 0
        if self.progress is not None:
            self.progress(kind, 0, total, 0)

    def _within(self, fraction: float) -> None:
        """Progress partway through the batch in the model: ``fraction`` of its decoder layers have run."""
        if self.progress is not None:
            requests, tokens = self._batch
            self.progress(self._kind, self._done + fraction * requests, max(self._total, self._done + requests),
                          self._tokens + int(fraction * tokens))

    def _advance(self, requests: int, tokens: int) -> None:
        self._done += requests
        self._tokens += tokens
        if self.progress is not None:
            self.progress(self._kind, self._done, max(self._total, self._done), self._tokens)

    # --- scoring --------------------------------------------------------------------------------

    def _lean(self) -> bool:
        model = self.model
        return (
            self.backend == "causal"
            and self.mixed_precision_dtype is None
            and isinstance(getattr(model, "lm_head", None), torch.nn.Linear)
            and isinstance(getattr(model, "model", None), torch.nn.Module)
            and getattr(model.config, "final_logit_softcapping", None) is None
            and getattr(model.config, "logit_scale", None) is None
            and len(set((getattr(model, "hf_device_map", None) or {}).values())) <= 1  # a device map: HFLM's own scoring
        )

    @torch.inference_mode()
    def _hidden_states(self, inps: torch.Tensor) -> torch.Tensor:
        layers = list(getattr(self.model.model, "layers", None) or []) if self.progress is not None else []
        hooks = [layer.register_forward_hook(lambda *_args, part=number / len(layers): self._within(part))
                 for number, layer in enumerate(layers, 1)]
        try:
            return self.model.model(input_ids=inps, use_cache=False).last_hidden_state
        finally:
            for hook in hooks:
                hook.remove()

    def _log_probs(self, hidden: torch.Tensor) -> torch.Tensor:
        """Log-softmax over the vocabulary of ``hidden [n, D]``, as lm-eval computes it."""
        logits = self.model.lm_head(hidden)
        return F.log_softmax(logits, dim=-1, dtype=self.softmax_dtype)

    @torch.inference_mode()
    def _score_row(self, hidden: torch.Tensor, cont: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per continuation position of one row: the log-prob of its token, and the greedy token."""
        picked = torch.empty(cont.shape[0], dtype=self.softmax_dtype or hidden.dtype, device=hidden.device)
        greedy = torch.empty(cont.shape[0], dtype=torch.long, device=hidden.device)
        for start in range(0, cont.shape[0], self.chunk):
            stop = min(start + self.chunk, cont.shape[0])
            logp = self._log_probs(hidden[start:stop])
            greedy[start:stop] = logp.argmax(dim=-1)
            picked[start:stop] = torch.gather(logp, 1, cont[start:stop].unsqueeze(-1)).squeeze(-1)
            del logp
        return picked, greedy

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, override_bs: int | None = None):
        if not self._lean():
            result = super()._loglikelihood_tokens(requests, disable_tqdm=disable_tqdm, override_bs=override_bs)
            self._advance(len(requests), 0)
            return result

        def _collate(req):  # as HFLM: longest first
            toks = req[1] + req[2]
            return -len(toks), tuple(toks)

        def _lookup_one_token_cont(req):
            return req[-2] + req[-1][:-1]

        re_ord = Collator(requests, sort_fn=_collate, group_by="contexts" if self.logits_cache else None,
                          group_fn=_lookup_one_token_cont)
        res = []
        auto = self.batch_size == "auto"  # as HFLM: the rolling path passes its detected size as override_bs
        batch_size = (override_bs or 0) if auto else self.batch_size
        batch_fn = self._batch_scheduler if auto and len(re_ord) > 0 and not override_bs else None
        if batch_fn is not None:
            self.batch_sizes = {}  # as HFLM: detect again for this request list
        for chunk in re_ord.get_batched(n=batch_size, batch_fn=batch_fn):
            inps, conts, inplens = [], [], []
            for _, context_enc, continuation_enc in chunk:
                assert len(context_enc) > 0 and len(continuation_enc) > 0
                assert len(continuation_enc) <= self.max_length
                inp = torch.tensor((context_enc + continuation_enc)[-(self.max_length + 1):][:-1], dtype=torch.long, device=self.device)
                inps.append(inp)
                conts.append(continuation_enc)
                inplens.append(inp.shape[0])
            padding_len_inp = max(inplens)
            self._batch = (len(chunk), sum(inplens))
            hidden = self._hidden_states(pad_and_concat(padding_len_inp, inps, padding_side="right"))
            scored_tokens, answered = 0, len(res)
            for (request_str, ctx_tokens, _), row, inplen, cont_toks in zip(chunk, hidden, inplens, conts, strict=True):
                contlen = len(cont_toks)
                ctx_len = inplen + (row.shape[0] - padding_len_inp)
                row = row[ctx_len - contlen : ctx_len]  # the positions that predict the continuation
                cont = torch.tensor(cont_toks, dtype=torch.long, device=self.device)
                picked, greedy = self._score_row(row, cont)
                scored_tokens += inplen  # tokens through the model (the whole window or context + continuation)
                sentinel = torch.empty(1, contlen, 0, device=row.device)
                full = None
                for request_str, item_cont, item_logits in re_ord.get_cache(
                    req_str=request_str, cxt_toks=ctx_tokens, cont_toks=cont_toks, logits=sentinel,
                ):
                    if item_logits is sentinel and list(item_cont) == list(cont_toks):
                        answer = (float(picked.unsqueeze(0).sum()), bool((greedy == cont).all()))
                    else:  # several requests share this row (one-token continuations): lm-eval's own arithmetic
                        if full is None:
                            with torch.inference_mode():
                                full = self._log_probs(row).unsqueeze(0)  # [1, contlen, vocab], one row
                        item = torch.tensor(item_cont, dtype=torch.long, device=self.device).unsqueeze(0)
                        max_equal = (full.argmax(dim=-1)[:, -item.shape[1]:] == item).all()
                        gathered = torch.gather(full, 2, item.unsqueeze(-1)).squeeze(-1)
                        answer = (float(gathered.sum()), bool(max_equal))
                    res.append(answer)
                    if request_str is not None:
                        self.cache_hook.add_partial("loglikelihood", request_str, answer)
                del full
            del hidden
            self._advance(len(res) - answered, scored_tokens)
        return re_ord.get_original(res)


__all__ = ["DEFAULT_CHUNK", "LeanHFLM"]
