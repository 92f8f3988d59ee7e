"""torch.compile traces the HF model whole: one graph and no break on every layout, as transformers' Llama."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import tiny_model
from tests.model.helpers import DENSE, HYBRID, LADDER, SPD_TP3, max_diff, token_ids

LAYOUTS = {"dense": DENSE, "ladder": LADDER, "spd": SPD_TP3, "hybrid": HYBRID}


@pytest.mark.parametrize("layout", LAYOUTS.values(), ids=LAYOUTS.keys())
def test_forward_is_one_graph_without_breaks(layout):
    import torch._dynamo as dynamo

    model = tiny_model(**layout)
    dynamo.reset()
    for kwargs in (dict(use_cache=False), dict(use_cache=True)):
        explained = dynamo.explain(model)(token_ids(), **kwargs)
        assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons


def test_compiled_training_step_matches_eager_on_a_hybrid():
    """fullgraph=True raises at any break; the compiled loss and gradients equal eager's."""
    import torch._dynamo as dynamo

    ids = token_ids()
    grads = []
    for compiled in (False, True):
        model = tiny_model(**HYBRID).train()
        dynamo.reset()
        forward = torch.compile(model, backend="aot_eager", fullgraph=True) if compiled else model
        loss = forward(ids, labels=ids, use_cache=False).loss
        loss.backward()
        grads.append((loss.detach(), [p.grad for p in model.parameters()]))
    (eager_loss, eager_grads), (compiled_loss, compiled_grads) = grads
    assert max_diff(eager_loss, compiled_loss) <= 1e-6
    assert max(max_diff(a, b) for a, b in zip(eager_grads, compiled_grads)) <= 1e-6


def test_a_peft_adapted_hybrid_is_one_graph():
    """SPD blocks call peft's wrapped modules per head group; the forward still traces whole."""
    import peft
    import torch._dynamo as dynamo

    targets = ["q_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    adapted = peft.get_peft_model(tiny_model(**HYBRID), peft.LoraConfig(r=2, target_modules=targets, lora_dropout=0.1))
    dynamo.reset()
    explained = dynamo.explain(adapted)(input_ids=token_ids(), use_cache=False)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons

