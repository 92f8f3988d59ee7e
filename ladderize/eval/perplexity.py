"""Perplexity on packed sequences: the quick accuracy measure used by adapt, sensitivity and benchmarks.

The default matches the project's reference numbers (MISSION.md): WikiText-2 valid (v1
tokenized text), tokenized as one stream, cut into the first 16 sequences of 512 tokens,
each scored independently (no sliding context), perplexity = exp(mean NLL) over the
511 predicted tokens of every sequence.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import LadderizeError

if TYPE_CHECKING:
    import torch

WIKITEXT2_VALID = Path("wikitext-2") / "valid.txt"
# The held-out calibration split of WikiText-2 valid: the articles that start after the first
# eighth of the file. The reference window (16 x 512 tokens) ends at character 31,088 with
# SmolLM2's tokenizer, far inside that eighth (140,024 characters), so the two never overlap.
WIKITEXT2_HELDOUT_FRACTION = 1 / 8
_ARTICLE_TITLE = re.compile(r"^ = [^=].*[^=] = $", re.MULTILINE)
def shared_data_dir() -> Path:
    """Where the offline evaluation data lives: ``$LADDERIZE_DATA_DIR``, else the cache or ``../shared/data``
    beside a source checkout (``local_tasks.default_data_dirs``); one line when none exists."""
    from .local_tasks import require_data_dir

    return require_data_dir(None, option=None)  # adapt's --data wikitext2-heldout, the benchmarks: no flag


def packed_token_ids(tokenizer, text: str, seq_len: int, num_sequences: int) -> torch.Tensor:
    """Tokenize ``text`` as one stream and cut its start into ``[num_sequences, seq_len]``."""
    import torch

    ids = tokenizer(text, add_special_tokens=False, return_attention_mask=False)["input_ids"]
    needed = seq_len * num_sequences
    if len(ids) < needed:
        raise LadderizeError(f"evaluation text has {len(ids)} tokens, fewer than {num_sequences} x {seq_len}")
    return torch.tensor(ids[:needed], dtype=torch.long).view(num_sequences, seq_len)


def wikitext2_ids(tokenizer, seq_len: int = 512, num_sequences: int = 16) -> torch.Tensor:
    """The reference evaluation batch: the first ``num_sequences`` x ``seq_len`` tokens of WikiText-2 valid."""
    return packed_token_ids(tokenizer, _wikitext2_valid_text(), seq_len, num_sequences)


def wikitext2_valid_path() -> Path:
    """The WikiText-2 validation text file (one line when it is missing)."""
    path = shared_data_dir() / WIKITEXT2_VALID
    if not path.is_file():
        raise LadderizeError(f"WikiText-2 validation text not found at {path}")
    return path


def _wikitext2_valid_text() -> str:
    return wikitext2_valid_path().read_text(encoding="utf-8")


def wikitext2_heldout_articles() -> list[str]:
    """WikiText-2 valid articles disjoint from the evaluation window (calibration text in WikiText's domain).

    Whole articles (split at top-level `` = Title = `` lines) that start after the first
    ``WIKITEXT2_HELDOUT_FRACTION`` of the file, in file order.
    """
    text = _wikitext2_valid_text()
    starts = [m.start() for m in _ARTICLE_TITLE.finditer(text)] + [len(text)]
    boundary = len(text) * WIKITEXT2_HELDOUT_FRACTION
    return [text[a:b] for a, b in zip(starts, starts[1:]) if a >= boundary]


def perplexity(
    model: torch.nn.Module,
    tokens,
    seq_len: int = 512,
    num_sequences: int = 16,
    batch_size: int = 4,
) -> float:
    """Perplexity of ``model`` on packed sequences.

    ``tokens`` is either a tokenizer (then WikiText-2 valid is used) or a LongTensor of
    token ids, ``[N, S]`` (used as is, at most ``num_sequences`` rows) or 1-D (packed here).
    """
    import torch

    with torch.no_grad():
        return _perplexity(model, tokens, seq_len, num_sequences, batch_size)


def _perplexity(model: torch.nn.Module, tokens, seq_len: int, num_sequences: int, batch_size: int) -> float:
    import torch

    if isinstance(tokens, torch.Tensor):
        ids = tokens.long()
        if ids.dim() == 1:
            usable = (ids.numel() // seq_len) * seq_len
            ids = ids[:usable].view(-1, seq_len)
        ids = ids[:num_sequences]
        if ids.numel() == 0:
            raise LadderizeError("no complete sequence to evaluate")
    else:
        ids = wikitext2_ids(tokens, seq_len, num_sequences)
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    nll, count = 0.0, 0
    try:
        for start in range(0, ids.shape[0], batch_size):
            batch = ids[start : start + batch_size].to(device)
            logits = model(input_ids=batch, use_cache=False).logits  # [B, S, V]
            nll += torch.nn.functional.cross_entropy(
                logits[:, :-1].reshape(-1, logits.shape[-1]).float(), batch[:, 1:].reshape(-1), reduction="sum"
            ).item()
            count += batch[:, 1:].numel()
    finally:
        model.train(was_training)
    return math.exp(nll / count)
