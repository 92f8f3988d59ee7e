"""A data spec as sequences of ``seq_len`` tokens, read on demand from its token stores.

Documents (``documents.py``) are tokenized once into a token store (``token_store.py``: memory-mapped,
reused by later runs and stages), joined with the EOS token and cut into sequences of ``seq_len`` tokens
that training reads on demand (``TokenWindows``); a token budget stops tokenizing early (a larger one
later continues the store). A mixture's parts are packed on their own and interleaved in proportion.
Every failure is a one-line ``LadderizeError``.
"""

from __future__ import annotations

import numpy as np
import torch

from ..errors import LadderizeError
from .documents import mixture_parts
from .token_store import ensure_store


def _mixture_shares(parts: list[tuple[str, float]], wanted: int | None) -> list[int | None]:
    """Each part's sequences of a budget of ``wanted`` (largest remainder: they add up, each at least 1)."""
    if wanted is None:
        return [None] * len(parts)
    total = sum(weight for _, weight in parts)
    exact = [wanted * weight / total for _, weight in parts]
    shares = [int(x) for x in exact]
    by_remainder = sorted(range(len(parts)), key=lambda i: exact[i] - shares[i], reverse=True)
    for i in by_remainder[: wanted - sum(shares)]:
        shares[i] += 1
    return [max(1, share) for share in shares]



class TokenWindows:
    """Sequences of ``seq_len`` tokens cut from token stores (``token_store.py``), read on demand.

    Sequence ``i`` of a single store is its tokens ``[i * seq_len, (i + 1) * seq_len)``. A mixture
    interleaves its parts' sequences: sequence ``j`` of a part of ``n`` sits at fraction ``(j + 0.5) / n``
    of the set (ties by part), so any prefix keeps the mixture. Only that order (8 bytes a sequence) is
    held in memory; the tokens stay in the memory-mapped stores.
    """

    def __init__(self, stores: list, counts: list[int], seq_len: int, limit: int | None = None):
        self.stores, self.counts, self.seq_len = stores, counts, seq_len
        total = sum(counts)
        self.length = total if limit is None else min(total, limit)
        self._part = self._index = None
        if len(stores) > 1:
            keys = np.concatenate([(np.arange(n) + 0.5) / n for n in counts])
            parts = np.concatenate([np.full(n, p, dtype=np.int64) for p, n in enumerate(counts)])
            within = np.concatenate([np.arange(n, dtype=np.int64) for n in counts])
            order = np.lexsort((within, parts, keys))[: self.length]
            self._part, self._index = parts[order], within[order]

    def __len__(self) -> int:
        return self.length

    def rows(self, indices) -> torch.Tensor:
        """The sequences at ``indices`` (a sequence of ints or a 1-D tensor), as ``[len(indices), seq_len]`` int64."""
        out = np.empty((len(indices), self.seq_len), dtype=np.int64)
        for row, index in enumerate(int(i) for i in indices):
            if not 0 <= index < self.length:
                raise IndexError(f"sequence {index} of {self.length}")
            part, within = (0, index) if self._part is None else (int(self._part[index]), int(self._index[index]))
            out[row] = self.stores[part].tokens[within * self.seq_len:(within + 1) * self.seq_len]
        return torch.from_numpy(out)

    def head(self, count: int) -> torch.Tensor:
        """The first ``count`` sequences (at most all of them)."""
        return self.rows(range(min(count, self.length)))

    def all(self) -> torch.Tensor:
        return self.head(self.length)


def token_windows(
    spec: str, tokenizer, seq_len: int, max_tokens: int | None = None, min_sequences: int = 1, *,
    workers: int | None = None, progress=None, say=None,
) -> TokenWindows:
    """``spec``'s sequences of ``seq_len`` tokens (at least ``min_sequences``), up to ``max_tokens`` (rounded up to
    whole sequences; None: all). Tokenizes into the token store first where it does not hold them yet."""
    if seq_len < 2:
        raise LadderizeError(f"sequence length must be at least 2, got {seq_len}")
    wanted = None if max_tokens is None else -(-max_tokens // seq_len)
    parts = mixture_parts(spec)
    build = dict(workers=workers, progress=progress, say=say)
    if parts is None:
        store = ensure_store(spec, tokenizer, min_tokens=None if wanted is None else wanted * seq_len, **build)
        count = store.num_tokens // seq_len if wanted is None else min(store.num_tokens // seq_len, wanted)
        if count < min_sequences:
            raise LadderizeError(
                f"data {spec} has {store.num_tokens} tokens, fewer than {min_sequences} sequence(s) of {seq_len} tokens"
            )
        return TokenWindows([store], [count], seq_len)
    stores, counts = [], []
    for (name, _), share in zip(parts, _mixture_shares(parts, wanted)):
        store = ensure_store(name, tokenizer, min_tokens=None if share is None else share * seq_len, **build)
        count = store.num_tokens // seq_len
        if share is not None and count < share:
            raise LadderizeError(
                f"data mixture part {name!r} has {count} sequences of {seq_len} tokens, fewer than its share of {share}"
            )
        stores.append(store)
        counts.append(count if share is None else share)
    windows = TokenWindows(stores, counts, seq_len, wanted)
    if len(windows) < min_sequences:
        raise LadderizeError(f"data {spec} has {len(windows)} sequence(s) of {seq_len} tokens, fewer than {min_sequences}")
    return windows


def pack_tokens(
    spec: str, tokenizer, seq_len: int, max_tokens: int | None = None, min_sequences: int = 1
) -> torch.Tensor:
    """Tokenize the documents of ``spec`` and pack them into ``[N, seq_len]`` (N >= ``min_sequences``), in memory.

    Documents are separated by the tokenizer's EOS token. Reading stops once ``max_tokens``
    (rounded up to whole sequences) are collected; the incomplete tail is dropped. A mixture
    spec (``A*w+B*v``) packs each part on its own, see the module docstring. For the small
    calibration sets; training reads ``token_windows`` on demand.
    """
    return token_windows(spec, tokenizer, seq_len, max_tokens, min_sequences).all()


