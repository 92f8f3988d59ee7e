"""A checkpoint folder: its config (built, read, as plain Llama), the one writer, and the model and tokenizer loaders.

A converted checkpoint is a normal Hugging Face directory:

- ``model*.safetensors`` (+ index): Llama tensor names, unchanged;
- ``config.json``: ``model_type: ladder_llama`` with ``layer_modes``/``spd_tp_size`` and an
  ``auto_map`` pointing at the modeling files copied beside it;
- tokenizer files and ``generation_config.json``;
- ``ladderize.json``: the provenance record (source, ranges, tool version, source hashes, history; paths
  relative to the folder);
- ``README.md``: the model card (``card.py``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

from ..version import __version__
from .placement import parse_dtype, resolve_device
from ..errors import LadderizeError, one_line
from ..model import LadderLlamaConfig, LadderLlamaForCausalLM, Layout
from .shapes import ModelShape
from ..model.configuration_ladder_llama import AUTO_MAP
from .architectures import LM_HEAD, PROVENANCE_FILE, ladder_config_kwargs, name_tokenizer_class_portably, portable_paths, read_config_json, read_provenance  # noqa: F401 (re-exported)
from .atomic import atomic_directory
from .free_space import disk_full_as_one_line
from .card import CARD_FILE, model_card
from .tensor_files import ShardWriter, check_finite

DEFAULT_MAX_SHARD_BYTES = 1_000_000_000

ProgressFn = Callable[[int, int, str], None]  # (done, total, tensor name)


def build_config(source_config: dict[str, Any], layout: Layout, plain: bool = False):
    """The ``LadderLlamaConfig`` of a source config with ``layout`` applied (validated).

    ``plain`` writes a ``LlamaConfig`` instead (``model_type: llama``, no custom code), which any
    Llama tool loads; only an all-dense layout whose o_proj bias follows ``attention_bias`` has one.
    """
    kwargs = ladder_config_kwargs(source_config)
    kwargs.update(layout.config_fields())
    config = LadderLlamaConfig(**kwargs)
    if plain:
        if layout.converted_layers:
            raise LadderizeError(f"a plain Llama checkpoint cannot hold the converted layers of {layout.describe()}")
        if config.attention_out_bias != config.attention_bias:
            raise LadderizeError("this source's attention biases have no plain Llama config (q/k/v and o_proj differ)")
        return plain_llama_config(kwargs)
    return stamp_config(config)


#: What a plain ``LlamaConfig`` leaves out of a ladder config's values: the layout, the o_proj bias flag and the class names.
LADDER_ONLY_KEYS = ("layer_modes", "spd_tp_size", "spd_head_order", "attention_out_bias", "auto_map", "architectures", "model_type")


def plain_llama_config(values: dict[str, Any]):
    """The plain ``LlamaConfig`` (``LlamaForCausalLM``, no custom code) of a ladder config's values (the one place).

    ``values``: a ``config.json`` dict, ``LadderLlamaConfig`` keyword arguments or a preset's config dict; the
    caller has checked that every layer is dense and that o_proj's bias follows ``attention_bias``.
    """
    from transformers import LlamaConfig

    config = LlamaConfig(**{k: v for k, v in values.items() if k not in LADDER_ONLY_KEYS})
    config.architectures = ["LlamaForCausalLM"]
    return config


def stamp_config(config):
    """Name a ``LadderLlamaConfig``'s class and its ``auto_map`` (the one place); a plain Llama config is left as it is."""
    if isinstance(config, LadderLlamaConfig):
        config.architectures = ["LadderLlamaForCausalLM"]
        config.auto_map = dict(AUTO_MAP)
    return config


def write_checkpoint(
    out: Path | str,
    config,
    tensors: Iterable[tuple[str, torch.Tensor]],
    *,
    force: bool = False,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    tokenizer=None,
    generation_config=None,
    provenance: dict[str, Any] | Callable[[list[str]], dict[str, Any]] | None = None,
    extra: Callable[[Path], None] | None = None,
) -> Path:
    """The one checkpoint writer: OUT written whole into a temp dir renamed at the end, or not at all.

    ``tensors`` stream into shards of at most ``max_shard_bytes`` (+ index); then the config
    (``stamp_config``; read after the tensors, so they may set its ``dtype``), the modeling files
    beside a ``LadderLlamaConfig``, the generation config, the tokenizer (its ``model_max_length`` at most
    the config's positions), the provenance (a dict, or a function of the weight file names; its paths
    relative to OUT), the model card ``README.md`` and ``extra(tmp)``. A full disk ends it in one line
    (``free_space.disk_full_as_one_line``), the temp dir removed and an earlier OUT as it was.
    """
    out = Path(out).expanduser().absolute()
    kept = f"nothing of it was kept{', and the earlier ' + out.name + ' is as it was' if out.exists() else ''}"
    with disk_full_as_one_line("the checkpoint", out, kept), atomic_directory(out, force=force) as tmp:
        writer = ShardWriter(tmp, max_shard_bytes=max_shard_bytes)
        for name, tensor in tensors:
            writer.add(name, tensor)
        files = writer.finish()
        stamp_config(config).save_pretrained(tmp)  # a LadderLlamaConfig writes its code files beside it
        if not isinstance(config, LadderLlamaConfig):
            add_legacy_rope_fields(tmp / "config.json")
        if generation_config is not None:
            generation_config.save_pretrained(tmp)
        if tokenizer is not None:
            positions = getattr(config, "max_position_embeddings", None)
            if positions and tokenizer.model_max_length > positions:  # unset (1e30) or past what the model encodes
                tokenizer.model_max_length = positions
            tokenizer.save_pretrained(tmp)
            name_tokenizer_class_portably(tmp)
        record = None
        if provenance is not None:
            record = provenance(files) if callable(provenance) else provenance
            record = portable_paths({**record, "ladderize_version": __version__}, out)
            write_provenance(tmp, record)
        (tmp / CARD_FILE).write_text(model_card(config, record, out.name))
        if extra is not None:
            extra(tmp)
    return out


def add_legacy_rope_fields(config_file: Path) -> None:
    """Write ``rope_theta`` / ``rope_scaling`` (what transformers 4.x reads) beside a plain config's ``rope_parameters``.

    Without them a 4.x reader falls back to its default theta (10000) without a word. transformers 5
    reads ``rope_scaling`` in place of ``rope_parameters``, so it holds the same parameters less the theta.
    """
    values = json.loads(config_file.read_text())
    rope = dict(values.get("rope_parameters") or {})
    if "rope_theta" not in rope:
        return
    values["rope_theta"] = rope.pop("rope_theta")
    values["rope_scaling"] = None if rope.get("rope_type", "default") == "default" else rope
    config_file.write_text(json.dumps(values, indent=2, sort_keys=True) + "\n")


def write_companion_files(config, source: Path | None, out: Path) -> None:
    """The model card and provenance beside a model's own save (``save_pretrained``, ``push_to_hub``): the
    provenance of the folder it was loaded from (``source``; its paths made relative to ``out``), and the card
    built from it, as ``write_checkpoint`` writes them. A model loaded from no ladderize folder gets the card alone."""
    out = Path(out).expanduser().absolute()
    record = read_provenance(source) if source is not None else {}
    if record:
        record = portable_paths(record, out)
        write_provenance(out, record)
    (out / CARD_FILE).write_text(model_card(config, record or None, out.name))


def write_provenance(directory: Path, provenance: dict[str, Any]) -> None:
    (Path(directory) / PROVENANCE_FILE).write_text(json.dumps(provenance, indent=2, sort_keys=True) + "\n")


def load_config(path: Path | str) -> LadderLlamaConfig:
    """The one config reader: the ``LadderLlamaConfig`` of a checkpoint directory.

    Reads ladderize's format, plain Llama/Mistral/Qwen2 and the Ladder authors' ``llamaLadder``
    (``architectures.ladder_config_kwargs``). Everything else derives from the result:
    ``config.layout``, ``model_shape(config)`` (dims, parameter count).
    """
    return config_from_dict(read_config_json(path))


def config_from_dict(values: dict[str, Any]) -> LadderLlamaConfig:
    """``load_config`` of a config dict already in memory (a synthetic shape; ``model_type`` defaults to llama)."""
    values = dict(values)
    values.setdefault("model_type", "ladder_llama" if values.get("layer_modes") else "llama")
    return LadderLlamaConfig(**ladder_config_kwargs(values))


def model_shape(config: Any, name: str = "") -> ModelShape:
    """The ``ModelShape`` (dims, parameter count) of a config from ``load_config``."""
    return ModelShape.from_config(config, name)


def load_tokenizer(path: Path | str, needed_for: str = ""):
    """The tokenizer saved beside a checkpoint, or one line saying it cannot be loaded (and what needs it)."""
    from transformers import AutoTokenizer

    try:
        # explicit False: never run a checkpoint's code, and never prompt for it (an auto_map asks otherwise)
        return AutoTokenizer.from_pretrained(str(Path(path).expanduser()), trust_remote_code=False)
    except Exception as exc:
        need = f" ({needed_for} needs one)" if needed_for else ""
        raise LadderizeError(f"cannot load a tokenizer from {path}{need}: {one_line(exc)}") from None


def load_model(
    path: Path | str, dtype: str | torch.dtype | None = None, device: str | torch.device | None = "cpu"
) -> LadderLlamaForCausalLM:
    """Load a converted checkpoint, or a plain Llama/Mistral/Qwen2 safetensors directory, as a ladderize model.

    ``dtype``: the checkpoint's own when ``None``/``auto``; ``device``: as ``placement.resolve_device``
    (``auto`` is the accelerator when there is one). On an accelerator the weights are read from the
    safetensors straight onto it (``device_map``), so the host never holds a copy of the model.
    """
    path = Path(path).expanduser()
    target = resolve_device(device)
    config = load_config(path)
    if not any(path.glob("*.safetensors")):
        raise LadderizeError(f"{path} has no .safetensors weights")
    torch_dtype = dtype if isinstance(dtype, torch.dtype) else parse_dtype(dtype)
    placement = {} if target.type == "cpu" else {"device_map": {"": str(target)}}
    try:
        model = LadderLlamaForCausalLM.from_pretrained(
            str(path), config=config, dtype=torch_dtype or "auto", use_safetensors=True, **placement
        )
    except Exception as exc:
        raise LadderizeError(f"cannot load model weights from {path}: {one_line(exc)}") from None
    if hasattr(model, "hf_device_map"):  # one device: a plain module there, as after .to(); Accelerate then wraps it freely
        del model.hf_device_map
    for name, param in model.named_parameters():  # NaN/Inf weights (an overwritten file) are one line, not NaN results
        check_finite(name, param.detach(), path)
    return model.to(target).eval()


def save_model_checkpoint(
    model: LadderLlamaForCausalLM,
    tokenizer,
    out: Path | str,
    *,
    provenance: dict[str, Any],
    force: bool = False,
    generation_config=None,
    extra: Callable[[Path], None] | None = None,
) -> Path:
    """Write ``model`` atomically in the converted format (weights, config, code, tokenizer, provenance).

    Through ``write_checkpoint``: the model's tensors (a tied LM head once, as the embedding), its
    config with the parameters' dtype, and its generation config unless ``generation_config`` is given.
    """
    config = model.config
    config.dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    if generation_config is None and model.can_generate():
        generation_config = model.generation_config
    return write_checkpoint(
        out, config, model_tensors(model), force=force, tokenizer=tokenizer,
        generation_config=generation_config, provenance=provenance, extra=extra,
    )


def model_tensors(model: LadderLlamaForCausalLM) -> Iterator[tuple[str, torch.Tensor]]:
    """A model's checkpoint tensors (its state dict on the CPU; a tied ``lm_head.weight`` left to the embedding)."""
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    for name, tensor in model.state_dict().items():
        if tied and name == LM_HEAD:
            continue
        yield name, tensor.detach().cpu()

