"""Llama's output contract, checked against transformers' LlamaForCausalLM on a model with no converted layers:
attention maps, tuples, hidden states, and what forward hooks on decoder layers see."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.distributed.tensor import Shard
from transformers import LlamaConfig, LlamaForCausalLM

from tests.conftest import TINY, tiny_model
from tests.model.helpers import DENSE, HYBRID, LADDER, LADDER_UPPER, max_diff, token_ids


def _twins(attn: str = "eager", **layout):
    """A tiny ladderize model and transformers' Llama with the same weights and attention implementation."""
    model = tiny_model(**(layout or DENSE))
    llama = LlamaForCausalLM(LlamaConfig(**TINY)).eval()
    llama.load_state_dict(model.state_dict(), strict=True)
    for m in (model, llama):
        m.set_attn_implementation(attn)
    return model, llama


def test_output_attentions_gives_one_map_per_layer_as_llama():
    model, llama = _twins()
    ids = token_ids(seq=9)
    with torch.no_grad():
        ours = model(ids, output_attentions=True, use_cache=False).attentions
        theirs = llama(ids, output_attentions=True, use_cache=False).attentions
    assert len(ours) == len(theirs) == model.config.num_hidden_layers
    assert all(a.shape == (2, 6, 9, 9) and max_diff(a, b) <= 1e-6 for a, b in zip(ours, theirs))


def test_output_attentions_on_every_mode_are_probabilities():
    model = tiny_model(**HYBRID)
    model.set_attn_implementation("eager")
    with torch.no_grad():
        maps = model(token_ids(seq=9), output_attentions=True, use_cache=False).attentions
    assert len(maps) == 4
    assert all(torch.allclose(m.sum(-1), torch.ones(2, 6, 9)) for m in maps)  # the SPD layer's too


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_return_dict_false_returns_llamas_tuple(attn):
    model, llama = _twins(attn)
    ids = token_ids(seq=9)
    kwargs = dict(labels=ids, output_hidden_states=True, return_dict=False)
    with torch.no_grad():
        ours, theirs = model(ids, **kwargs), llama(ids, **kwargs)
    assert type(ours) is tuple and type(theirs) is tuple and len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        if isinstance(a, torch.Tensor):
            assert max_diff(a, b) <= 1e-5
        elif isinstance(a, tuple):  # hidden states: embeddings, each layer, the last normed
            assert len(a) == len(b) and all(max_diff(x, y) <= 1e-5 for x, y in zip(a, b))
    with torch.no_grad():
        assert type(model.model(ids, return_dict=False)) is tuple


def test_decoder_layer_hooks_see_llamas_output_first():
    """A hook reads ``output[0]`` (the transformers 4 form): the state Llama's layer returns. A hook that
    replaces it changes the model as it changes Llama."""
    model, llama = _twins()
    ids = token_ids(seq=9)
    seen: dict[str, list[torch.Tensor]] = {"ours": [], "llama": []}
    shift = torch.linspace(-0.5, 0.5, TINY["hidden_size"])
    handles = [layer.register_forward_hook(lambda _m, _a, out: seen["ours"].append(out[0])) for layer in model.model.layers]
    handles += [layer.register_forward_hook(lambda _m, _a, out: seen["llama"].append(out)) for layer in llama.model.layers]
    with torch.no_grad():
        model(ids, use_cache=False), llama(ids, use_cache=False)
    assert len(seen["ours"]) == len(seen["llama"]) == 4
    assert all(max_diff(a, b) <= 1e-5 for a, b in zip(seen["ours"], seen["llama"]))
    for handle in handles:
        handle.remove()
    model.model.layers[1].register_forward_hook(lambda _m, _a, out: (out[0] + shift, *out[1:]))
    llama.model.layers[1].register_forward_hook(lambda _m, _a, out: out + shift)
    with torch.no_grad():
        assert max_diff(model(ids, use_cache=False).logits, llama(ids, use_cache=False).logits) <= 1e-5


def test_stale_state_travels_as_a_layer_output_for_reentrant_checkpointing():
    """Why a layer returns ``(residual, stale)``: a ladder layer reads the state before its input, and
    reentrant gradient checkpointing (transformers 4's default) keeps gradients only through outputs."""
    ids = token_ids(seq=9)
    grads = []
    for checkpointing in (False, True):
        model = tiny_model(**LADDER_UPPER).train()
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
        model(ids, labels=ids, use_cache=False).loss.backward()
        grads.append([p.grad for p in model.parameters()])
    assert all(b is not None and max_diff(a, b) <= 1e-6 for a, b in zip(*grads))


def test_parallel_plans_are_llamas():
    """transformers' tensor and pipeline plans: Llama's, the tied head's entry included."""
    model = tiny_model(**HYBRID, tie_word_embeddings=True)
    llama = LlamaForCausalLM(LlamaConfig(**{**TINY, "tie_word_embeddings": True}))
    assert model.tp_plan == llama.tp_plan and "lm_head" in model.tp_plan
    assert model.pp_plan == llama.pp_plan


@pytest.mark.parametrize("layout", [DENSE, LADDER], ids=["dense", "ladder"])
def test_tied_weights_are_sharded_together(monkeypatch, layout):
    """Under tensor parallelism the tied head and embedding are split on the same dimension (the vocabulary):
    each weight's style from the model's plan, asked by transformers where it would place the weight.
    (transformers' ``ModelTesterMixin`` of the same name is not in its wheel: this is its contract, checked here.)"""
    from transformers.distributed import tensor_parallel

    placements: list = []

    def distribute_tensor(tensor, mesh, placement, **_):
        placements.append(tuple(placement))
        return tensor

    monkeypatch.setattr(tensor_parallel, "distribute_tensor", distribute_tensor)
    model = tiny_model(**layout, tie_word_embeddings=True)
    modules = dict(model.named_modules())
    assert model.all_tied_weights_keys == {"lm_head.weight": "model.embed_tokens.weight"}
    for target, source in model.all_tied_weights_keys.items():
        placed = {}
        for name in (target, source):
            module_name, _, param = name.rpartition(".")
            style = model.tp_plan.get(module_name)
            assert style is not None, f"{module_name} has no tensor-parallel plan"
            tensor_parallel.ALL_PARALLEL_STYLES[style].shard_param(copy.deepcopy(modules[module_name]), param, None)
            placed[name] = placements.pop()
        assert placed[target] == placed[source] == (Shard(0),), placed
