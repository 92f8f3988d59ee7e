"""``--compile`` compiles the whole decode step (prefill stays eager): in float32 its logits and greedy tokens equal
eager's; each (batch, cache length, plan) is traced once and reused (a shape that comes back, with a new decoder and a
new but equal plan object, retraces nothing); the recompile limit is raised above torch's default of 8.

Kept small for CI (a 2-layer ladder + SPD model, two batch sizes: CPU inductor compiles take a while); the CUDA
variants (graphs + compile, every layout against the HF model) are in tests/gpu/test_runtime_gpu.py."""

from __future__ import annotations

import torch

from ladderize.checkpoint.io import load_config
from ladderize.checkpoint.shapes import ModelShape
from ladderize.runtime.allreduce import Communicator
from ladderize.runtime.decode import COMPILED_SHAPES, Decoder
from ladderize.runtime.engine import RankModel
from ladderize.runtime.plan import build_plan
from ladderize.runtime.tp_slicing import SafetensorsSource
from ladderize.runtime.weights import load_rank_weights
from tests.runtime.runtime_helpers import save_tiny, shape_for

PROMPT, STEPS = 5, 4


def _decode(model: RankModel, layout, batch: int, compiled: bool) -> tuple[torch.Tensor, list[list[int]]]:
    """Prefill a fixed prompt, then STEPS greedy decode steps: (stacked decode logits, tokens)."""
    vocab = model.w.embed.shape[0]
    prompt = torch.randint(3, vocab, (batch, PROMPT), generator=torch.Generator().manual_seed(batch))
    decoder = Decoder(model, build_plan(layout, "native"), batch, PROMPT + STEPS + 1, compiled=compiled)
    with torch.inference_mode():
        logits = decoder.prefill(prompt)[:, -1]
        out, tokens = [], []
        for step in range(STEPS):
            token = logits.argmax(-1)
            tokens.append(token.tolist())
            logits = decoder.extend(token[:, None], PROMPT + step)[:, -1].clone()
            out.append(logits)
    return torch.stack(out), tokens


def test_compiled_decode_equals_eager_fp32_and_traces_each_shape_once(tmp_path):
    from torch._dynamo.utils import counters

    path = tmp_path / "ladder-spd"
    save_tiny(path, seed=5, **dict(shape_for(1), num_hidden_layers=2), layer_modes=["ladder", "spd"], spd_tp_size=1)
    config = load_config(path)
    weights = load_rank_weights(SafetensorsSource(str(path)), ModelShape.from_config(config), config.layout, 1, 0,
                                torch.float32, torch.device("cpu"))
    eager = RankModel(weights, config, Communicator(1), max_positions=16)
    compiled = RankModel(weights, config, Communicator(1), max_positions=16, compile_modules=True)
    for batch in (1, 3):
        expected, expected_tokens = _decode(eager, config.layout, batch, compiled=False)
        got, tokens = _decode(compiled, config.layout, batch, compiled=True)
        assert tokens == expected_tokens
        assert (got - expected).abs().max().item() < 1e-4, batch
        assert not torch.equal(got[0], got[-1])  # the steps really differ (positions, cache)
    graphs = counters["stats"]["unique_graphs"]
    assert graphs >= 2  # one per batch size at least
    for batch in (1, 3):  # the same shapes again: new decoders, new (equal) plans -> no new graph
        _decode(compiled, config.layout, batch, compiled=True)
    assert counters["stats"]["unique_graphs"] == graphs
    assert torch._dynamo.config.recompile_limit >= COMPILED_SHAPES
