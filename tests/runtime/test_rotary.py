"""The rank's rotary table: static decode (a position tensor) reads the same cos/sin as the eager path, for table
rope types and for the position-dependent ones that are recomputed per call (``dynamic``)."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig

from ladderize.runtime.kv_cache import RotaryTable

ROPES = {
    "default": {"rope_type": "default", "rope_theta": 10000.0},
    "llama3": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8},
    "dynamic": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0},
}


@pytest.mark.parametrize("rope", sorted(ROPES))
def test_static_decode_reads_the_same_cos_sin_as_eager(rope):
    config = LlamaConfig(hidden_size=64, num_attention_heads=4, head_dim=16, max_position_embeddings=16,
                         rope_parameters=ROPES[rope])
    table = RotaryTable(config, max_positions=40, device=torch.device("cpu"), dtype=torch.float32)
    assert table.dynamic == (rope == "dynamic")
    for position in (0, 5, 15, 16, 31, 39):  # below and beyond the trained 16 positions (dynamic rescales there)
        cos, sin = table.at_tensor(torch.tensor([position]))
        want_cos, want_sin = table.at(position, 1)
        assert cos.shape == want_cos.shape == (1, 16)
        assert torch.equal(cos, want_cos) and torch.equal(sin, want_sin), (rope, position)
