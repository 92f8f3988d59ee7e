"""Head grouping for SPD: choose which KV-head groups share a TP rank.

Under SPD, rank r's MLP shard sees only the attention output of rank r's heads, so heads
that attend alike waste the rank's view. Following the SPD paper, we compute every query
head's attention map on calibration data, describe each KV group (the query heads that share
a KV head stay together, GQA) by its heads' maps, and assign groups to ranks so that the
summed cosine similarity of groups on the same rank is smallest.

When a rank holds a single KV group (SmolLM2 at TP=3, Llama-70B at TP=8) every assignment
has the same similarity, yet the assignment still decides which MLP shard pairs with
which heads. Ties are therefore broken by the measured SPD block error: the relative squared
error of the block's output against the dense block on the calibration data, over every
candidate order (all K! orders when K! <= 720).

The result is a KV-head order per layer, stored in the config as ``spd_head_order`` (the
model and runtime form rank r from ``order[r*K/N:(r+1)*K/N]``). ``materialize_head_order``
instead permutes the q/k/v/o weights so the grouped heads become contiguous and the order
identity; both leave a dense layer's function unchanged.
"""

from __future__ import annotations

import itertools
import math

import torch

from ..model import LadderLlamaForCausalLM, LayerMode, Layout
from ..model.block import permute_attention
from ..model.layout import rank_query_heads
from .relayout import with_layout
from .residual_states import embed, run_layers

MAX_EXHAUSTIVE_ORDERS = 720


@torch.no_grad()
def attention_maps(model: LadderLlamaForCausalLM, layer: int, residual: torch.Tensor, attn_kwargs) -> torch.Tensor:
    """Mean causal attention probabilities of every query head of ``layer``: ``[H, S, S]``."""
    block = model.model.layers[layer]
    hidden = block.input_layernorm(residual)  # maps of the dense function: the layer reads r_{k-1}
    return block.self_attn.attention_maps(hidden, attn_kwargs["position_embeddings"]).mean(0)


def group_similarity(maps: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    """Cosine similarity of KV groups' flattened attention maps: ``[K, K]``."""
    groups = maps.reshape(num_kv_heads, -1)
    groups = groups / groups.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    return groups @ groups.T


def candidate_orders(num_kv_heads: int, tp: int, similarity: torch.Tensor) -> list[tuple[int, ...]]:
    """KV orders whose within-rank similarity is smallest (all of them tie when a rank holds one group)."""
    per_rank = num_kv_heads // tp
    if math.factorial(num_kv_heads) > MAX_EXHAUSTIVE_ORDERS:
        return [_greedy_order(num_kv_heads, tp, similarity)]
    scored = []
    for order in itertools.permutations(range(num_kv_heads)):
        cost = 0.0
        for rank in range(tp):
            members = order[rank * per_rank : (rank + 1) * per_rank]
            cost += sum(similarity[a, b].item() for a, b in itertools.combinations(members, 2))
        scored.append((round(cost, 6), order))
    best = min(cost for cost, _ in scored)
    return [order for cost, order in scored if cost == best]


def _greedy_order(num_kv_heads: int, tp: int, similarity: torch.Tensor) -> tuple[int, ...]:
    per_rank = num_kv_heads // tp
    ranks: list[list[int]] = [[] for _ in range(tp)]
    for head in range(num_kv_heads):  # place each group on the open rank it resembles least
        open_ranks = [r for r in range(tp) if len(ranks[r]) < per_rank]
        best = min(open_ranks, key=lambda r: sum(similarity[head, m].item() for m in ranks[r]))
        ranks[best].append(head)
    return tuple(h for members in ranks for h in members)


@torch.no_grad()
def group_heads(
    model: LadderLlamaForCausalLM, teacher: LadderLlamaForCausalLM, calibration: torch.Tensor, layers: list[int] | None = None
) -> dict[int, tuple[int, ...]]:
    """The KV-head order chosen for each SPD layer of ``model`` (or ``layers``), from dense states of ``teacher``."""
    layout = model.layout
    targets = layers if layers is not None else layout.head_split_layers
    config = model.config
    tp, kv = layout.spd_tp_size, config.num_key_value_heads
    if not targets or tp == 1:
        return {}
    state, attn_kwargs = embed(teacher, calibration.to(teacher.model.embed_tokens.weight.device))  # on the models' device
    chosen: dict[int, tuple[int, ...]] = {}
    for index in range(max(targets) + 1):
        if index in targets:
            maps = attention_maps(teacher, index, state[0], attn_kwargs)
            orders = candidate_orders(kv, tp, group_similarity(maps, kv))
            dense_out = run_layers(teacher, state, attn_kwargs, index, index + 1)[0]
            chosen[index] = min(orders, key=lambda o: _spd_block_error(model, index, o, state, dense_out, attn_kwargs))
        state = run_layers(teacher, state, attn_kwargs, index, index + 1)
    return chosen


def _spd_block_error(model, index, order, state, dense_out, attn_kwargs) -> float:
    layout = model.layout
    orders = list(layout.spd_head_order or [None] * layout.num_layers)
    orders[index] = tuple(order)
    # the layer in its own head-split mode (SPD's, or the first such mode of the table where the layer is not one),
    # every other layer dense
    own = layout.modes[index]
    mode = own if own.traits.needs_head_split else LayerMode.with_traits(needs_head_split=True)
    dense = LayerMode.with_traits(converted=False)
    single = [mode if i == index else dense for i in range(layout.num_layers)]
    probe = with_layout(model, Layout(tuple(single), layout.spd_tp_size, tuple(orders)))
    out = probe.model.layers[index](state[0], state[1], **attn_kwargs)[0]
    update = dense_out - state[0]
    return ((out - dense_out).pow(2).mean() / update.pow(2).mean().clamp_min(1e-12)).item()


def apply_head_orders(model: LadderLlamaForCausalLM, orders: dict[int, tuple[int, ...]]) -> LadderLlamaForCausalLM:
    """``model`` with ``orders`` recorded as the config's ``spd_head_order`` (weights shared)."""
    layout = model.layout
    merged = list(layout.spd_head_order or [None] * layout.num_layers)
    for index, order in orders.items():
        merged[index] = tuple(order)
    return with_layout(model, Layout(layout.modes, layout.spd_tp_size, tuple(merged)))


def group_heads_for_spd(model, teacher, calibration):
    """Choose and record head orders for every SPD layer; returns the new model and the orders."""
    orders = group_heads(model, teacher, calibration)
    return (apply_head_orders(model, orders) if orders else model), {k: list(v) for k, v in orders.items()}


@torch.no_grad()
def permute_heads(model: LadderLlamaForCausalLM, layer: int, kv_order: list[int]) -> None:
    """Permute layer ``layer``'s KV heads (and their query heads) to ``kv_order`` in place, q/k/v/o together.

    New KV head j is old KV head ``kv_order[j]``; the layer's dense function is unchanged.
    """
    config = model.config
    attn = model.model.layers[layer].self_attn
    q_heads = rank_query_heads(kv_order, config.num_attention_heads, config.num_key_value_heads)
    for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
        linear = getattr(attn, proj)
        for kind in ("weight", "bias"):
            tensor = getattr(linear, kind)
            if tensor is not None:
                tensor.copy_(permute_attention(f"{proj}.{kind}", tensor, kv_order, q_heads, attn.head_dim))


def materialize_head_order(model: LadderLlamaForCausalLM) -> LadderLlamaForCausalLM:
    """Permute the weights so every recorded ``spd_head_order`` becomes the identity; same function."""
    layout = model.layout
    if not layout.spd_head_order:
        return model
    for index, order in enumerate(layout.spd_head_order):
        if order is not None and list(order) != sorted(order):
            permute_heads(model, index, list(order))
    return with_layout(model, Layout(layout.modes, layout.spd_tp_size, None))
