"""Run a ladderize model one decoder layer at a time: the residual-stream states that sensitivity, head grouping and
adaptation read.

``LadderLlamaModel.forward`` runs every layer; adaptation, sensitivity and head grouping need
the ``(residual, stale)`` pair that enters a given layer, to run a layer on someone else's
states, or to run a suffix of the layers. The layer keyword arguments come from
the model's own ``layer_kwargs``, so they are exactly what its forward hands to its layers.
"""

from __future__ import annotations

from typing import Any

import torch

from ..model import LadderLlamaForCausalLM

State = tuple[torch.Tensor, torch.Tensor]  # (residual r_{k-1}, stale r_{k-2}), each [B, S, D]


def embed(model: LadderLlamaForCausalLM, input_ids: torch.Tensor) -> tuple[State, dict[str, Any]]:
    """Token embeddings as the initial state ``(r_0, r_{-1} = r_0)`` and the layers' attention kwargs."""
    embeds = model.model.embed_tokens(input_ids)  # [B, S, D]
    attn_kwargs = model.model.layer_kwargs(embeds)
    return (embeds, embeds), attn_kwargs


def attention_kwargs(
    model: LadderLlamaForCausalLM, batch: int, seq_len: int, dtype: torch.dtype, device: torch.device | str | None = None
) -> dict[str, Any]:
    """The layers' attention kwargs for ``batch`` full sequences of ``seq_len`` tokens, without the embedding.

    They depend only on the shape and dtype of the embeddings (rotary tables, causal mask),
    so a model whose embedding is not loaded (``layer_source.StreamedLayers``) gets them too.
    They are computed where the model's rotary buffers are (the host, for a streamed model)
    and then moved to ``device`` (every tensor in them).
    """
    home = next(model.model.rotary_emb.buffers()).device
    kwargs = model.model.layer_kwargs(torch.zeros(batch, seq_len, model.config.hidden_size, dtype=dtype, device=home))
    if device is None:
        return kwargs
    from accelerate.utils import send_to_device

    return send_to_device(kwargs, torch.device(device))


def run_layers(
    model: LadderLlamaForCausalLM, state: State, attn_kwargs: dict[str, Any], start: int, stop: int
) -> State:
    """Apply layers ``start..stop-1`` of ``model`` to ``state``."""
    residual, stale = state
    for layer in model.model.layers[start:stop]:
        residual, stale = layer(residual, stale, **attn_kwargs)
    return residual, stale


def logits_from(model: LadderLlamaForCausalLM, residual: torch.Tensor) -> torch.Tensor:
    """Final norm and LM head over the complete residual stream: ``[B, S, V]``."""
    return model.lm_head(model.model.norm(residual))


def token_nll(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """Summed next-token negative log-likelihood of ``input_ids`` (predicting positions 1..S-1)."""
    return torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]).float(), input_ids[:, 1:].reshape(-1), reduction="sum"
    )
