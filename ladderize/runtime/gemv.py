"""Decode's matrix-vector products through ``gemv.c``, built once with the machine's C compiler.

Decoding one token reads every weight once, so its speed is the speed of streaming the
weights. ``gemv.c`` walks each ``[out, in]`` weight row after row (one memory stream) and
multiplies each loaded chunk with all (at most 8) input rows. On the 2-core EPYC this
streams SmolLM2-135M's bfloat16 weights at 17-21 GB/s on one core, where oneDNN's packed
linear reaches about 12 GB/s and ``F.linear`` about 8 GB/s.

Each kernel is built twice: for AVX512 (float32: AVX512F; bfloat16: AVX512-BF16) and for AVX2 +
FMA (any x86-64 of the last decade, e.g. the AVX2-only EPYC that CI runs on). ``isa(dtype)``
names the one this CPU runs: the AVX512 one where its flags are present, else AVX2;
``LADDERIZE_GEMV_ISA=avx2`` forces AVX2 (to test that path on an AVX512 machine).

The library is compiled on first use (a second or two) into ``$LADDERIZE_HOME/kernels``
(default ``~/.cache/ladderize/kernels``), keyed by a hash of the source and the compiler
command, and is called through ``ctypes``. It is unavailable, and callers fall back to
torch's kernels, when the platform is not Linux x86-64, the CPU lacks both AVX512 and AVX2 + FMA,
or no C compiler with OpenMP works; ``unavailable_reason()`` says why.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("gemv.c")
FLAGS = ("-O3", "-fopenmp", "-shared", "-fPIC")
# The instruction sets each kernel is built for, best first, and the CPU flags each needs.
ISA_FLAGS = {
    torch.float32: (("avx512", ("avx512f",)), ("avx2", ("avx2", "fma"))),
    torch.bfloat16: (("avx512", ("avx512f", "avx512bw", "avx512_bf16")), ("avx2", ("avx2", "fma"))),
}
ENTRY_POINTS = {(torch.float32, "avx512"): "ladderize_gemv_f32", (torch.bfloat16, "avx512"): "ladderize_gemv_bf16",
                (torch.float32, "avx2"): "ladderize_gemv_f32_avx2", (torch.bfloat16, "avx2"): "ladderize_gemv_bf16_avx2"}
MAX_ROWS = 8

_reason: str | None = None


def _cache_dir() -> Path:
    from ..paths import cache_path

    return cache_path("kernels")


@functools.lru_cache(maxsize=None)
def _cpu_flags() -> frozenset[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def find_compiler() -> str | None:
    """The C compiler to build ladderize's kernels with: ``$CC``, else ``cc`` or ``gcc`` on the PATH."""
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def compile_library(source: Path, flags: tuple[str, ...], compiler: str, libs: tuple[str, ...] = ()) -> Path:
    """Build ``source`` into a shared library unless one of this source and command is cached; return its path.

    Libraries live in ``$LADDERIZE_HOME/kernels`` (default ``~/.cache/ladderize/kernels``), named
    ``<source stem>-<hash of source and command>.so``. Raises ``subprocess.CalledProcessError``
    (with the compiler's stderr) when the build fails. Shared by ``gemv.c`` and ``shm.c``.
    """
    command = [compiler, *flags]
    key = hashlib.sha256(source.read_bytes() + " ".join([*command, *libs]).encode()).hexdigest()[:16]
    target = _cache_dir() / f"{source.stem}-{key}.so"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:  # build aside, then rename: ranks may race
        built = Path(tmp) / target.name
        subprocess.run([*command, "-o", str(built), str(source), *libs], check=True, capture_output=True, text=True)
        os.replace(built, target)
    return target


def _compile(compiler: str) -> Path:
    """Build ``gemv.c`` unless a library of this source and command is cached; return its path."""
    return compile_library(SOURCE, FLAGS, compiler)


@functools.lru_cache(maxsize=None)
def _library() -> ctypes.CDLL | None:
    global _reason
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        _reason = f"gemv.c targets Linux x86-64, not {platform.system()} {platform.machine()}"
        return None
    compiler = find_compiler()
    if compiler is None:
        _reason = "no C compiler found (set CC)"
        return None
    try:
        library = ctypes.CDLL(str(_compile(compiler)))
    except (OSError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", None) or str(exc)
        _reason = f"building gemv.c failed: {detail.strip().splitlines()[-1] if detail.strip() else exc}"
        return None
    pointer, size = ctypes.c_void_p, ctypes.c_int64
    for name in ENTRY_POINTS.values():
        getattr(library, name).argtypes = [pointer, pointer, pointer, pointer, size, size, size, ctypes.c_int]
        getattr(library, name).restype = None
    return library


def isa(dtype: torch.dtype) -> str | None:
    """The instruction set of the ``dtype`` kernel this CPU runs (``avx512`` or ``avx2``); None if neither."""
    forced = os.environ.get("LADDERIZE_GEMV_ISA")
    flags = _cpu_flags()
    for name, needed in ISA_FLAGS.get(dtype, ()):
        if (forced in (None, "", name)) and all(flag in flags for flag in needed):
            return name
    return None


def available(dtype: torch.dtype) -> bool:
    """Whether ``gemv`` can run ``dtype`` on this machine (builds the library on first call)."""
    global _reason
    if dtype not in ISA_FLAGS:
        _reason = f"gemv.c has no {dtype} kernel"
        return False
    if isa(dtype) is None:
        wanted = " or ".join("+".join(needed) for _name, needed in ISA_FLAGS[dtype])
        _reason = f"this CPU lacks {wanted}"
        return False
    return _library() is not None


@functools.lru_cache(maxsize=None)
def _entry_point(library: ctypes.CDLL, dtype: torch.dtype, _forced: str | None):
    """The library function of ``dtype`` for this CPU (looked up once per dtype and ``LADDERIZE_GEMV_ISA``)."""
    return getattr(library, ENTRY_POINTS[(dtype, isa(dtype))])


def unavailable_reason() -> str | None:
    """Why the last ``available`` call said no (None if it said yes)."""
    return _reason


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for CPU ``x`` [..., in] with at most ``MAX_ROWS`` rows.

    ``weight`` [out, in] and ``bias`` must be contiguous, of ``x``'s dtype, and ``available(dtype)``.
    """
    library = _library()
    out_features, in_features = weight.shape
    x = x.contiguous()
    rows = x.numel() // in_features
    y = torch.empty(*x.shape[:-1], out_features, dtype=x.dtype)
    if not 0 < rows <= MAX_ROWS or weight.dtype != x.dtype or not weight.is_contiguous():
        if rows == 0:
            return y
        raise ValueError(f"gemv takes 1 to {MAX_ROWS} rows and a contiguous weight of the input's dtype")
    kernel = _entry_point(library, x.dtype, os.environ.get("LADDERIZE_GEMV_ISA"))
    kernel(x.data_ptr(), weight.data_ptr(), None if bias is None else bias.data_ptr(), y.data_ptr(),
           rows, out_features, in_features, torch.get_num_threads())
    return y


__all__ = ["MAX_ROWS", "available", "compile_library", "find_compiler", "gemv", "isa", "unavailable_reason"]
