"""Generation with a static cache through a forward compiled whole (``fullgraph=True``) gives eager generation's
tokens on every layout: the model declares ``_can_compile_fullgraph``, as transformers' Llama, and that holds."""

from __future__ import annotations

import pytest
import torch

from ladderize.model import LadderLlamaForCausalLM
from ladderize.model.modeling_ladder_llama import LadderLlamaPreTrainedModel
from tests.conftest import tiny_model
from tests.model.helpers import ATOL, DENSE, LADDER_UPPER, left_padded, max_diff, token_ids

SPD_UPPER_TP3 = dict(layer_modes=["dense", "dense", "spd", "spd"], spd_tp_size=3)  # SPD at the TINY shape's TP
LAYOUTS = {"dense": DENSE, "ladder-upper": LADDER_UPPER, "spd-upper-tp3": SPD_UPPER_TP3}


def test_the_model_declares_it_compiles_whole():
    """transformers' generation tests skip their static-cache and compiled-forward checks without it."""
    assert LadderLlamaPreTrainedModel._can_compile_fullgraph is True
    assert LadderLlamaForCausalLM._can_compile_fullgraph is True


@pytest.mark.parametrize("layout", LAYOUTS.values(), ids=LAYOUTS.keys())
def test_static_cache_generation_through_a_compiled_forward_equals_eager(layout):
    """Greedy ``generate`` with ``cache_implementation="static"`` and ``model.forward`` compiled with
    ``fullgraph=True`` (any graph break raises) against eager generation with the dynamic cache: the same tokens
    and logits, on a batch whose second row is left-padded (the static cache's 4D mask over unused slots).
    ``aot_eager``: Dynamo's tracing, which ``fullgraph`` is about, without inductor's code generation (seconds a
    model on CPU). On CPU ``generate`` compiles nothing itself (``_valid_auto_compile_criteria``): the counter
    proves the compiled forward ran, one graph for the prefill and one reused by every decoding step."""
    import torch._dynamo as dynamo
    from torch._dynamo.testing import CompileCounterWithBackend
    from transformers import DynamicCache, StaticCache

    model = tiny_model(**layout)
    ids, mask = left_padded(token_ids(batch=2, seq=6, seed=3), pads=[0, 2])
    settings = dict(attention_mask=mask, max_new_tokens=4, min_new_tokens=4, do_sample=False,
                    return_dict_in_generate=True, output_logits=True)
    with torch.no_grad():
        eager = model.generate(ids, **settings)
        dynamo.reset()
        counter = CompileCounterWithBackend("aot_eager")
        model.forward = torch.compile(model.forward, fullgraph=True, backend=counter)
        try:
            compiled = model.generate(ids, cache_implementation="static", **settings)
        finally:
            dynamo.reset()
    assert type(eager.past_key_values) is DynamicCache and isinstance(compiled.past_key_values, StaticCache)
    assert counter.frame_count == 2, counter.frame_count
    assert compiled.sequences.shape == (2, ids.shape[1] + 4)
    assert torch.equal(compiled.sequences, eager.sequences)
    assert max(max_diff(a, b) for a, b in zip(eager.logits, compiled.logits, strict=True)) <= ATOL
