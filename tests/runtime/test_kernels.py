"""The linear kernels give F.linear's products: gemv.c (any row count up to 8, ragged widths, bias,
threads) and oneDNN's packed weights (bit-identical in bfloat16 decode)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ladderize.errors import LadderizeError
from ladderize.runtime import gemv
from ladderize.runtime.kernels import LinearKernel, gemv_linear, linear_fn, packed_linear, prepack, resolve_kernel

CPU = torch.device("cpu")


def _needs(kernel: LinearKernel, dtype: torch.dtype) -> None:
    try:
        resolve_kernel(kernel, CPU, dtype)
    except LadderizeError as exc:
        pytest.skip(str(exc))


def _operands(rows: int, out: int, width: int, dtype: torch.dtype):
    generator = torch.Generator().manual_seed(rows * 1000 + width)
    weight = torch.randn(out, width, generator=generator).to(dtype)
    bias = torch.randn(out, generator=generator).to(dtype)
    return torch.randn(1, rows, width, generator=generator).to(dtype), weight, bias


def _close(got: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> bool:
    # float32: another summation order; bfloat16: the same fp32 sums can round to neighbouring bf16 values
    tolerance = 1e-4 if dtype == torch.float32 else 2 ** -7 * expected.abs().max().item()
    return got.shape == expected.shape and got.dtype == dtype and bool((got.float() - expected.float()).abs().max() <= tolerance)


@pytest.mark.parametrize("isa", ["best", "avx2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 3, 8, 9])
@pytest.mark.parametrize("width", [64, 100, 577])
def test_gemv_matches_f_linear(dtype, rows, width, isa, monkeypatch):
    """Both builds (the CPU's best, and AVX2 + FMA forced), every tail length (577 = 36 x 16 + 1)."""
    if isa == "avx2":
        monkeypatch.setenv("LADDERIZE_GEMV_ISA", "avx2")
    _needs(LinearKernel.GEMV, dtype)
    assert gemv.isa(dtype) in (("avx2",) if isa == "avx2" else ("avx512", "avx2"))
    x, weight, bias = _operands(rows, 37, width, dtype)
    for b in (None, bias):
        expected = F.linear(x.float(), weight.float(), None if b is None else b.float())
        assert _close(gemv_linear(x, weight, b), expected, dtype)
    if rows > gemv.MAX_ROWS:  # longer inputs (prefill) go to F.linear itself; gemv itself refuses them
        assert torch.equal(gemv_linear(x, weight, bias), F.linear(x, weight, bias))
        with pytest.raises(ValueError, match="1 to 8 rows"):
            gemv.gemv(x, weight)


def test_gemv_threads_split_rows_without_changing_results():
    _needs(LinearKernel.GEMV, torch.float32)
    x, weight, _ = _operands(2, 1000, 96, torch.float32)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = gemv.gemv(x, weight)
        torch.set_num_threads(2)
        assert torch.equal(gemv.gemv(x, weight), one)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 7])
def test_packed_linear_matches_f_linear(dtype, rows):
    _needs(LinearKernel.ONEDNN, dtype)
    x, weight, bias = _operands(rows, 96, 64, dtype)
    packed = prepack(weight)
    for b in (None, bias):
        got, expected = packed_linear(x, packed, b), F.linear(x, weight, b)
        if dtype == torch.bfloat16 and rows == 1:  # decode: the same oneDNN kernel, only the weight layout differs
            assert torch.equal(got, expected)
        else:
            assert _close(got, expected.float(), dtype)


def test_kernel_choice():
    assert linear_fn(LinearKernel.ATEN) is F.linear and linear_fn(LinearKernel.ONEDNN) is packed_linear
    assert resolve_kernel("auto", torch.device("meta"), torch.float32) is LinearKernel.ATEN
    assert resolve_kernel("auto", CPU, torch.float16) in (LinearKernel.ATEN, LinearKernel.ONEDNN)
    if gemv.available(torch.float32):  # float32: gemv's AVX512 build, else MKL's sgemv (aten) is as fast
        expected = LinearKernel.GEMV if gemv.isa(torch.float32) == "avx512" else LinearKernel.ATEN
        assert resolve_kernel("auto", CPU, torch.float32) is expected
    if gemv.available(torch.bfloat16):
        assert resolve_kernel("auto", CPU, torch.bfloat16) is LinearKernel.GEMV
    with pytest.raises(LadderizeError, match="runs on CPU only"):
        resolve_kernel("gemv", torch.device("meta"), torch.float32)
    with pytest.raises(LadderizeError, match="unknown linear kernel 'fast'"):
        resolve_kernel("fast", CPU, torch.float32)


def test_gemv_build_failure_falls_back(monkeypatch, tmp_path):
    """No working compiler: gemv says why, and auto takes the next kernel."""
    monkeypatch.setenv("CC", "false")  # a "compiler" that always fails
    monkeypatch.setenv("LADDERIZE_HOME", str(tmp_path))  # nothing cached there
    gemv._library.cache_clear()
    try:
        assert not gemv.available(torch.float32)
        assert "building gemv.c failed" in gemv.unavailable_reason() or "lacks" in gemv.unavailable_reason()
        assert resolve_kernel("auto", CPU, torch.float32) is not LinearKernel.GEMV
        with pytest.raises(LadderizeError, match="gemv is unavailable"):
            resolve_kernel("gemv", CPU, torch.float32)
    finally:
        gemv._library.cache_clear()
