"""Synthetic checkpoints (random weights, for benchmarks and tests) and their character-level tokenizer.

``write_synthetic_checkpoint`` writes a ``checkpoint.shapes.ModelShape`` (or a config dict) with random weights
through ``checkpoint.io.write_checkpoint``. A random Llama has no tokenizer of its own; ``ladderize adapt`` and
``eval`` need one to read text. ``char_tokenizer`` maps each character to one id: ``<pad>``=0, ``<s>``=1,
``</s>``=2, ``<unk>``=3, then newline and printable ASCII (100 ids), so any vocabulary of at least 100 fits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from .checkpoint.shapes import ModelShape
from .errors import LadderizeError


def char_tokenizer():
    """A character-level ``PreTrainedTokenizerFast`` (100 ids; see the module docstring)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, "\n": 4}
    for code in range(32, 127):
        vocab[chr(code)] = len(vocab)
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


def write_synthetic_checkpoint(
    out: Path | str,
    shape: ModelShape | Mapping[str, Any],
    *,
    seed: int = 0,
    dtype: Any = None,
    layer_modes: list[str] | None = None,
    spd_tp_size: int = 1,
    tokenizer: bool = True,
    force: bool = False,
    plain: bool | None = None,
) -> Path:
    """A random-weight checkpoint of ``shape`` at ``out`` (seed ``seed``), with a character tokenizer.

    Plain Llama (``model_type: llama``) when every layer is dense (unless ``plain=False``), a
    ``ladder_llama`` config otherwise; weights in ``model.safetensors`` (fp32 unless ``dtype``; shards with an index above
    ``checkpoint.DEFAULT_MAX_SHARD_BYTES``). Written by ``checkpoint.write_checkpoint`` (atomically);
    an existing ``out`` is replaced only with ``force``.
    """
    import torch

    from .checkpoint.io import model_tensors, plain_llama_config, write_checkpoint
    from .model.configuration_ladder_llama import LadderLlamaConfig
    from .model.modeling_ladder_llama import LadderLlamaForCausalLM

    out = Path(out).expanduser().absolute()
    if out.exists() and not force:
        raise LadderizeError(f"{out} already exists (pass force=True to replace it)")
    values = shape.config_dict() if isinstance(shape, ModelShape) else dict(shape)
    rope_theta = values.pop("rope_theta", None)
    if rope_theta is not None:
        values.setdefault("rope_parameters", {"rope_type": "default", "rope_theta": rope_theta})
    values.setdefault("pad_token_id", 0)
    values.setdefault("bos_token_id", 1)
    values.setdefault("eos_token_id", 2)
    dense = not layer_modes or all(mode == "dense" for mode in layer_modes)
    if plain and not dense:
        raise LadderizeError(f"a plain Llama checkpoint cannot hold the layer modes {layer_modes}")
    plain = dense if plain is None else plain
    config = LadderLlamaConfig(**values, layer_modes=layer_modes, spd_tp_size=spd_tp_size)
    torch.manual_seed(seed)
    model = LadderLlamaForCausalLM(config).eval()
    if dtype is not None:
        model = model.to(dtype)
    written = plain_llama_config(values) if plain else model.config  # all dense: the model's tensors are Llama's
    written.dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    return write_checkpoint(out, written, model_tensors(model), force=force, tokenizer=char_tokenizer() if tokenizer else None,
                            generation_config=model.generation_config)
