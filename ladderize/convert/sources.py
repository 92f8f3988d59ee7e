"""Where a source checkpoint comes from: a local HF directory, a hub id, or a ``.gguf`` file.

A ``Source`` yields its tensors one at a time (one safetensors shard open at a time), so
conversion memory stays near one shard. GGUF files are dequantized by transformers as a
whole; they are small (quantized) by nature.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from typing import TYPE_CHECKING

from ..errors import LadderizeError, one_line
from ..checkpoint.architectures import architecture_for, read_config_file, read_config_json
from ..checkpoint.tensor_files import (check_finite, iter_file_tensors, no_safetensors, tensor_names,
                                       weight_files as safetensors_files)

if TYPE_CHECKING:
    import torch

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "generation_config.json",
)
HUB_PATTERNS = ["*.json", "*.safetensors", "tokenizer.model", "*.txt", "*.jinja"]


@dataclass
class Source:
    """A resolved source checkpoint."""

    spec: str  # what the user passed
    kind: str  # "local" | "hub" | "gguf"
    path: Path  # the directory holding the files (for gguf: the file's directory)
    config: dict[str, Any]
    weight_files: list[Path]
    gguf_file: str | None = None
    _gguf_state: dict[str, torch.Tensor] | None = field(default=None, repr=False)

    def tensor_names(self) -> list[str]:
        if self.kind == "gguf":
            return list(self._load_gguf())
        names: list[str] = []
        for file in self.weight_files:
            names.extend(tensor_names(file))
        return names

    def iter_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield ``(name, tensor)`` pairs, keeping at most one shard open."""
        if self.kind == "gguf":
            where = self.path / self.gguf_file
            yield from ((name, check_finite(name, tensor, where)) for name, tensor in self._load_gguf().items())
            return
        for file in self.weight_files:
            yield from iter_file_tensors(file)

    def hashed_files(self) -> dict[str, str]:
        """sha256 of every source file the conversion reads (weights, config, tokenizer)."""
        files = {p.name: p for p in self.weight_files}
        for name in ("config.json", "model.safetensors.index.json", *TOKENIZER_FILES):
            if (self.path / name).is_file():
                files[name] = self.path / name
        return {name: sha256_file(path) for name, path in sorted(files.items())}

    def load_tokenizer(self):
        """The source tokenizer, or ``None`` when the source has none."""
        from transformers import AutoTokenizer

        try:
            if self.kind == "gguf":
                return AutoTokenizer.from_pretrained(str(self.path), gguf_file=self.gguf_file)
            if not any((self.path / n).is_file() for n in TOKENIZER_FILES[:5]):
                return None
            # never run a checkpoint's own code, and never ask: the Ladder authors' configs carry an auto_map
            return AutoTokenizer.from_pretrained(str(self.path), trust_remote_code=False)
        except Exception as exc:  # a broken tokenizer is a corrupt source
            raise LadderizeError(f"cannot load the tokenizer of {self.spec}: {one_line(exc)}") from None

    def load_generation_config(self):
        from transformers import GenerationConfig

        if (self.path / "generation_config.json").is_file():
            return GenerationConfig.from_pretrained(str(self.path))
        keys = ("bos_token_id", "eos_token_id", "pad_token_id")
        return GenerationConfig(**{k: self.config[k] for k in keys if self.config.get(k) is not None})

    def _load_gguf(self) -> dict[str, torch.Tensor]:
        import torch

        if self._gguf_state is None:
            from transformers import AutoModelForCausalLM

            try:
                model = AutoModelForCausalLM.from_pretrained(
                    str(self.path), gguf_file=self.gguf_file, dtype=torch.float32
                )
            except Exception as exc:
                raise LadderizeError(f"cannot read GGUF file {self.path / self.gguf_file}: {one_line(exc)}") from None
            self._gguf_state = dict(model.state_dict())
        return self._gguf_state


def check_source(spec: str) -> str:
    """What SRC is, checked without torch or transformers (the command line calls it first): ``"local"`` (a folder
    whose config ladderize reads), ``"gguf"`` (a .gguf file) or ``"hub"`` (a hub id); anything else is one line:
    a file that is not .gguf, a path that does not exist, an unreadable or unsupported config."""
    path = Path(spec).expanduser()
    if path.exists():
        if path.is_file():
            if path.suffix.lower() != ".gguf":
                raise LadderizeError(f"{spec} is a file but not a .gguf file; pass a checkpoint directory or a .gguf file")
            return "gguf"
        architecture_for(read_config_json(path))
        return "local"
    if spec.startswith((".", "/", "~")) or spec.count("/") > 1 or spec.endswith(".gguf"):
        raise LadderizeError(f"source {spec} does not exist")
    _check_reachable(spec)
    return "hub"


def _check_reachable(repo_id: str) -> None:
    """A hub id with the hub offline (``HF_HUB_OFFLINE``): its snapshot must be in the hub's cache, or one line (no
    download is tried, so nothing else could answer)."""
    from huggingface_hub import constants, try_to_load_from_cache

    setting = os.environ.get("HF_HUB_OFFLINE")  # as the process has it now (huggingface_hub read it at its import)
    if not (constants.HF_HUB_OFFLINE if setting is None else setting.strip().upper() in ("1", "ON", "YES", "TRUE")):
        return
    try:
        cached = try_to_load_from_cache(repo_id, "config.json")
    except Exception:  # not a hub id at all (huggingface_hub's validation): nothing of it can be cached
        cached = None
    if not isinstance(cached, str):
        raise LadderizeError(f"source {repo_id} is not a local path, and with the hub offline (HF_HUB_OFFLINE) its cache "
                             f"{constants.HF_HUB_CACHE} holds no copy of {repo_id!r}; pass a local checkpoint directory "
                             "or a .gguf file, or set HF_HUB_OFFLINE=0 to download it")


def resolve_source(spec: str) -> Source:
    """Resolve SRC to a ``Source``: an existing path is local; otherwise it is tried as a hub id."""
    kind, path = check_source(spec), Path(spec).expanduser()
    if kind == "gguf":
        return _gguf_source(spec, path)
    if kind == "local":
        return _local_source(spec, path, kind="local")
    return _local_source(spec, _download_from_hub(spec), kind="hub")


def _local_source(spec: str, path: Path, kind: str) -> Source:
    config_path = path / "config.json"
    if not config_path.is_file():
        raise LadderizeError(f"{spec} is not a model checkpoint: it has no config.json")
    config = read_config_file(config_path)
    weight_files = safetensors_files(path)
    if not weight_files:
        raise no_safetensors(path, spec)
    for file in weight_files:
        tensor_names(file)  # validates every header up front, before any output is written
    return Source(spec=spec, kind=kind, path=path, config=config, weight_files=weight_files)


def _gguf_source(spec: str, path: Path) -> Source:
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name).to_dict()
    except Exception as exc:
        raise LadderizeError(f"cannot read GGUF file {path}: {one_line(exc)}") from None
    config.pop("quantization_config", None)
    config.setdefault("architectures", [])
    return Source(spec=spec, kind="gguf", path=path.parent, config=config, weight_files=[path], gguf_file=path.name)


def _download_from_hub(repo_id: str) -> Path:
    try:
        from huggingface_hub import snapshot_download

        os.environ.setdefault("HF_HUB_ETAG_TIMEOUT", "15")
        os.environ.setdefault("HF_HUB_DOWNLOAD_TIMEOUT", "30")
        return Path(snapshot_download(repo_id, allow_patterns=HUB_PATTERNS))
    except Exception as exc:
        raise LadderizeError(
            f"cannot fetch {repo_id!r} from the Hugging Face hub ({type(exc).__name__}: {one_line(exc)}); "
            "when offline, pass a local checkpoint directory or a .gguf file"
        ) from None


def sha256_file(path: Path, chunk_bytes: int = 8 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk_bytes):
            digest.update(block)
    return digest.hexdigest()
