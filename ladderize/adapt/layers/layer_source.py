"""Where a stage's weights come from: a model loaded whole, or one layer at a time from safetensors.

The sequential training (``sequential/sequential_run.py``) touches one decoder layer at a time, so it
asks a *layer source* for the layer it needs, uses it, and gives it back; the joint stages read the same sources
(the replicated run's shared prefix, the sharded run's reads of its rows and its write-out, the pace's timed layer),
and a finished layer's file is named by ``layer_file``:

- ``ResidentLayers`` wraps a model loaded whole (``load_model``); giving a layer back does
  nothing. Head grouping needs this: it permutes heads of both models at once.
- ``StreamedLayers`` builds the model without weights (``accelerate.init_empty_weights``:
  parameters on the meta device, buffers such as the rotary frequencies real) and fills one
  layer, or the embedding, from the checkpoint's safetensors while it is in use; giving it
  back returns its parameters to the meta device. Memory is that one module's weights.

Both hand out the same ``LadderDecoderLayer`` modules of the same model class and config,
cast to the same dtype, so the training computes the same numbers either way.

Both take a ``device``: the module in use is there (read straight onto it, or moved there from
the host copy of a resident model) and leaves it when given back, so the device holds one
layer (or the embedding) at a time, whatever the depth.

Reads open the safetensors file, read the module's tensors and close it again: safetensors
memory-maps the whole file, and pages read through a map stay resident (and count in the
process's RSS) until the map is closed.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from ...checkpoint.tensor_files import read_tensors, tensor_names, weight_files
from ...errors import LadderizeError
from ...model import LadderLlamaForCausalLM
from ...checkpoint.architectures import EMBED_TENSOR, layer_prefix

EMBEDDING = EMBED_TENSOR.removesuffix("weight")  # the embedding module's tensors: "model.embed_tokens."
M_MMAP_THRESHOLD = -3  # mallopt's parameter (malloc.h): blocks from this size on are mapped on their own
MAPPED_ALLOCATION_BYTES = 1 << 20  # a tensor of a MiB or more (a 512 x 512 fp32 matrix) is mapped on its own


def return_free_memory() -> None:
    """Hand the C allocator's free pages back to the OS (glibc's ``malloc_trim``; elsewhere nothing).

    glibc keeps freed blocks below its mmap threshold (dynamic, up to 32 MB) in its heaps, and
    many of a layer's tensors are that size (a 2048 x 2048 fp32 projection is 16 MB): without
    this, RSS grew from layer to layer although nothing was held (docs/adapt-measurements.md).
    """
    trim = _libc_function("malloc_trim")
    if trim is not None:
        trim(0)


def map_large_allocations(min_bytes: int = MAPPED_ALLOCATION_BYTES) -> None:
    """Have glibc give every allocation of ``min_bytes`` or more its own mapping, returned to the OS when it is freed
    (``mallopt(M_MMAP_THRESHOLD)``), for the rest of the process; elsewhere nothing.

    glibc's own threshold rises to the size of the mapped blocks freed (up to 32 MB), after which such blocks come
    from its heaps and stay there when freed, and blocks freed by another thread (gloo's) stay in that thread's
    heap. A sharded training step gathers every unit's weights, makes gradients and frees them again: with the
    default, a rank of a 1.1 GB model kept about 1 GB of freed blocks (docs/adapt-design.md).
    """
    mallopt = _libc_function("mallopt")
    if mallopt is not None:
        mallopt(M_MMAP_THRESHOLD, min_bytes)


@functools.cache
def _libc_function(name: str):
    """glibc's function ``name``, or None where the C library has none."""
    try:
        return getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError, TypeError):  # not glibc
        return None


def layer_file(folder: Path, index: int) -> Path:
    """Where finished layer ``index`` is written in ``folder`` (a sequential stage's state, the sharded write-out's
    layers)."""
    return folder / f"layer-{index:05d}.safetensors"


def layer_of(name: str) -> int:
    """``model.layers.12.mlp.up_proj.weight`` -> 12 (-1 for tensors outside the layers)."""
    parts = name.split(".")
    return int(parts[2]) if len(parts) > 2 and parts[1] == "layers" else -1


class ResidentLayers:
    """A model loaded whole: every layer is always in (host) memory; the layer in use is on ``device``."""

    def __init__(self, model: LadderLlamaForCausalLM, device: str | torch.device | None = None):
        self.model = model
        self.home = next(model.parameters()).device
        self.device = self.home if device is None else torch.device(device)
        self._state: dict[str, torch.Tensor] | None = None

    @contextlib.contextmanager
    def _moved(self, module: nn.Module) -> Iterator[nn.Module]:
        if self.device == self.home:
            yield module
            return
        module.to(self.device, non_blocking=self.device.type == "cuda")  # in place: the parameter objects stay
        try:
            yield module
        finally:
            module.to(self.home)  # synchronous: the host copy is complete when the layer is given back

    def layer(self, index: int) -> contextlib.AbstractContextManager[nn.Module]:
        return self._moved(self.model.model.layers[index])

    def embedding(self) -> contextlib.AbstractContextManager[nn.Module]:
        return self._moved(self.model.model.embed_tokens)

    def read(self, name: str) -> torch.Tensor:
        if self._state is None:
            self._state = self.model.state_dict()
        return self._state[name]

    def use_trained(self, index: int, file: Path) -> None:
        """Take layer ``index``'s weights from ``file`` (a finished layer of an interrupted run)."""
        tensors = read_tensors(_names_in(file))
        self.model.load_state_dict({k: v for k, v in tensors.items() if layer_of(k) == index}, strict=False)


class StreamedLayers:
    """A weightless model of the checkpoint at ``path``, whose modules are read from its safetensors while in use."""

    def __init__(self, path: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
        from accelerate import init_empty_weights

        from ...checkpoint.io import load_config

        self.path = Path(path)
        self.dtype = dtype
        self.device = torch.device(device)
        config = load_config(self.path)
        self.files = tensor_files(self.path)
        with init_empty_weights():  # parameters on the meta device, buffers (rotary frequencies) computed
            self.model = LadderLlamaForCausalLM(config).eval()
        self.model.requires_grad_(False)
        self.trained: dict[int, Path] = {}  # layers to read from a finished layer's file instead

    def _file(self, name: str) -> Path:
        if layer_of(name) in self.trained:
            return self.trained[layer_of(name)]
        if name not in self.files:
            raise LadderizeError(f"checkpoint {self.path} is missing tensor {name}")
        return self.files[name]

    @contextlib.contextmanager
    def _filled(self, module: nn.Module, prefix: str) -> Iterator[nn.Module]:
        fill_module(module, prefix, self._file, self.dtype, self.device)  # requires_grad stays the module's (False)
        try:
            yield module
        finally:
            module.to("meta")
            return_free_memory()

    def layer(self, index: int) -> contextlib.AbstractContextManager[nn.Module]:
        """Decoder layer ``index`` with its weights, for the duration of the ``with`` block."""
        return self._filled(self.model.model.layers[index], layer_prefix(index))

    def embedding(self) -> contextlib.AbstractContextManager[nn.Module]:
        return self._filled(self.model.model.embed_tokens, EMBEDDING)

    def read(self, name: str) -> torch.Tensor:
        return read_tensors({name: self._file(name)})[name]

    def use_trained(self, index: int, file: Path) -> None:
        self.trained[index] = Path(file)

    def iter_tensors(self, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        """Every tensor of the checkpoint in its file order, trained layers from their files, floating ones cast to
        ``dtype`` (default: the dtype the layers are read in).

        Read one layer (or one tensor outside the layers) at a time, so memory is one layer.
        """
        dtype = dtype or self.dtype
        groups: list[list[str]] = []
        for name in self.files:
            if groups and layer_of(name) >= 0 and layer_of(name) == layer_of(groups[-1][0]):
                groups[-1].append(name)
            else:
                groups.append([name])
        for names in groups:
            tensors = read_tensors({name: self._file(name) for name in names})
            for name in names:
                tensor = tensors.pop(name)
                yield name, tensor.to(dtype) if tensor.is_floating_point() else tensor
            return_free_memory()  # what the caller's writer has flushed meanwhile


def tensor_files(path: str | Path) -> dict[str, Path]:
    """``{tensor name: the safetensors file holding it}`` of a checkpoint folder (headers only)."""
    files = weight_files(path)
    if not files:
        raise LadderizeError(f"{path} has no .safetensors weights")
    found: dict[str, Path] = {}
    for file in files:
        found.update(_names_in(file))
    return found


def fill_module(module: nn.Module, prefix: str, file_of, dtype: torch.dtype, device: torch.device) -> None:
    """Give ``module`` its tensors (``prefix`` + its state-dict names, each read from ``file_of(name)``), floating
    ones in ``dtype``, on ``device``; its parameters' ``requires_grad`` stays as it was."""
    names = [prefix + key for key in module.state_dict()]
    tensors = read_tensors({name: file_of(name) for name in names})
    state = {name[len(prefix):]: tensor.to(device, dtype if tensor.is_floating_point() else tensor.dtype)
             for name, tensor in tensors.items()}
    del tensors
    module.load_state_dict(state, strict=True, assign=True)


def _names_in(file: Path) -> dict[str, Path]:
    return dict.fromkeys(tensor_names(file), Path(file))


def same_prefix(student: ResidentLayers | StreamedLayers, teacher: ResidentLayers | StreamedLayers, first: int) -> bool:
    """Whether the embedding and the layers below ``first`` hold identical tensors in both (read one at a time)."""
    names = [n for n in teacher.model.state_dict() if n.startswith(EMBEDDING) or 0 <= layer_of(n) < first]
    for name in names:
        mine, theirs = student.read(name), teacher.read(name)
        if mine.shape != theirs.shape or not torch.equal(mine, theirs.to(mine.dtype)):
            return False
    return True
