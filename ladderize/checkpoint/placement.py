"""Placement: the one rule for which device and dtype a command computes on.

Every command that computes takes ``--device`` and ``--dtype`` and resolves them here:

- device ``auto``: the Accelerator's device under ``accelerate launch`` (``LOCAL_RANK`` set),
  else ``cuda:$LOCAL_RANK`` (``cuda:0`` outside a launcher) when torch sees a CUDA device, else
  the CPU. ``cuda`` means the same CUDA device without the fallback; ``cuda:N`` names one.
  Asking for CUDA where torch sees none is one line of error (``LadderizeError``).
- dtype: ``float32``/``bfloat16``/``float16`` (or fp32, bf16, fp16, half); ``auto`` is the
  caller's default: the checkpoint's own dtype where a model is loaded (as lm-eval's
  ``dtype=auto``; ``eval_dtype``), bf16 on CUDA and fp32 on CPU for the runtime (``runtime_dtype``); for a
  model that computes outside the runtime (sample) the checkpoint's own dtype on CUDA and fp32
  on CPU (``inference_dtype``).
- training (``training_precision``): the weights stay fp32 (the master copy the optimizer
  updates); ``auto`` is bf16 autocast with TF32 matmuls on CUDA, bf16 autocast on a CPU whose cores
  multiply bf16 natively (AVX512-BF16 or AMX: ``cpu_bf16``), and plain fp32 on any other CPU;
  ``float32`` is plain fp32 everywhere (TF32 off: the numbers of the CPU run, within fp32
  rounding); ``bfloat16`` is bf16 autocast on either device; ``float16`` is fp16 autocast with
  loss scaling (joint and kd stages only: ``adapt/train/optimizer_step.py``).

- compiled graphs (``inductor_options``): on CUDA Inductor's deterministic mode, whose kernels are chosen by rule, not
  by timing them on a device something else may load; a CPU's defaults elsewhere.

Names are checked without importing torch (``check_device``), so a typo fails at once.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import LadderizeError

if TYPE_CHECKING:  # torch is imported only when a name is resolved
    import torch

ALIASES = {"fp32": "float32", "float": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}
NAMES = ("float32", "bfloat16", "float16")
DEVICE_PATTERN = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")
DEVICE_HELP = "auto (CUDA when torch sees one, else CPU), cpu, cuda or cuda:N."
DTYPE_HELP = "auto, float32, bfloat16 or float16 (fp32, bf16, fp16)."


def check_dtype(name: str | None) -> str | None:
    """The canonical dtype name of ``name`` (``None`` for auto); one line of error otherwise. No torch."""
    if name is None or str(name).lower() == "auto":
        return None
    key = ALIASES.get(str(name).lower(), str(name).lower())
    if key not in NAMES:
        raise LadderizeError(f"unknown dtype {name!r}; use auto, float32, bfloat16 or float16")
    return key


def parse_dtype(name: "str | torch.dtype | None", auto: "torch.dtype | None" = None) -> "torch.dtype | None":
    """A torch dtype from a name (see ``check_dtype``); ``auto``/``None`` give ``auto``; a dtype passes through."""
    if name is not None and not isinstance(name, str):
        return name
    key = check_dtype(name)
    if key is None:
        return auto
    import torch

    return getattr(torch, key)


def check_device(spec: str | None) -> str:
    """The device spec lower-cased (``auto`` for ``None``); one line of error for anything else. No torch."""
    text = "auto" if spec is None else str(spec).strip().lower()
    if not DEVICE_PATTERN.match(text):
        raise LadderizeError(f"unknown device {spec!r}; use auto, cpu, cuda or cuda:N")
    return text


@dataclass(frozen=True)
class LaunchRank:
    """This process's place among those a launcher (torchrun, accelerate launch) started: ``rank`` of ``world``,
    ``local_rank`` of ``local_world`` on its node; outside a launcher, rank 0 of 1 (``this_launch``). The one answer to
    "which process am I?" (``rank``, ``world``), "am I launched?" (``by_launcher``), "is the run split?" (``several``)
    and "do I speak for the run?" (``main``). A process group, started from the same environment, numbers its
    processes as this does."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    by_launcher: bool = False  # a launcher named this process's place (RANK and WORLD_SIZE): a group starts from them
    local_world: int = 1

    @property
    def several(self) -> bool:
        """Whether the run is split over several processes."""
        return self.world > 1

    @property
    def main(self) -> bool:
        """Whether this process is the main one (rank 0): it prints a command's plan and result, and writes."""
        return self.rank == 0


def this_launch() -> LaunchRank:
    """This process's ``LaunchRank``, from the launcher's environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
    ``LOCAL_WORLD_SIZE``; a launcher that names no local place: the local rank is the rank, the node holds them all)."""
    env = os.environ
    rank, world = int(env.get("RANK", "0") or 0), int(env.get("WORLD_SIZE", "1") or 1)
    return LaunchRank(rank, world, int(env.get("LOCAL_RANK", "") or rank), "RANK" in env and "WORLD_SIZE" in env,
                      int(env.get("LOCAL_WORLD_SIZE", "") or world))


def launch_mismatch(world: int | None = None) -> str | None:
    """One line when the launcher meant more (or other) processes than the run has (``world``: its process group's),
    else None.

    ``accelerate launch --num_processes 2`` without ``--multi_gpu`` (``--cpu``, or no GPU) takes Accelerate's
    simple launcher: one process, which gets ``MASTER_ADDR`` (set only when several were asked for) and no
    ``WORLD_SIZE``. A torchrun-style launch names its size in ``WORLD_SIZE``.
    """
    world = this_launch().world if world is None else world
    launched = os.environ.get("WORLD_SIZE")
    if launched and int(launched) != world:
        return f"warning: the launcher started {launched} processes (WORLD_SIZE) but the run has {world}"
    if not launched and world == 1 and "ACCELERATE_USE_CPU" in os.environ and "MASTER_ADDR" in os.environ:
        return ("warning: accelerate launch was asked for several processes but started one (its simple launcher: "
                "--cpu, or no --multi_gpu); this run trains in 1 process. For data parallel on CPU use "
                "'accelerate launch --multi_gpu --num_processes N' or 'torchrun --nproc_per_node N'")
    return None


def no_cuda_line(device: str) -> str:
    """The one line of a CUDA ``--device`` on a machine where none can be used."""
    return f"--device {device} was asked for, but torch sees no CUDA device; use --device cpu"


# what Accelerate's simple launcher writes into its one process's environment whatever the command asked
# (``accelerate.utils.launch.prepare_simple_launcher_cmd_env``): OMP_NUM_THREADS is its
# --num_cpu_threads_per_process, 1 unless given or set before; the KMP_* two go with --cpu (Intel's OpenMP)
SIMPLE_LAUNCHER_SET = ("OMP_NUM_THREADS", "KMP_AFFINITY", "KMP_BLOCKTIME")


def _parent_process() -> tuple[dict[str, str], list[str]] | None:
    """The environment this process's parent started with and its command line (Linux ``/proc``), or None."""
    try:
        parent = f"/proc/{os.getppid()}"
        with open(f"{parent}/environ", "rb") as handle:
            pairs = [item.split(b"=", 1) for item in handle.read().split(b"\0") if b"=" in item]
        with open(f"{parent}/cmdline", "rb") as handle:
            argv = [arg.decode(errors="replace") for arg in handle.read().split(b"\0") if arg]
    except OSError:
        return None
    return {key.decode(errors="replace"): value.decode(errors="replace") for key, value in pairs}, argv


def as_plain_process(parent: tuple[dict[str, str], list[str]] | None = None) -> list[str]:
    """Under ``accelerate launch``'s simple launcher (one process: ``--num_processes 1``, ``--cpu``, or several
    without ``--multi_gpu``), remove from this process's environment the thread settings the launcher wrote that
    the command did not ask for, so that the process computes as the same command without the launcher: Accelerate
    sets OMP_NUM_THREADS=1 (its --num_cpu_threads_per_process default), and a CPU's kernels sum in another order on
    one thread than on every core (a SmolLM2 sequential stage's weights differed by up to 2e-3). A variable the
    launching process had, or ``--num_cpu_threads_per_process`` given, stays. Returns the names removed; call it
    before torch is imported (torch reads OMP_NUM_THREADS once). ``parent``: (environment, command line) of the
    launching process, read from ``/proc`` where not given."""
    if "ACCELERATE_USE_CPU" not in os.environ or this_launch().by_launcher or "WORLD_SIZE" in os.environ:
        return []  # not Accelerate's simple launcher: torchrun-style launchers place several processes themselves
    parent = _parent_process() if parent is None else parent
    if parent is None:
        return []
    environ, argv = parent
    if not any("accelerate" in arg for arg in argv[:3]):  # `accelerate launch`, `python -m accelerate.commands.launch`
        return []
    given = any(arg.startswith("--num_cpu_threads_per_process") for arg in argv)
    removed = [name for name in SIMPLE_LAUNCHER_SET
               if name in os.environ and name not in environ and not (name == "OMP_NUM_THREADS" and given)]
    for name in removed:
        del os.environ[name]
    return removed


def resolve_device(spec: "str | torch.device | None" = "auto") -> "torch.device":
    """The torch device of ``spec`` by the rule in this module's docstring."""
    import torch

    if isinstance(spec, torch.device):
        text = str(spec)
    else:
        text = check_device(spec)
    cuda = torch.cuda.is_available()
    if text == "auto":
        text = "cuda" if cuda else "cpu"
    if text == "cpu":
        return torch.device("cpu")
    if text.startswith("cuda") and not cuda:
        raise LadderizeError(no_cuda_line(text))
    if text == "cuda":
        index = this_launch().local_rank
        index = index if index < torch.cuda.device_count() else 0
        return torch.device("cuda", index)
    device = torch.device(text)
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise LadderizeError(f"--device {text}: torch sees only {torch.cuda.device_count()} CUDA device(s)")
    return device


def eval_dtype(name: "str | torch.dtype | None") -> "torch.dtype | None":
    """The dtype a checkpoint is scored in (eval, and any command that scores a checkpoint as it is):
    ``auto`` is ``None``, the checkpoint's own dtype (``load_model`` reads it from config.json), as
    lm-eval's ``dtype=auto``; the model is loaded once in that dtype, never up-cast into a second copy."""
    return parse_dtype(name, auto=None)


def runtime_dtype(name: "str | torch.dtype | None", device: "str | torch.device") -> "torch.dtype":
    """The runtime's dtype: ``auto`` is bfloat16 on CUDA and float32 on CPU."""
    import torch

    device_type = device if isinstance(device, str) else device.type
    return parse_dtype(name, auto=torch.bfloat16 if device_type.startswith("cuda") else torch.float32)


def inference_dtype(name: "str | torch.dtype | None", device: "str | torch.device") -> "torch.dtype | None":
    """The dtype a loaded model computes in: ``auto`` is the checkpoint's own on CUDA (``None`` for ``load_model``), fp32 on CPU."""
    import torch

    device_type = device if isinstance(device, str) else device.type
    return parse_dtype(name, auto=None if device_type.startswith("cuda") else torch.float32)


@dataclass(frozen=True)
class TrainingPrecision:
    """How training computes: fp32 weights, optional autocast, optional TF32 matmuls (see ``training_precision``)."""

    autocast: "torch.dtype | None"  # the autocast dtype; None: plain fp32
    tf32: bool

    @property
    def mixed_precision(self) -> str:
        """This precision as ``--mixed-precision`` (and an Accelerate config) names it: ``no``, ``bf16`` or ``fp16``."""
        import torch

        return {None: "no", torch.bfloat16: "bf16", torch.float16: "fp16"}[self.autocast]

    @property
    def name(self) -> str:
        """For messages and records: ``float32``, ``float32+tf32``, ``bf16-autocast+tf32``, ..."""
        base = "float32" if self.autocast is None else f"{self.mixed_precision}-autocast"
        return base + ("+tf32" if self.tf32 else "")

    def context(self, device: "str | torch.device") -> contextlib.AbstractContextManager:
        """``torch.autocast`` on ``device``'s type with this dtype, or nothing."""
        if self.autocast is None:
            return contextlib.nullcontext()
        import torch

        device_type = device if isinstance(device, str) else device.type
        return torch.autocast(device_type.split(":")[0], dtype=self.autocast)

    def apply(self) -> None:
        """Set torch's TF32 switches for CUDA matmuls and convolutions (process-wide) to ``tf32``; a run that sets
        them is wrapped in ``tf32_restored()``, so that what runs after it (eval in the demo) computes as before."""
        import torch

        if torch.cuda.is_available():
            torch.backends.cuda.matmul.allow_tf32 = self.tf32
            torch.backends.cudnn.allow_tf32 = self.tf32


@contextlib.contextmanager
def tf32_restored() -> Iterator[None]:
    """Put torch's process-wide TF32 switches back as they were when the block ends (``TrainingPrecision.apply``)."""
    import torch

    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def training_precision(
    name: "str | None", device: "str | torch.device", mixed_precision: "str | None" = None
) -> TrainingPrecision:
    """Training precision by the rule in this module's docstring. An explicit ``mixed_precision`` (``bf16``/``fp16``,
    ``--mixed-precision`` or an Accelerate config's) asks for that autocast too; fp16 needs loss scaling, so only the
    joint/kd stages take it (the sequential stage refuses it)."""
    import torch

    key = check_dtype(name)
    mixed = (mixed_precision or "no").lower()
    device_type = (device if isinstance(device, str) else device.type).split(":")[0]
    cuda = device_type == "cuda"
    if key == "float16" or mixed == "fp16":
        return TrainingPrecision(torch.float16, cuda)
    if key == "bfloat16" or mixed == "bf16" or (key is None and (cuda or cpu_bf16())):
        return TrainingPrecision(torch.bfloat16, cuda)
    return TrainingPrecision(None, False)


def cpu_bf16() -> bool:
    """Whether this CPU multiplies bf16 natively (AVX512-BF16 or AMX tiles), so that oneDNN's bf16 matmuls run
    at about twice fp32's pace or more (a SmolLM2 layer's training step: 123 against 280 ms on one core)."""
    import torch

    probes = [getattr(torch.cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
    return any(probe is not None and probe() for probe in probes)


def dtype_name(dtype: "torch.dtype") -> str:
    """``torch.bfloat16`` -> ``"bfloat16"`` (for records and tables)."""
    return str(dtype).removeprefix("torch.")


def inductor_options(device: "torch.device | str") -> dict[str, bool]:
    """Inductor's settings for graphs compiled for ``device``: on CUDA its deterministic mode, which picks kernels by
    rule instead of timing them, so a run or its resume gets the same kernels on the same GPU and software
    (``adapt/plan/compile_policy.py`` refuses CUDA where Inductor has no such mode); elsewhere Inductor's defaults
    (a CPU's kernels are not timed)."""
    kind = device if isinstance(device, str) else device.type
    return {"deterministic": True} if kind.split(":")[0] == "cuda" else {}


__all__ = [
    "ALIASES",
    "DEVICE_HELP",
    "DTYPE_HELP",
    "NAMES",
    "check_device",
    "check_dtype",
    "cpu_bf16",
    "TrainingPrecision",
    "dtype_name",
    "inductor_options",
    "inference_dtype",
    "eval_dtype",
    "no_cuda_line",
    "LaunchRank",
    "this_launch",
    "as_plain_process",
    "parse_dtype",
    "resolve_device",
    "runtime_dtype",
    "tf32_restored",
    "training_precision",
]

