"""When an adapt run compiles its decoder layers (``compilation.py`` compiles them), decided without compiling.

The setting (``ParallelismSettings.compile``): ``True`` compiles and refuses a machine where it cannot (CUDA without
Triton, a CPU without a C++ compiler; checked by compiling a small function once per process); ``False`` runs eager;
``None`` (auto, the default) compiles on the device types where compiled adapt runs were measured against eager
(``AUTO_DEVICES``: the CPU; docs/adapt-design.md, "Compiled layers and kd loss") and where the backend runs, unless the
environment says ``LADDERIZE_COMPILE=0``; a wall ``--budget`` under ``AUTO_MIN_BUDGET_S`` runs eager (``eager_for_budget``,
applied by ``budget.size_recipe``). On CUDA it is ``--compile``'s to ask until the GPU check has measured it
(``tests/gpu/test_adapt_gpu.py`` runs a compiled stage there). The sharded path
(``sharded.py``) compiles each layer before FSDP2 shards it (tested against eager on a CPU).

On CUDA, Inductor by default times a reduction kernel's candidate block sizes on the device and keeps the fastest,
and the block sizes set the order of its sums: the same run gets other roundings when something else loads the GPU.
The GPU check saw it on an H100 (benchmarks/results/gpu_check/h100-2026-11-26/): a compiled sequential stage beside five
other test workers drifted from eager by 1.6e-4 of the loss in 16 steps, alone by 5.9e-6 (twice, the same digits).
So compiled graphs on CUDA use Inductor's deterministic mode (``inductor_options``): kernels chosen by rule, never by
timing, and a run or its resume gets the same kernels on the same GPU and software.

No torch at import: the plan reads this policy (``eager_for_budget``) before any training module loads.
"""

from __future__ import annotations

import functools
import os
import shutil
from typing import TYPE_CHECKING

from ...checkpoint.placement import inductor_options
from ...errors import LadderizeError

if TYPE_CHECKING:
    import torch

ENV = "LADDERIZE_COMPILE"  # auto's answer when set: 1/on/true or 0/off/false
COMPILING = ("decoder layers compiled (torch.compile): the first steps of each layer kind and shape wait for the "
             "compiler; --no-compile runs eager")
ON, OFF = ("1", "on", "true", "yes"), ("0", "off", "false", "no")
AUTO_DEVICES = ("cpu",)  # where auto compiles: the device types a compiled run was measured on (module docstring)
# the shortest wall budget auto compiles for: 30 minutes, the one a compiled run was measured at against eager (6%
# less training for the same token passes, its compiler's waits included); on a cold cache the first kind of layer
# alone waits about a minute (60 s for ladder 15-29 in fp32), and a budget of a few minutes spends more on that than
# fused ops give back (--budget 10m: 34,816 token passes compiled on a cold cache against 59,392 eager; docs/adapt-measurements.md)
AUTO_MIN_BUDGET_S = 1800.0


def _cpu_compiler() -> str | None:
    names = [os.environ["CXX"]] if os.environ.get("CXX") else ["g++", "c++", "clang++"]
    return next((found for name in names if (found := shutil.which(name))), None)


@functools.lru_cache(maxsize=None)
def unavailable(device_type: str) -> str | None:
    """Why ``torch.compile`` cannot run on this device type here (None: it can; a small function compiled once)."""
    if device_type == "cuda":
        from torch.utils._triton import has_triton

        if not has_triton():
            return "Triton is not installed"
        import torch
        import torch._inductor.config as inductor

        if not hasattr(inductor, "deterministic"):  # inductor_options asks for it
            return f"Inductor in torch {torch.__version__} has no deterministic mode"
    elif device_type == "cpu":
        if _cpu_compiler() is None:
            return "no C++ compiler found (g++, c++, clang++ or $CXX)"
    else:
        return f"not measured on {device_type}"
    import torch

    try:
        probe = torch.compile(lambda x: torch.nn.functional.silu(x) * x + 1, dynamic=False, options=inductor_options(device_type))
        probe(torch.ones(8, device=device_type))
    except Exception as error:  # the backend's own message (a missing header, a broken toolchain)
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return f"torch.compile failed on a small function: {first}"
    return None


def resolve_compile(setting: bool | None, device: torch.device) -> bool:
    """Whether this run compiles its decoder layers (module docstring): ``setting`` True, False or None (auto)."""
    if setting is False:
        return False
    if setting is None:
        return _auto_may_compile(device) and unavailable(device.type) is None
    reason = unavailable(device.type)
    if reason is not None:
        raise LadderizeError(f"--compile: torch.compile cannot run on {device.type} here: {reason} (or run with --no-compile)")
    return True


def _auto_may_compile(device: torch.device) -> bool:
    """Whether auto considers compiling on ``device`` at all (``$LADDERIZE_COMPILE``, the device type), before
    asking the backend whether it runs (``unavailable``)."""
    told = os.environ.get(ENV, "").strip().lower()
    if told and told not in ON + OFF:
        raise LadderizeError(f"${ENV}={told!r}: use 1/on or 0/off")
    return not (told in OFF or device.type not in AUTO_DEVICES)


def eager_for_budget(setting: bool | None, seconds: float, device: torch.device) -> bool:
    """Whether auto (``setting`` None), which may compile on ``device``, runs a wall budget of ``seconds`` eager:
    under ``AUTO_MIN_BUDGET_S`` the compiler's waits cost more than they save. Decided without compiling anything
    (``unavailable``'s probe takes seconds): where the backend does not run, auto is eager anyway."""
    return setting is None and seconds < AUTO_MIN_BUDGET_S and _auto_may_compile(device)
