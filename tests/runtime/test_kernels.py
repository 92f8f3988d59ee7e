"""Prepacked oneDNN linears give F.linear's products (bit-identical in bfloat16)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ladderize.runtime.kernels import can_prepack, linear_kernel, packed_linear, prepack


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 7])
def test_packed_linear_matches_f_linear(dtype, rows):
    if not can_prepack(torch.device("cpu"), dtype):
        pytest.skip(f"oneDNN cannot pack {dtype} on this CPU")
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(96, 64, generator=generator).to(dtype)
    bias = torch.randn(96, generator=generator).to(dtype)
    x = torch.randn(2, rows, 64, generator=generator).to(dtype)
    packed = prepack(weight)
    for b in (None, bias):
        got, expected = packed_linear(x, packed, b), F.linear(x, weight, b)
        assert got.shape == expected.shape and got.dtype == dtype
        if dtype == torch.bfloat16 and rows == 1:  # decode: the same oneDNN kernel, only the weight layout differs
            assert torch.equal(got, expected)
        else:
            assert torch.allclose(got.float(), expected.float(), atol=1e-4 if dtype == torch.float32 else 0.1, rtol=1e-2)


def test_linear_kernel_and_where_packing_applies():
    assert linear_kernel(False) is F.linear and linear_kernel(True) is packed_linear
    assert not can_prepack(torch.device("cpu"), torch.float16)
    assert not can_prepack(torch.device("meta"), torch.float32)
