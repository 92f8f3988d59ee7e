"""Safetensors in and out: the one reader (headers, tensors, slices) and the streaming shard writer.

Reading: ``open_safetensors`` (one file) and ``CheckpointTensors`` (a checkpoint folder, single
file or sharded index) turn a truncated or corrupt file into one line,
``corrupt safetensors file PATH: <safetensors' reason>``, wherever it is read (convert,
inspect, adapt's streamed layers, the runtime's rank weights); tensor data read through it is
checked finite on the way (``check_finite``: NaN/Inf weights are one line too).
Writing: ``ShardWriter`` flushes a shard whenever ``max_shard_bytes`` would be exceeded.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from typing import TYPE_CHECKING

from ..errors import LadderizeError, one_line
from .atomic import apply_umask

if TYPE_CHECKING:
    import torch

# Header reads (names, shapes, parameter counts) open files without torch, so ``inspect`` and the argument
# checks stay light; reads of tensor data use torch, imported then.
HEADER = "numpy"

FLOATING = {"F64": "float64", "F32": "float32", "BF16": "bfloat16", "F16": "float16"}  # safetensors' names
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def _corrupt(file: Path | str, exc: BaseException) -> LadderizeError:
    return LadderizeError(f"corrupt safetensors file {file}: {one_line(exc)}")


def check_finite(name: str, tensor: torch.Tensor, where: Path | str) -> torch.Tensor:
    """``tensor`` unchanged if every value is finite, else one line naming the tensor and its file: NaN or Inf
    weights are corrupt (an overwritten file keeps a valid header), and a model built from them would
    generate token 0 forever. One pass over values that are being read anyway."""
    import torch

    if tensor.is_floating_point() and tensor.numel() and not bool(torch.isfinite(tensor).all()):
        bad = int((~torch.isfinite(tensor)).sum())
        raise LadderizeError(f"corrupt weights in {where}: tensor {name} has {bad:,} non-finite values (NaN/Inf) of {tensor.numel():,}")
    return tensor


@contextlib.contextmanager
def open_safetensors(file: Path | str, framework: str = "pt") -> Iterator[Any]:
    """``safe_open`` of one file (torch tensors; ``HEADER`` for the header only, without torch); a missing,
    truncated or corrupt file is one ``LadderizeError`` line."""
    from safetensors import safe_open

    if not Path(file).is_file():
        raise LadderizeError(f"safetensors file {file} not found")
    try:
        handle = safe_open(str(file), framework=framework)
    except Exception as exc:
        raise _corrupt(file, exc) from None
    with handle:
        yield _CheckedHandle(handle, file)


class _CheckedHandle:
    """A ``safe_open`` handle whose reads raise the one-line error too (data cut after a whole header)."""

    def __init__(self, handle: Any, file: Path | str):
        self._handle, self.file = handle, file

    def keys(self) -> list[str]:
        return list(self._handle.keys())

    def metadata(self) -> dict[str, str] | None:
        return self._handle.metadata()

    def shape(self, name: str) -> list[int]:
        return list(self._handle.get_slice(name).get_shape())

    def get_tensor(self, name: str) -> torch.Tensor:
        try:
            tensor = self._handle.get_tensor(name)
        except Exception as exc:
            raise _corrupt(self.file, exc) from None
        return check_finite(name, tensor, self.file)

    def get_slice(self, name: str) -> Any:
        try:
            return self._handle.get_slice(name)
        except Exception as exc:
            raise _corrupt(self.file, exc) from None

    def read(self, name: str, rows: Sequence[slice] | None = None, cols: Sequence[slice] | None = None) -> torch.Tensor:
        """The tensor, or the concatenation of its row slices (dim 0) or column slices (dim 1)."""
        if rows is None and cols is None:
            return self.get_tensor(name)
        import torch

        view = self.get_slice(name)
        try:
            part = torch.cat([view[s] for s in rows], dim=0) if rows is not None else torch.cat([view[:, s] for s in cols], dim=1)
        except Exception as exc:
            raise _corrupt(self.file, exc) from None
        return check_finite(name, part, self.file)


def tensor_names(file: Path | str) -> list[str]:
    """The tensor names in one file's header (no data read, no torch)."""
    with open_safetensors(file, HEADER) as handle:
        return handle.keys()


def tensor_shapes(file: Path | str) -> dict[str, list[int]]:
    """``{name: shape}`` from one file's header (no data read, no torch)."""
    with open_safetensors(file, HEADER) as handle:
        return {name: handle.shape(name) for name in handle.keys()}


def iter_file_tensors(file: Path | str, names: Iterable[str] | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` of one file (its header order, or ``names``), the file open only meanwhile."""
    with open_safetensors(file) as handle:
        for name in handle.keys() if names is None else names:
            yield name, handle.get_tensor(name)


def read_tensors(files: dict[str, Path | str]) -> dict[str, torch.Tensor]:
    """The named tensors (``{name: safetensors file}``), one file open at a time and closed after."""
    by_file: dict[Path, list[str]] = {}
    for name, file in files.items():
        by_file.setdefault(Path(file), []).append(name)
    tensors: dict[str, torch.Tensor] = {}
    for file, names in by_file.items():
        tensors.update(iter_file_tensors(file, names))
    return tensors


def weight_files(path: Path | str) -> list[Path]:
    """A checkpoint folder's safetensors files: those its index names (all must exist), else ``*.safetensors``."""
    path = Path(path)
    index = path / INDEX_FILE
    if index.is_file():
        files = [path / name for name in sorted(set(_weight_map(index).values()))]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise LadderizeError(f"{path} is missing shard {missing[0]} named in its index")
        return files
    return sorted(path.glob("*.safetensors"))


def _weight_map(index: Path) -> dict[str, str]:
    try:
        return dict(json.loads(index.read_text())["weight_map"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise LadderizeError(f"cannot read {index}: {one_line(exc)}") from None


PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


def no_safetensors(path: Path, name: str | None = None) -> LadderizeError:
    """The one line of a checkpoint folder without safetensors weights (``name``: how the user named it), which says
    so where it holds pickles instead."""
    name = str(path) if name is None else name
    pickles = sorted(p.name for p in path.iterdir() if p.suffix in PICKLE_SUFFIXES) if path.is_dir() else []
    if pickles:
        return LadderizeError(f"{name} holds only pickle weights ({pickles[0]}...); ladderize loads safetensors only, "
                              "never pickles")
    return LadderizeError(f"{name} has no .safetensors weights")


class CheckpointTensors:
    """Lazy reads from a checkpoint folder's safetensors (single file or sharded index): names, shapes, tensors, slices.

    Handles stay open (memory-mapped) until ``close``; every failure is one ``LadderizeError`` line.
    ``framework=HEADER`` reads names and shapes only, without torch (``inspect``).
    """

    def __init__(self, path: Path | str, framework: str = "pt"):
        self.path, self.framework = Path(path), framework
        index = self.path / INDEX_FILE
        if index.is_file():
            self.files: dict[str, Path] = {name: self.path / file for name, file in _weight_map(index).items()}
        else:
            found = sorted(self.path.glob("*.safetensors"))
            if not found:
                raise no_safetensors(self.path)
            self.files = {}
            for file in found:
                self.files.update(dict.fromkeys(tensor_names(file), file))
        self._handles: dict[Path, Any] = {}
        self._stack = contextlib.ExitStack()

    def _handle(self, file: Path) -> _CheckedHandle:
        if file not in self._handles:
            self._handles[file] = self._stack.enter_context(open_safetensors(file, self.framework))
        return self._handles[file]

    def names(self) -> list[str]:
        return list(self.files)

    def has(self, name: str) -> bool:
        return name in self.files

    def shape(self, name: str) -> list[int]:
        return self._handle(self._file(name)).shape(name)

    def _file(self, name: str) -> Path:
        if name not in self.files:
            raise LadderizeError(f"checkpoint is missing tensor {name}")
        return self.files[name]

    def read(self, name: str, rows: Sequence[slice] | None = None, cols: Sequence[slice] | None = None) -> torch.Tensor:
        """The tensor, or the concatenation of its row slices (dim 0) or column slices (dim 1)."""
        return self._handle(self._file(name)).read(name, rows, cols)

    def numel(self, name: str) -> int:
        """The number of values of tensor ``name``, from its header (nothing is loaded)."""
        return math.prod(self.shape(name))

    def num_parameters(self) -> int:
        """The number of stored values, from the headers (nothing is loaded)."""
        return sum(self.numel(name) for name in self.files)

    def floating_dtype(self) -> str | None:
        """The dtype name (``float32``, ``bfloat16``, ``float16``) holding most of the floating values, from the headers
        (nothing is loaded); ``None`` where no tensor is floating."""
        counts: dict[str, int] = {}
        for name in self.files:
            kind = FLOATING.get(self._handle(self._file(name)).get_slice(name).get_dtype())
            if kind is not None:
                counts[kind] = counts.get(kind, 0) + self.numel(name)
        return max(counts, key=counts.__getitem__) if counts else None

    def close(self) -> None:
        self._stack.close()
        self._handles.clear()

    def __enter__(self) -> "CheckpointTensors":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


def save_safetensors(tensors: dict[str, torch.Tensor], path: Path | str, metadata: dict[str, str] | None = None) -> None:
    """``safetensors.torch.save_file`` with the file mode the umask gives (safetensors itself writes 0600)."""
    from safetensors.torch import save_file

    save_file(tensors, str(path), metadata=metadata)
    apply_umask(path)


def check_shard_bytes(max_shard_bytes: int) -> int:
    """``--max-shard-bytes``: a positive byte count (0 or less would write one file per tensor), else one line."""
    if int(max_shard_bytes) < 1:
        raise LadderizeError(f"--max-shard-bytes must be a positive number of bytes, got {max_shard_bytes}")
    return int(max_shard_bytes)


class ShardWriter:
    """Collect tensors and write Hugging Face-style shards (``model-00001-of-00003.safetensors``) plus an index."""

    def __init__(self, out_dir: Path, max_shard_bytes: int = 2_000_000_000):
        self.out_dir = Path(out_dir)
        self.max_shard_bytes = check_shard_bytes(max_shard_bytes)
        self._buffer: dict[str, torch.Tensor] = {}
        self._buffer_bytes = 0
        self._shards: list[tuple[Path, list[str]]] = []
        self.total_bytes = 0

    def add(self, name: str, tensor: torch.Tensor) -> None:
        size = tensor.numel() * tensor.element_size()
        if self._buffer and self._buffer_bytes + size > self.max_shard_bytes:
            self._flush()
        self._buffer[name] = tensor.contiguous()
        self._buffer_bytes += size
        self.total_bytes += size

    def _flush(self) -> None:
        path = self.out_dir / f".shard-{len(self._shards):05d}.safetensors"
        save_safetensors(self._buffer, path, metadata={"format": "pt"})
        self._shards.append((path, list(self._buffer)))
        self._buffer, self._buffer_bytes = {}, 0

    def finish(self) -> list[str]:
        """Write the last shard, give shards their final names, write the index; return file names."""
        if self._buffer or not self._shards:
            self._flush()
        count = len(self._shards)
        if count == 1:
            os.replace(self._shards[0][0], self.out_dir / SINGLE_FILE)
            return [SINGLE_FILE]
        weight_map, names = {}, []
        for index, (path, tensor_names) in enumerate(self._shards, start=1):
            name = f"model-{index:05d}-of-{count:05d}.safetensors"
            os.replace(path, self.out_dir / name)
            names.append(name)
            weight_map.update({t: name for t in tensor_names})
        index_doc = {"metadata": {"total_size": self.total_bytes}, "weight_map": weight_map}
        (self.out_dir / INDEX_FILE).write_text(json.dumps(index_doc, indent=2, sort_keys=True) + "\n")
        return names
