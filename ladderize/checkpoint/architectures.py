"""Which source architectures convert, how their config maps to ``LadderLlamaConfig``, and their tensor names.

Tensor names are templates (``${layer}`` is the layer index), mergekit-style: the converter
checks a checkpoint against this table instead of scattering names through functions.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from string import Template
from typing import Any

from ..errors import LadderizeError
from .atomic import write_file_atomic

# The tensor-parallel plan as data (torchtitan style): each module of a decoder layer, and how
# TP splits its weight. ``colwise`` keeps output rows, ``rowwise`` keeps input columns, of the
# rank's ``query_heads``, ``kv_heads`` or MLP ``inner`` slice; norms are replicated. The
# converter's tensor names, the runtime's sharding and the LoRA targets all derive from it.
LAYER_PREFIX = "model.layers.${layer}."
TP_SPLITS: dict[str, tuple[str, str]] = {
    "input_layernorm": ("replicate", ""),
    "self_attn.q_proj": ("colwise", "query_heads"),
    "self_attn.k_proj": ("colwise", "kv_heads"),
    "self_attn.v_proj": ("colwise", "kv_heads"),
    "self_attn.o_proj": ("rowwise", "query_heads"),
    "post_attention_layernorm": ("replicate", ""),
    "mlp.gate_proj": ("colwise", "inner"),
    "mlp.up_proj": ("colwise", "inner"),
    "mlp.down_proj": ("rowwise", "inner"),
}
LINEAR_MODULES: tuple[str, ...] = tuple(m for m, (style, _) in TP_SPLITS.items() if style != "replicate")  # LoRA targets
LAYER_TENSORS: tuple[str, ...] = tuple(f"{LAYER_PREFIX}{module}.weight" for module in TP_SPLITS)


def layer_prefix(layer: int) -> str:
    """The prefix of every tensor of decoder layer ``layer``: ``model.layers.3.``."""
    return Template(LAYER_PREFIX).substitute(layer=layer)


def layer_tensor(layer: int, module: str, kind: str = "weight") -> str:
    """The checkpoint name of one layer tensor, e.g. ``model.layers.3.self_attn.q_proj.weight``."""
    return f"{layer_prefix(layer)}{module}.{kind}"


QKV_BIAS_TENSORS = tuple(f"model.layers.${{layer}}.self_attn.{p}_proj.bias" for p in "qkv")
O_BIAS_TENSORS = ("model.layers.${layer}.self_attn.o_proj.bias",)
MLP_BIAS_TENSORS = tuple(f"model.layers.${{layer}}.mlp.{p}_proj.bias" for p in ("gate", "up", "down"))
EMBED_TENSOR = "model.embed_tokens.weight"
FINAL_NORM_TENSOR = "model.norm.weight"
GLOBAL_TENSORS: tuple[str, ...] = (EMBED_TENSOR, FINAL_NORM_TENSOR)
LM_HEAD = "lm_head.weight"
# Buffers some exporters save that carry no information (recomputed from the config).
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)

# Config keys copied from the source config into LadderLlamaConfig.
SHARED_CONFIG_KEYS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "hidden_act",
    "max_position_embeddings",
    "initializer_range",
    "rms_norm_eps",
    "use_cache",
    "pad_token_id",
    "bos_token_id",
    "eos_token_id",
    "tie_word_embeddings",
    "rope_parameters",
    "attention_dropout",
    "dtype",
)


@dataclass(frozen=True)
class Architecture:
    """A source architecture the Ladder/SPD model reproduces exactly."""

    name: str  # the HF ``architectures`` entry
    model_type: str
    qkv_bias_key: str | None  # config key that turns on q/k/v biases
    o_bias_key: str | None  # config key that turns on the o_proj bias
    mlp_bias_key: str | None


ARCHITECTURES: dict[str, Architecture] = {
    "llama": Architecture("LlamaForCausalLM", "llama", "attention_bias", "attention_bias", "mlp_bias"),
    "ladder_llama": Architecture("LadderLlamaForCausalLM", "ladder_llama", "attention_bias", "attention_out_bias", "mlp_bias"),
    "mistral": Architecture("MistralForCausalLM", "mistral", None, None, None),
    # Qwen2 has q/k/v biases (always on) and none on o_proj.
    "qwen2": Architecture("Qwen2ForCausalLM", "qwen2", "__always__", None, None),
    # The Ladder authors' hybrid checkpoints: Llama tensors, with ``ladder_layers`` naming the ladder layers.
    "llamaLadder": Architecture("LlamaForCausalLM", "llamaLadder", "attention_bias", "attention_bias", "mlp_bias"),
}


def authors_layer_modes(config: dict[str, Any]) -> list[str] | None:
    """The Ladder authors' ``ladder_layers`` as ``layer_modes``; ``None`` for any other config.

    Their format (``model_type: llamaLadder``) stores an int N for the last N layers, or a list
    of layer indices.
    """
    if config.get("model_type") != "llamaLadder":
        return None
    layers = int(config["num_hidden_layers"])
    raw = config.get("ladder_layers", 0)
    if isinstance(raw, bool) or not isinstance(raw, (int, list)):
        raise LadderizeError(f"ladder_layers must be an int (the last N layers) or a list of layer indices, got {raw!r}")
    if isinstance(raw, int):
        if not 0 <= raw <= layers:
            raise LadderizeError(f"ladder_layers={raw} is outside the model's {layers} layers")
        chosen = set(range(layers - raw, layers))
    else:
        if any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < layers for i in raw):
            raise LadderizeError(f"ladder_layers {raw} names layers outside 0..{layers - 1}")
        chosen = set(raw)
    return ["ladder" if i in chosen else "dense" for i in range(layers)]


PROVENANCE_FILE = "ladderize.json"  # what ladderize did to a checkpoint, beside its config.json


def read_config_json(path: Path | str) -> dict[str, Any]:
    """A checkpoint folder's ``config.json``, or one line: not found, not a checkpoint (a file, no config.json), unreadable.

    The one reader of checkpoint configs (light: no torch), under ``load_config`` and the CLI.
    """
    path = Path(path).expanduser()
    if not path.exists():
        raise LadderizeError(f"checkpoint {path} not found")
    if not path.is_dir():
        raise LadderizeError(f"{path} is not a checkpoint: a checkpoint is a directory with config.json and safetensors weights")
    config_file = path / "config.json"
    if not config_file.is_file():
        raise LadderizeError(f"{path} is not a model checkpoint: it has no config.json")
    return read_config_file(config_file)


# transformers 5 saves a fast tokenizer's class as ``TokenizersBackend``, a name transformers 4 does not know;
# ``PreTrainedTokenizerFast`` is the same class in 5 (an alias) and the one 4 reads.
PORTABLE_TOKENIZER_CLASSES = {"TokenizersBackend": "PreTrainedTokenizerFast"}


def name_tokenizer_class_portably(directory: Path) -> None:
    """Rename a saved tokenizer's class to the name every supported transformers reads (``PORTABLE_TOKENIZER_CLASSES``)."""
    file = Path(directory) / "tokenizer_config.json"
    if not file.is_file():
        return
    values = json.loads(file.read_text())
    if values.get("tokenizer_class") in PORTABLE_TOKENIZER_CLASSES:
        values["tokenizer_class"] = PORTABLE_TOKENIZER_CLASSES[values["tokenizer_class"]]
        write_file_atomic(file, json.dumps(values, indent=2, sort_keys=True) + "\n")


def read_provenance(path: Path | str) -> dict[str, Any]:
    """The ``ladderize.json`` provenance of a checkpoint (empty dict for a non-ladderize checkpoint).

    Its recorded paths come back absolute (``absolute_paths``), whatever folder the checkpoint was moved to.
    """
    file = Path(path) / PROVENANCE_FILE
    if not file.is_file():
        return {}
    try:
        record = json.loads(file.read_text())
    except ValueError as exc:
        raise LadderizeError(f"corrupt provenance file {file}: {exc}") from None
    return absolute_paths(record, Path(path).expanduser().absolute())


def portable_paths(record: Any, base: Path) -> Any:
    """``record`` as a shared checkpoint keeps it: every absolute path made relative to ``base``.

    ``base`` is the checkpoint's folder: ``../source`` where the two share a folder below the root, else
    ``~/...`` under the home folder, else ``../../data/...``; so no user name or home folder is published.
    """
    home = Path.home().absolute()

    def portable(text: str) -> str:
        path = Path(text)
        if os.path.commonpath([path, base]) == path.anchor and path.is_relative_to(home) and home != Path(path.anchor):
            return (Path("~") / path.relative_to(home)).as_posix()
        return Path(os.path.relpath(path, base)).as_posix()

    return _map_strings(record, lambda text: portable(text) if os.path.isabs(text) else text)


def absolute_paths(record: Any, base: Path) -> Any:
    """The inverse of ``portable_paths`` on reading: ``../`` and ``~/`` paths made absolute again."""

    def absolute(text: str) -> str:
        if text.startswith("~/"):
            return str(Path(text).expanduser())
        if text == ".." or text.startswith("../"):
            return os.path.normpath(base / text)
        return text

    return _map_strings(record, absolute)


def _map_strings(value: Any, change: Callable[[str], str]) -> Any:
    if isinstance(value, str):
        return change(value)
    if isinstance(value, dict):
        return {key: _map_strings(item, change) for key, item in value.items()}
    if isinstance(value, list):
        return [_map_strings(item, change) for item in value]
    return value


@dataclass(frozen=True)
class ConfigHeader:
    """A checkpoint's config read without torch or transformers: ``ladder_config_kwargs``'s values, its shape and
    its layout, validated as ``LadderLlamaConfig`` validates them. For ``inspect`` and the command line's checks
    before heavy imports; a model is built from ``checkpoint.load_config``."""

    values: dict[str, Any]
    shape: Any  # shapes.ModelShape
    layout: Any  # layout.Layout


def read_config_header(path: Path | str) -> ConfigHeader:
    """``ConfigHeader`` of a checkpoint folder; not a checkpoint, an unsupported architecture or a layout its
    heads cannot hold is one line (as from ``load_config``)."""
    from types import SimpleNamespace

    from ..model.layout import Layout
    from .shapes import ModelShape

    values = ladder_config_kwargs(read_config_json(path))
    shape = ModelShape.from_config(values, Path(path).name)
    layout = Layout.from_config(SimpleNamespace(num_hidden_layers=shape.num_hidden_layers, **{
        key: values.get(key) for key in ("layer_modes", "spd_tp_size", "spd_head_order")}))
    layout.validate(shape.num_attention_heads, shape.num_key_value_heads, shape.intermediate_size)
    return ConfigHeader(values, shape, layout)


def read_config_file(config_file: Path | str) -> dict[str, Any]:
    """A ``config.json`` file as a dict, or one line saying why it cannot be read."""
    config_file = Path(config_file).expanduser()
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError) as exc:
        raise LadderizeError(f"cannot read {config_file}: {exc}") from None
    if not isinstance(config, dict):
        raise LadderizeError(f"cannot read {config_file}: not a JSON object")
    return config


def synthetic_config(shape: str) -> tuple[dict[str, Any], str]:
    """``bench --synthetic SHAPE``: a preset (``synthetic_presets``) or a config.json (or a folder holding one), as a
    config dict and its name; one line when it is neither (no torch: the command line asks before it loads)."""
    from .shapes import synthetic_presets

    presets = synthetic_presets()
    if shape in presets:
        return dict(presets[shape]), shape
    path = Path(shape)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise LadderizeError(f"--synthetic {shape!r} is neither a preset ({', '.join(presets)}) nor a config.json")
    return read_config_file(path), str(path)


def architecture_for(config: dict[str, Any]) -> Architecture:
    """Return the supported architecture of a source config dict, or raise a one-line error."""
    model_type = config.get("model_type")
    arch = ARCHITECTURES.get(model_type or "")
    if arch is None:
        names = ", ".join(f"{a.name} ({a.model_type})" for a in ARCHITECTURES.values()
                          if a.model_type not in ("ladder_llama", "llamaLadder"))
        names += ", and the Ladder authors' hybrid checkpoints (model_type 'llamaLadder')"
        declared = ",".join(config.get("architectures") or []) or model_type or "unknown"
        raise LadderizeError(
            f"unsupported architecture {declared!r} (model_type {model_type!r}); ladderize reads {names}"
        )
    _check_no_sliding_window(config)
    return arch


def _check_no_sliding_window(config: dict[str, Any]) -> None:
    # Mistral/Qwen2 with an active sliding window attend differently from Llama: refuse rather than be wrong.
    if config.get("model_type") == "qwen2" and not config.get("use_sliding_window", False):
        return
    window = config.get("sliding_window")
    if window is not None and window < config.get("max_position_embeddings", 0):
        raise LadderizeError(
            f"{config.get('model_type')} with sliding_window={window} is not supported (ladderize models use full attention)"
        )


def _flag(config: dict[str, Any], key: str | None) -> bool:
    return key == "__always__" or bool(key and config.get(key, False))


def ladder_config_kwargs(config: dict[str, Any]) -> dict[str, Any]:
    """Keyword arguments for ``LadderLlamaConfig`` that reproduce the source model exactly."""
    arch = architecture_for(config)
    kwargs = {key: config[key] for key in SHARED_CONFIG_KEYS if key in config}
    if "dtype" not in kwargs and config.get("torch_dtype"):  # transformers 4.x name
        kwargs["dtype"] = config["torch_dtype"]
    if "rope_parameters" not in kwargs and "rope_theta" in config:  # transformers 4.x configs
        scaling = dict(config.get("rope_scaling") or {"rope_type": "default"})
        scaling.setdefault("rope_type", scaling.pop("type", "default"))
        kwargs["rope_parameters"] = {**scaling, "rope_theta": config["rope_theta"]}
    kwargs["attention_bias"] = _flag(config, arch.qkv_bias_key)
    kwargs["attention_out_bias"] = _flag(config, arch.o_bias_key)
    kwargs["mlp_bias"] = _flag(config, arch.mlp_bias_key)
    for key in ("layer_modes", "spd_tp_size", "spd_head_order"):
        if key in config:
            kwargs[key] = config[key]
    authors = authors_layer_modes(config)
    if authors is not None:
        kwargs["layer_modes"] = authors
    return kwargs


def expected_tensors(config_kwargs: dict[str, Any]) -> list[str]:
    """Every tensor name a checkpoint of this shape must contain, in a stable order."""
    templates = list(LAYER_TENSORS)
    if config_kwargs.get("attention_bias"):
        templates += QKV_BIAS_TENSORS
    if config_kwargs.get("attention_out_bias"):
        templates += O_BIAS_TENSORS
    if config_kwargs.get("mlp_bias"):
        templates += MLP_BIAS_TENSORS
    names = list(GLOBAL_TENSORS)
    for layer in range(int(config_kwargs["num_hidden_layers"])):
        names += [Template(t).substitute(layer=layer) for t in templates]
    if not config_kwargs.get("tie_word_embeddings", False):
        names.append(LM_HEAD)
    return names


def is_ignored_tensor(name: str) -> bool:
    return name.endswith(IGNORED_SUFFIXES)
