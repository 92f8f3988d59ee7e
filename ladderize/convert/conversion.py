"""Conversion: stream a dense (or converted) source checkpoint into the Ladder/SPD format at OUT.

The source is a local directory, a hub id or a GGUF file (``sources.py``); the tensors stream one at a
time through the one checkpoint writer (``checkpoint/io.write_checkpoint``) with the layout applied to
the config. Llama tensor names are unchanged.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from ..version import __version__
from ..errors import LadderizeError
from ..model import Layout
from ..checkpoint.architectures import LM_HEAD, architecture_for, expected_tensors, is_ignored_tensor, ladder_config_kwargs
from ..checkpoint.atomic import check_output_free
from ..checkpoint.free_space import check_free_space
from ..checkpoint.shapes import ModelShape
from ..checkpoint.io import DEFAULT_MAX_SHARD_BYTES, ProgressFn, build_config, write_checkpoint
from ..checkpoint.placement import parse_dtype
from .sources import Source, resolve_source


def source_layout(source_config: dict[str, Any], ranges: Mapping[str, str | None], spd_tp_size: int) -> Layout:
    """Parse range specs (mode name to ranges) against the source's layer count; with none given, a converted
    source keeps its own layout."""
    num_layers = int(source_config["num_hidden_layers"])
    own = ladder_config_kwargs(source_config)  # a converted (ours or the Ladder authors') source: its layer_modes
    if all(spec in (None, "none") for spec in ranges.values()) and own.get("layer_modes"):
        return Layout.from_config(_Namespace({**source_config, **own}))
    return Layout.from_mode_ranges(num_layers, ranges, spd_tp_size=spd_tp_size)


class _Namespace:
    def __init__(self, mapping: dict[str, Any]):
        self.__dict__.update(mapping)


def convert_checkpoint(
    src: str,
    out: Path | str,
    *,
    spd_tp_size: int = 1,
    layout: Layout | None = None,
    dtype: str | None = "auto",
    force: bool = False,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    progress: ProgressFn | None = None,
    extra_provenance: dict[str, Any] | None = None,
    plain: bool = False,
    **ranges: str | None,
) -> Path:
    """Convert SRC (local dir, hub id or .gguf) into a Ladder/SPD checkpoint at OUT, atomically.

    ``ranges``: the layers of each converted mode, by its name (``ladder="15:30", spd="0:4"``, or ``**mapping``), as
    half-open slices (see ``parse_layer_ranges``); ``layout`` overrides them.
    Tensors stream one at a time into shards of at most ``max_shard_bytes``. ``plain`` writes a
    dense source as a plain Llama checkpoint (see ``build_config``).
    """
    out = Path(out).expanduser().absolute()
    check_output_free(out, force, inputs=[src])
    target_dtype = parse_dtype(dtype)
    source = resolve_source(src)
    architecture_for(source.config)
    layout = layout or source_layout(source.config, ranges, spd_tp_size)
    config = build_config(source.config, layout, plain=plain)
    check_free_space({"OUT": (out, output_bytes(source, config, target_dtype))})  # before a tensor is read
    expected = expected_tensors(ladder_config_kwargs(config.to_dict()))
    _check_tensor_names(source, expected, config.tie_word_embeddings)

    def converted_tensors() -> Iterator[tuple[str, torch.Tensor]]:
        wanted, done, written_dtype = set(expected), 0, target_dtype
        for name, tensor in source.iter_tensors():
            if name not in wanted:
                continue
            if target_dtype is not None and tensor.is_floating_point():
                tensor = tensor.to(target_dtype)
            written_dtype = written_dtype or tensor.dtype
            yield name, tensor
            done += 1
            if progress:
                progress(done, len(expected), name)
        config.dtype = str(written_dtype).removeprefix("torch.")

    def provenance(files: list[str]) -> dict[str, Any]:
        return {
            "ladderize_version": __version__,
            "created": _now(),
            "source": {  # local paths absolute here; the writer records them relative to OUT (portable_paths)
                "spec": src if source.kind == "hub" else str(Path(src).expanduser().absolute()),
                "kind": source.kind,
                "path": str((source.path / source.gguf_file if source.gguf_file else source.path).absolute()),
                "architecture": (source.config.get("architectures") or [source.config.get("model_type")])[0],
                "files_sha256": source.hashed_files(),
            },
            "layout": {**layout.ranges(), "spd_tp_size": layout.spd_tp_size, "describe": layout.describe()},
            "dtype": config.dtype,
            "weight_files": files,
            "history": [{"step": "convert", "at": _now(), "layout": layout.describe()}],
            **(extra_provenance or {}),
        }

    return write_checkpoint(
        out, config, converted_tensors(), force=force, max_shard_bytes=max_shard_bytes,
        tokenizer=source.load_tokenizer(), generation_config=source.load_generation_config(), provenance=provenance,
    )


def output_bytes(source: Source, config: Any, dtype: torch.dtype | None) -> float:
    """The bytes of the weights a conversion of ``source`` writes: the source's weight files where it keeps their
    dtype (``dtype`` None), else every parameter of ``config`` at ``dtype`` (a GGUF source is read as float32)."""
    if dtype is None and source.kind != "gguf":
        return float(sum(file.stat().st_size for file in source.weight_files))
    return float(ModelShape.from_config(config).num_parameters * (dtype or torch.float32).itemsize)


def _check_tensor_names(source: Source, expected: list[str], tied: bool) -> None:
    present = set(source.tensor_names())
    missing = [n for n in expected if n not in present]
    if missing:
        raise LadderizeError(f"source {source.spec} is missing tensor {missing[0]} ({len(missing)} missing in all)")
    allowed = set(expected) | ({LM_HEAD} if tied else set())
    unexpected = sorted(n for n in present - allowed if not is_ignored_tensor(n))
    if unexpected:
        raise LadderizeError(
            f"source {source.spec} has tensor {unexpected[0]} that a Llama-family model does not use "
            f"({len(unexpected)} unexpected in all)"
        )


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


__all__ = ["convert_checkpoint", "source_layout"]
