"""A streaming safetensors writer: flushes a shard whenever ``max_shard_bytes`` would be exceeded."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import save_file

from .atomic import apply_umask

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def save_safetensors(tensors: dict[str, torch.Tensor], path: Path | str, metadata: dict[str, str] | None = None) -> None:
    """``safetensors.torch.save_file`` with the file mode the umask gives (safetensors itself writes 0600)."""
    save_file(tensors, str(path), metadata=metadata)
    apply_umask(path)


class ShardWriter:
    """Collect tensors and write Hugging Face-style shards (``model-00001-of-00003.safetensors``) plus an index."""

    def __init__(self, out_dir: Path, max_shard_bytes: int = 2_000_000_000):
        self.out_dir = Path(out_dir)
        self.max_shard_bytes = int(max_shard_bytes)
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
