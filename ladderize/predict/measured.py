"""``MeasuredCompute``: one rank's modules timed on the local device, as the runtime runs them, with a cache.

It builds the module as the runtime runs it (a one-layer ``RankModel`` of the rank's
local shape, with the runtime's own kernels, norms, rotary and KV cache) on the local device and times
it (CUDA events over a CUDA-graph replay on a GPU, ``perf_counter`` on the CPU), median of repeats, cached in a JSON file
keyed by device and per-rank shape. A shape too big for the device's budget (a 70B layer on a laptop
CPU) is timed as a proxy: tokens (compute-bound shapes) or KV length and width (memory-bound ones)
are halved until it fits, and the proxy's time above the device's fixed per-module floor (the time
of the smallest such module) is scaled by the ratio of the two shapes' roofline times under this
device's own measured matmul FLOP/s and streaming bytes/s. Such entries say so in their ``source``.

Memory is bounded by what the build really allocates (``build_bytes``: the module's own weights only,
twice for the transient copies, its KV cache, rotary table and activations), never the whole rank:
a proxy stays within ``max_bytes`` and within half the memory this machine has available, and a
module whose smallest proxy still does not fit is refused in one line before anything is allocated.
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

from ..errors import LadderizeError
from ..checkpoint.atomic import write_file_atomic
from ..checkpoint.placement import resolve_device
from ..checkpoint.shapes import ModelShape
from ..paths import cache_path
from .work import ModuleKind, ModuleWork, roofline_s


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "CPU"


CACHE_FORMAT = 2  # 2: modules timed through the runtime's RankModel and kernels (1: plain matmuls)


def _cgroup_room() -> float | None:
    """Bytes this process's cgroup (v2, then v1) may still use, or ``None`` without a limit."""
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            limit_text = Path(limit_file).read_text().strip()
            if limit_text == "max" or int(limit_text) >= 2**60:
                return None
            return float(int(limit_text) - int(Path(usage_file).read_text().strip()))
        except (OSError, ValueError):
            continue
    return None


def available_memory_bytes(device: "object | None" = None) -> float:
    """Bytes that can still be allocated on ``device``: free GPU memory on CUDA; on the CPU the kernel's
    ``MemAvailable``, bounded by the cgroup's room and the address-space limit (``ulimit -v``)."""
    import resource

    import torch

    if device is not None and getattr(device, "type", "cpu") == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return float(free)
    room = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                room.append(float(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    cgroup = _cgroup_room()
    if cgroup is not None:
        room.append(cgroup)
    soft, _hard = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        try:
            mapped = float(Path("/proc/self/statm").read_text().split()[0]) * resource.getpagesize()
        except (OSError, ValueError, IndexError):
            mapped = 0.0
        room.append(float(soft) - mapped)
    return max(0.0, min(room)) if room else float("inf")


MAX_SPREAD = 1.5  # max/min of a module's repeated timings beyond which they are noise
RETRIES = 2


def spread(samples: list[float]) -> float:
    """max / min of repeated timings (1.0 for steady ones)."""
    return max(samples) / max(min(samples), 1e-12)


class MeasuredCompute:
    """Time modules on the local device (GPU if present, else CPU) and cache the medians.

    ``max_call_s`` and ``max_bytes`` bound what is timed directly (defaults: 0.25 s and 8 GiB on a GPU,
    0.1 s and 512 MiB on a CPU; never more than half the memory available when the instance is made);
    larger shapes are timed as scaled proxies (see module docstring). ``build_bytes`` is what timing a
    shape allocates; one that cannot fit in the available memory is refused before it is built.
    """

    def __init__(
        self,
        cache_dir: Path | str | None = None,
        device: str | None = None,
        repeats: int = 5,
        max_call_s: float | None = None,
        max_bytes: float | None = None,
    ):
        import torch

        self.torch = torch
        self.timed_here = True
        self.unsteady = 0  # timings whose repeats still spread over MAX_SPREAD after RETRIES
        self.device = resolve_device(device)
        self.is_gpu = self.device.type == "cuda"
        self.dtype = torch.bfloat16 if self.is_gpu else torch.float32
        dtype_name = str(self.dtype).removeprefix("torch.")
        self.memory_bytes = 0.0
        self.one_wave_gemms = False  # its modules are timed alone: no overlap wave is known
        if self.is_gpu:
            self.device_name = torch.cuda.get_device_name(self.device)
            self.memory_bytes = float(torch.cuda.get_device_properties(self.device).total_memory)
            self.label = f"measured on {self.device_name} (CUDA graphs, {dtype_name})"
        else:
            self.device_name = f"CPU {_cpu_name()} ({torch.get_num_threads()} threads)"
            self.label = f"measured on {self.device_name}, {dtype_name}; a CPU, not a GPU"
        self.dtype_bytes = torch.finfo(self.dtype).bits // 8
        self.repeats = max(1, repeats)
        self.max_call_s = max_call_s if max_call_s is not None else (0.25 if self.is_gpu else 0.1)
        self.max_bytes = max_bytes if max_bytes is not None else (8 * 2**30 if self.is_gpu else 512 * 2**20)
        self.max_bytes = min(self.max_bytes, 0.5 * available_memory_bytes(self.device))
        self.cache_path = Path(cache_dir or cache_path("predict")).expanduser() / "measurements.json"
        self._device_key = f"{self.device_name}|{dtype_name}|torch {torch.__version__}"
        self._cache = self._load_cache()
        self._sources: dict[str, str] = {}
        self.measured_count = 0  # modules timed by this instance (cache hits excluded)

    # ---- cache -----------------------------------------------------------------------------------

    def _load_cache(self) -> dict:
        try:
            data = json.loads(self.cache_path.read_text())
            if isinstance(data, dict) and data.get("format") == CACHE_FORMAT:
                return data
        except (OSError, json.JSONDecodeError):
            pass
        return {"format": CACHE_FORMAT, "entries": {}, "rates": {}}

    def _save_cache(self) -> None:
        """Merge with what other processes wrote meanwhile, then replace the file atomically."""
        on_disk = self._load_cache()
        for section in ("entries", "rates"):
            on_disk[section].update(self._cache[section])
        self._cache = on_disk
        write_file_atomic(self.cache_path, json.dumps(on_disk, indent=1, sort_keys=True))

    # ---- device rates (for budgets and proxy scaling) --------------------------------------------

    def device_rates(self) -> tuple[float, float]:
        """This device's achieved matmul FLOP/s and streaming bytes/s, measured once and cached."""
        cached = self._cache["rates"].get(self._device_key)
        if cached:
            return float(cached[0]), float(cached[1])
        torch = self.torch
        n = 4096 if self.is_gpu else 512
        a = torch.full((n, n), 0.01, device=self.device, dtype=self.dtype)
        b = torch.full((n, n), 0.01, device=self.device, dtype=self.dtype)
        flops_per_s = 2.0 * n**3 / self._time(lambda: a @ b)
        rows = 16384 if self.is_gpu else 4096
        w = torch.full((rows, rows), 0.01, device=self.device, dtype=self.dtype)
        x = torch.full((1, rows), 0.01, device=self.device, dtype=self.dtype)
        bytes_per_s = w.numel() * self.dtype_bytes / self._time(lambda: x @ w)
        del a, b, w, x
        self._cache["rates"][self._device_key] = [flops_per_s, bytes_per_s]
        self._save_cache()
        return flops_per_s, bytes_per_s

    def _estimate_s(self, work: ModuleWork) -> float:
        flops_per_s, bytes_per_s = self.device_rates()
        return roofline_s(self._local(work), flops_per_s, bytes_per_s)

    def _local(self, work: ModuleWork) -> ModuleWork:
        return replace(work, dtype_bytes=self.dtype_bytes)

    @staticmethod
    def _positions(work: ModuleWork) -> int:
        return max(work.kv_len, work.q_len) + 1

    @staticmethod
    def build_shape(work: ModuleWork) -> ModelShape:
        """The one-layer shape ``_build`` allocates for ``work``: the module's own weights at full size, the
        others' at their smallest (an attention module gets no real MLP or vocabulary, and so on)."""
        attention, mlp, head = work.kind == "attention", work.kind == "mlp", work.kind == "head"
        return ModelShape(
            "module", hidden_size=work.hidden_size, intermediate_size=max(1, work.intermediate_size) if mlp else 1,
            num_hidden_layers=1, num_attention_heads=max(1, work.heads) if attention else 1,
            num_key_value_heads=max(1, work.kv_heads) if attention else 1, head_dim=work.head_dim,
            vocab_size=max(1, work.vocab_size) if head else 1, tie_word_embeddings=True,  # one vocabulary matrix
        )

    def build_bytes(self, work: ModuleWork) -> float:
        """Peak bytes that timing ``work`` allocates: the build shape's weights twice (random generation
        and kernel packing copy them), the KV cache and rotary table, activations and attention scores."""
        w = self._local(work)
        weights = self.build_shape(w).num_parameters
        positions = self._positions(w)
        kv = 2 * w.batch * positions * w.kv_heads * w.head_dim if w.kind == "attention" else 0
        rope = 2 * positions * w.head_dim
        widest = max(w.hidden_size, 2 * w.intermediate_size if w.kind == "mlp" else 0,
                     w.vocab_size if w.kind == "head" else 0,
                     (w.heads + 2 * w.kv_heads) * w.head_dim if w.kind == "attention" else 0)
        scores = 2 * w.batch * w.heads * w.q_len * positions if w.kind == "attention" else 0
        return float(w.dtype_bytes * (2 * weights + kv + rope + 4 * w.tokens * widest + scores))

    def _affordable(self, work: ModuleWork) -> bool:
        return self._estimate_s(work) <= self.max_call_s and self.build_bytes(work) <= self.max_bytes

    def check_fits(self, work: ModuleWork) -> None:
        """Refuse, in one line and before anything is allocated, a module this machine cannot hold."""
        needed, room = self.build_bytes(work), available_memory_bytes(self.device)
        if needed > 0.8 * room:
            where = "GPU" if self.is_gpu else "CPU"
            raise LadderizeError(
                f"timing one {work.kind} module (hidden {work.hidden_size}, batch {work.batch}, q_len {work.q_len}, "
                f"kv_len {work.kv_len}) needs about {needed / 2**30:.2f} GiB, but only {room / 2**30:.2f} GiB of "
                f"{where} memory is available; free memory or use --compute roofline"
            )

    def proxy_for(self, work: ModuleWork) -> ModuleWork:
        """The largest shape within budget, shrinking whatever makes it expensive.

        Compute-bound shapes lose tokens first (batch, then prompt), so the proxy stays compute-bound;
        memory-bound ones lose KV length when the cache dominates, else width (hidden, MLP, vocabulary),
        so the proxy keeps the real token count and stays memory-bound.
        """
        flops_per_s, bytes_per_s = self.device_rates()
        proxy = work
        for _ in range(64):
            if self._affordable(proxy):
                break
            local = self._local(proxy)
            compute_bound = local.flops / flops_per_s >= local.bytes / bytes_per_s
            kv_params = 2 * proxy.batch * proxy.kv_len * proxy.kv_heads * proxy.head_dim if proxy.kind == "attention" else 0
            if compute_bound and proxy.batch > 1:
                proxy = replace(proxy, batch=proxy.batch // 2)
            elif compute_bound and proxy.q_len > 64:
                q_len = proxy.q_len // 2
                proxy = replace(proxy, q_len=q_len, kv_len=max(q_len, proxy.kv_len - (proxy.q_len - q_len)))
            elif kv_params > proxy.weight_params and proxy.kv_len > max(256, proxy.q_len):
                proxy = replace(proxy, kv_len=max(proxy.q_len, proxy.kv_len // 2))
            elif kv_params > proxy.weight_params and proxy.batch > 1:
                proxy = replace(proxy, batch=proxy.batch // 2)
            elif proxy.hidden_size > 256:
                proxy = replace(
                    proxy,
                    hidden_size=proxy.hidden_size // 2,
                    intermediate_size=max(1, proxy.intermediate_size // 2),
                    vocab_size=max(1, proxy.vocab_size // 2),
                )
            elif proxy.batch > 1:
                proxy = replace(proxy, batch=proxy.batch // 2)
            elif proxy.q_len > 64:
                q_len = proxy.q_len // 2
                proxy = replace(proxy, q_len=q_len, kv_len=max(q_len, proxy.kv_len - (proxy.q_len - q_len)))
            else:
                break
        return proxy

    # ---- timing ----------------------------------------------------------------------------------

    def _time(self, fn: Callable[[], object]) -> float:
        with self.torch.inference_mode():
            return self._time_cuda(fn) if self.is_gpu else self._time_cpu(fn)

    def _time_cpu(self, fn: Callable[[], object]) -> float:
        """Median seconds of ``fn``; when the repeats spread over ``MAX_SPREAD`` (a loaded machine), the whole set is
        timed again (up to ``RETRIES`` times) and the steadiest set kept, with a warning if it is still unsteady."""
        fn()  # warm-up
        begin = time.perf_counter()
        fn()
        single = max(time.perf_counter() - begin, 1e-7)
        inner = max(1, min(50, int(2e-3 / single)))
        repeats = max(3, self.repeats if single < 0.05 else min(self.repeats, 3))  # slow CPU calls: fewer repeats
        best: list[float] = []
        for _ in range(1 + RETRIES):
            samples = []
            for _ in range(repeats):
                begin = time.perf_counter()
                for _ in range(inner):
                    fn()
                samples.append((time.perf_counter() - begin) / inner)
            if not best or spread(samples) < spread(best):
                best = samples
            if spread(best) <= MAX_SPREAD:
                break
        if spread(best) > MAX_SPREAD:
            self.unsteady += 1
        return statistics.median(best)

    @property
    def warnings(self) -> list[str]:
        """One line when timings were unsteady (the CLI prints it)."""
        if not self.unsteady:
            return []
        return [f"{self.unsteady} module timing(s) spread over {MAX_SPREAD}x (max/min of repeats) after {1 + RETRIES} "
                "tries: this machine is loaded and those times are noise"]

    def _time_cuda(self, fn: Callable[[], object]) -> float:
        """Median seconds of ``fn`` on ``self.device`` (made current: the graph and the events belong to it),
        replayed from a CUDA graph when it captures, else launched eagerly."""
        with self.torch.cuda.device(self.device):
            return self._time_cuda_here(fn)

    def _time_cuda_here(self, fn: Callable[[], object]) -> float:
        torch = self.torch
        side = torch.cuda.Stream(device=self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(3):  # warm-up (also what CUDA-graph capture requires)
                fn()
        torch.cuda.current_stream(self.device).wait_stream(side)
        run: Callable[[], object] = fn
        try:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                fn()
            run = graph.replay
        except RuntimeError:  # an op that cannot be captured: time eager launches instead
            torch.cuda.synchronize(self.device)
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(self.device)
        start.record()
        run()
        end.record()
        end.synchronize()
        single = max(start.elapsed_time(end) / 1e3, 1e-7)
        inner = max(1, min(200, int(2e-3 / single)))
        samples = []
        for _ in range(self.repeats):
            start.record()
            for _ in range(inner):
                run()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / 1e3 / inner)
        return statistics.median(samples)

    # ---- building one rank's module --------------------------------------------------------------

    def _build(self, work: ModuleWork) -> Callable[[], object]:
        """One rank's module as the runtime runs it: a one-layer ``RankModel`` of the rank's local shape
        (its heads, KV heads and MLP slice), with the runtime's kernels (gemv/oneDNN/aten, as ``auto``
        picks on this device), norms, rotary table and KV cache."""
        torch = self.torch
        from transformers import LlamaConfig

        from ..runtime.allreduce import Communicator
        from ..runtime.engine import RankModel
        from ..runtime.plan import StepKind
        from ..runtime.weights import random_rank_weights

        self.check_fits(work)
        b, s, d = work.batch, work.q_len, work.hidden_size
        positions = self._positions(work)
        dims = self.build_shape(work)  # only this module's weights are full size
        config = LlamaConfig(hidden_size=d, num_attention_heads=dims.num_heads, num_key_value_heads=dims.num_kv_heads,
                             head_dim=dims.head_dim, intermediate_size=dims.intermediate_size, num_hidden_layers=1,
                             vocab_size=dims.vocab_size, tie_word_embeddings=True, max_position_embeddings=positions)  # fmt: skip
        model = RankModel(random_rank_weights(dims, 1, 0, dtype=self.dtype, device=self.device), config,
                          Communicator(1), max_positions=positions)
        x = torch.full((b, s, d), 0.01, device=self.device, dtype=self.dtype)  # values do not change the timing
        if work.kind == "head":
            return lambda: model.logits(x)  # [B, 1, V]
        layer = model.w.layers[0]
        if work.kind == "mlp":
            return lambda: model.step_partial(StepKind.MLP, layer, x, None, None, 0)[0]  # [B, S, D] partial sum
        cache = model.new_cache(b, positions)
        start = max(0, work.kv_len - s)  # the new tokens follow kv_len - s cached ones
        return lambda: model.step_partial(StepKind.ATTENTION, layer, x, cache.keys[0], cache.values[0], start)[0]

    def _measure(self, work: ModuleWork) -> float:
        local = self._local(work)
        run = self._build(local)
        seconds = self._time(run)
        del run
        if self.is_gpu:
            self.torch.cuda.empty_cache()
        self.measured_count += 1
        return seconds

    # ---- public ----------------------------------------------------------------------------------

    def fixed_overhead_s(self, kind: ModuleKind) -> float:
        """Time of the smallest module of this kind: the launch/dispatch floor that does not scale."""
        key = f"{self._device_key}|overhead|{kind}"
        entry = self._cache["entries"].get(key)
        if entry is None:
            smallest = ModuleWork(kind, hidden_size=64, heads=1, kv_heads=1, head_dim=64, intermediate_size=64,
                                  vocab_size=64, batch=1, q_len=1, kv_len=16 if kind == "attention" else 0)
            entry = {"seconds": self._measure(smallest), "source": "measured"}
            self._cache["entries"][key] = entry
            self._save_cache()
        return float(entry["seconds"])

    def module_s(self, work: ModuleWork) -> float:
        key = f"{self._device_key}|{self._local(work).key()}"
        entry = self._cache["entries"].get(key)
        if entry is None:
            proxy = self.proxy_for(work)
            if proxy == work:
                entry = {"seconds": self._measure(work), "source": "measured"}
            else:
                # Scale only what grows with the shape: the proxy's time above the fixed floor.
                flops_per_s, bytes_per_s = self.device_rates()
                scale = roofline_s(self._local(work), flops_per_s, bytes_per_s) / roofline_s(
                    self._local(proxy), flops_per_s, bytes_per_s
                )
                floor = self.fixed_overhead_s(work.kind)
                measured = self._measure(proxy)
                seconds = floor + max(0.0, measured - floor) * scale
                changes = [
                    f"{name} {getattr(proxy, name)}"
                    for name in ("batch", "q_len", "kv_len", "hidden_size")
                    if getattr(proxy, name) != getattr(work, name)
                ]
                entry = {"seconds": seconds, "source": f"measured proxy ({', '.join(changes)}) x{scale:.3g}"}
            self._cache["entries"][key] = entry
            self._save_cache()
        self._sources[work.key()] = entry["source"]
        return float(entry["seconds"])

    def source(self, work: ModuleWork) -> str:
        return self._sources.get(work.key(), "measured")
