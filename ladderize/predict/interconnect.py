"""All-reduce cost model and documented interconnect profiles.

One all-reduce of ``nbytes`` over ``N`` ranks costs the cheaper of two NCCL protocols, as NCCL's own
tuner prices them (NVIDIA/nccl ``src/graph/tuning.cc``: a base latency, a per-hop latency per protocol,
and a per-protocol bandwidth):

    launch_s + min(steps(N) * latency_s       + volume / small_bus_bytes_per_s,    # LL: latency-bound
                   steps(N) * large_latency_s + volume / bus_bytes_per_s)          # Simple: bandwidth-bound
    volume = 2 (N - 1) / N * nbytes

so small messages are latency-bound and large ones reach the link's bus bandwidth, the shape of an
nccl-tests ``all_reduce_perf`` curve. A profile without ``large_latency_s`` has one protocol.

* ``steps``: 2 (N - 1) for a ring (reduce-scatter then all-gather, one hop each), 2 ceil(log2 N) for a
  tree (reduce up, broadcast down).
* bandwidths follow the nccl-tests "busbw" convention: the per-rank link rate a ring saturates, so the
  2 (N - 1) / N factor converts it to the time for the whole buffer.
* ``launch_s`` is the fixed cost of one collective call (kernel launch, synchronisation).

Overlap with interference: an all-reduce running beside a compute kernel slows it. While both run, compute
progresses at ``1 / (1 + slowdown)`` of its rate, with ``slowdown = overlap_slowdown_for(...)``:

* the SMs NCCL holds: one thread block per channel (``sms_per_channel``), ``nccl_channels`` channels, out of
  the GPU's ``gpu_sm_count``; a kernel that needs every SM (a compute-bound GEMM, and on an H100 a
  weight-streaming GEMV too, which needs nearly all SMs' load slots to reach HBM bandwidth) then runs on
  ``1 - share`` of them: ``overlap_slowdown = share / (1 - share)`` (``sm_share_slowdown``). NVLink copies
  and P2P-disabled copies are both SM-driven, through fewer channels with P2P off;
* plus, for memory-bound (decode) modules only, the HBM bandwidth the all-reduce itself uses:
  ``hbm_traffic * volume / allreduce_s / gpu_hbm_bytes_per_s`` (a ring step reads two chunks and writes
  one, so ``hbm_traffic`` is 3 on NVLink, and 2 is assumed with P2P off);
* plus, on a host-staged fabric (``host_staged_channel_slowdown`` > 0: P2P disabled, NCCL's SHM transport), for
  memory-bound modules, ``host_staged_channel_slowdown`` per channel the all-reduce runs on. How many channels NCCL
  runs a collective on grows with its size (``nccl_ring_channels``: NVIDIA/nccl ``src/enqueue.cc`` drops channels
  while ``nBytes < channels * threads * threadThreshold``), so a 16 KB all-reduce runs on 1 channel and a 256 KB one
  on 16. The per-channel cost is fitted on one P2P-disabled Ladder figure (docs/predict-model.md, "Host-staged
  channels").

A fabric can split the node into groups (``group_size``; the Ladder authors' P2P-disabled node is two groups of
4): a ring that crosses groups pays its own latency-protocol hop and bandwidth (``cross_latency_s``,
``cross_small_bus_bytes_per_s``), since its slowest hop sets every step.

The SM and HBM terms are not fitted to a speed-up: the channel counts are NCCL's own (the Ladder authors'
``enable.log`` / ``disable.log``), the SM counts the datasheets'. The host-staged per-channel cost is the one overlap
constant fitted to a speed-up (70B, TP4, batch 64, P2P disabled; that figure is then a fit point, not held out).

Every parameter carries its source in ``sources``; "fitted" parameters name the logs or published
figure that fixed them (``benchmarks/published_figures.py`` re-derives them, docs/predict-measurements.md tabulates
them).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, Mapping

from ..errors import LadderizeError

Algorithm = Literal["ring", "tree"]

# Fitted by fit_interconnects() of benchmarks/published_figures.py (tests/predict/test_published_figures.py re-runs it).
NVLINK_LAUNCH_S = 7.241e-6
NVLINK_LATENCY_S = 1.187e-6
NVLINK_SMALL_BUS_BYTES_PER_S = 242.6e9
NVLINK_LARGE_LATENCY_S = 5.716e-6
NVLINK_BUS_BYTES_PER_S = 433.4e9
# h100-no-p2p: the authors' P2P-disabled logs (dense minus upper bound per all-reduce, calibration.fit_no_p2p_allreduce)
NO_P2P_LATENCY_S = 3.049e-6  # per hop, latency protocol, inside a group of 4 (TP <= 4)
NO_P2P_SMALL_BUS_BYTES_PER_S = 20.85e9
NO_P2P_CROSS_LATENCY_S = 3.752e-6  # the same, for a ring that crosses the two groups (TP 8)
NO_P2P_CROSS_SMALL_BUS_BYTES_PER_S = 8.162e9
NO_P2P_LARGE_LATENCY_S = 7.548e-6  # bandwidth protocol
NO_P2P_BUS_BYTES_PER_S = 316.7e9
NO_P2P_GROUP_SIZE = 4  # disable.log: NCCL splits the 8 GPUs into two groups of 4
PCIE_LATENCY_S = 2.64e-6  # pcie-gen5: half the host-staged hop latency the paper's 1.60x no-P2P figure gives (5.27 us)
PCIE_BUS_BYTES_PER_S = 40e9

# h100-no-p2p: what a host-staged (SHM) channel costs a memory-bound module beside it, per channel running; fitted on the
# P2P-disabled Ladder log at 70B TP4 batch 64 (calibration.fit_host_staged_channel_slowdown, NO_P2P_OVERLAP_FIT)
NO_P2P_HOST_STAGED_CHANNEL_SLOWDOWN = 0.06543
# NCCL's channel tuning constants (NVIDIA/nccl src/include/device.h / src/graph/tuning.cc, 2.20; the authors'
# disable.log prints the ring thresholds "64/8/64" for LL/LL128/Simple at 8 ranks): a ring's LL threshold is 8 bytes
# per thread times the ranks, Simple's 64; both protocols run at most 512 threads per channel.
NCCL_LL_THREAD_THRESHOLD = 8
NCCL_SIMPLE_THREAD_THRESHOLD = 64
NCCL_MAX_THREADS_PER_CHANNEL = 512

NVLINK_CHANNELS = 24  # NCCL channels with NVLink, and 16 with P2P disabled: the authors' enable.log / disable.log
NO_P2P_CHANNELS = 16
H100_SM_COUNT = 132  # NVIDIA H100 SXM5: 132 SMs
IB_NDR_BUS_BYTES_PER_S = 50e9
H100_HBM_BYTES_PER_S = 3.35e12


def sm_share_slowdown(channels: int, sms_per_channel: int, gpu_sm_count: int) -> float:
    """How much slower a kernel that needs every SM runs while NCCL holds ``channels * sms_per_channel`` of them."""
    share = channels * sms_per_channel / gpu_sm_count
    if not 0 <= share < 1:
        raise LadderizeError(f"NCCL would hold {channels * sms_per_channel} of {gpu_sm_count} SMs: not a valid profile")
    return share / (1.0 - share)


def one_wave_slowdown(channels: int, sms_per_channel: int, gpu_sm_count: int) -> float:
    """How much slower a one-wave GEMM (a persistent grid of exactly ``gpu_sm_count`` CTAs, one per SM) runs while NCCL
    holds ``channels * sms_per_channel`` SMs: the CTAs that find no free SM run as a second wave, so the kernel takes
    ``ceil(sm_count / (sm_count - held))`` times as long (2x for any 0 < held < sm_count / 2)."""
    held = channels * sms_per_channel
    if not 0 <= held < gpu_sm_count:
        raise LadderizeError(f"NCCL would hold {held} of {gpu_sm_count} SMs: not a valid profile")
    return float(math.ceil(gpu_sm_count / (gpu_sm_count - held)) - 1)


def nccl_ring_channels(nbytes: float, ranks: int, channels: int, latency_protocol: bool) -> int:
    """The channels NCCL runs a ring all-reduce of ``nbytes`` on (NVIDIA/nccl ``src/enqueue.cc``, ring/tree channel
    tuning): starting from the communicator's ``channels``, one channel is dropped while ``nbytes < channels * threads *
    threadThreshold`` (then threads are halved at one channel). ``threadThreshold`` is 8 bytes per thread times the
    ranks for the LL (latency) protocol and 64 for Simple; 512 threads at most for both. A 16 KB all-reduce over 4 ranks
    (LL) runs on 1 channel, a 256 KB one on 16."""
    if channels <= 0 or ranks <= 1:
        return max(0, channels)
    threshold = NCCL_LL_THREAD_THRESHOLD * ranks if latency_protocol else NCCL_SIMPLE_THREAD_THRESHOLD
    used, threads = channels, NCCL_MAX_THREADS_PER_CHANNEL
    while nbytes < used * threads * threshold:
        if used >= 2:
            used -= 1
        elif threads % 128 == 0:
            threads //= 2
        else:
            break
    return used


OVERLAP_SLOWDOWN = sm_share_slowdown(NVLINK_CHANNELS, 1, H100_SM_COUNT)  # 24 / 108 = 0.222
NO_P2P_OVERLAP_SLOWDOWN = sm_share_slowdown(NO_P2P_CHANNELS, 1, H100_SM_COUNT)  # 16 / 116 = 0.138

_LADDER = "Ladder Residual (arXiv:2501.06589) and its authors' blog table, Llama-3.1-70B at TP8 on 8xH100"
_LOGS = "the Ladder authors' published logs, github.com/mayank31398/ladder-residual-inference final-results-512/"
_NCCL_TESTS = ("public nccl-tests all_reduce_perf figures (docs.alayanew.com tech-blog 2026-05-06 'NCCL-tests in "
               "practice'): 8xH100 SXM5 NVLink busbw 460-480 GB/s at large sizes, 8xH100 PCIe 35-45 GB/s")
_NCCL_TUNER = "NCCL's tuning model (NVIDIA/nccl src/graph/tuning.cc: per-protocol base and per-hop latencies)"
_NO_P2P_LOGS = ("github.com/mayank31398/ladder-residual-inference logs/arxiv/prompt_length_1024_max_new_512/p2p_disable1/"
                "compile/: gpt_dense:llama-3-70b against gpt_ensemble:llama-3-70b-upper-bound, NCCL_P2P_DISABLE=1")
_CHANNELS = ("the Ladder authors' NCCL logs (github.com/mayank31398/ladder-residual-inference enable.log: 24 channels "
             "on 8xH100 NVLink; disable.log, NCCL 2.20.5 with NCCL_P2P_LEVEL=LOC: 16); NCCL launches one thread block "
             "(one SM) per channel it uses (NVIDIA/nccl src/enqueue.cc: the grid is the plan's channel count)")
_DEFAULT_GPU = ("H100: the h100-gpt-fast fit (a compiled, CUDA-graph runtime: the one the published speed-ups were "
                "measured on); --gpu h100 prices ladderize's RankModel kernels in a CUDA graph without compile")
_SM_COUNT = "NVIDIA H100 Tensor Core GPU architecture whitepaper: H100 SXM5 has 132 SMs"


def ring_volume(nbytes: float, ranks: int) -> float:
    """Bytes each rank sends in a ring all-reduce of an ``nbytes`` buffer: ``2 (n - 1) / n`` of it (the factor that
    turns nccl-tests' algorithm bandwidth into its "busbw")."""
    return 2.0 * (ranks - 1) / ranks * nbytes


@dataclass(frozen=True)
class InterconnectProfile:
    """Latency/bandwidth parameters of one collective fabric, each with its source."""

    name: str
    description: str
    algorithm: Algorithm
    launch_s: float
    latency_s: float
    bus_bytes_per_s: float
    overlap_slowdown: float  # derived from nccl_channels when that is > 0; as given otherwise
    sources: Mapping[str, str] = field(default_factory=dict)
    large_latency_s: float | None = None  # per hop of the bandwidth protocol; None: one protocol only
    small_bus_bytes_per_s: float | None = None  # bandwidth of the latency protocol; None: bus_bytes_per_s
    hbm_traffic: float = 0.0  # HBM bytes the all-reduce moves per bus byte (memory-bound overlap)
    gpu_hbm_bytes_per_s: float = H100_HBM_BYTES_PER_S
    nccl_channels: int = 0  # channels NCCL runs on this fabric (0: unknown, overlap_slowdown as given)
    sms_per_channel: int = 1  # thread blocks (SMs) per channel
    gpu_sm_count: int = H100_SM_COUNT
    gpu: str | None = None  # the GPU profile (ladderize.predict.gpus) that prices this fabric's GPUs; None: not a GPU fabric
    group_size: int = 0  # ranks per group where the fabric splits the node (0: one group); a larger ring crosses groups
    cross_latency_s: float | None = None  # latency-protocol hop latency of a ring that crosses groups
    cross_small_bus_bytes_per_s: float | None = None  # latency-protocol bandwidth of such a ring
    host_staged_channel_slowdown: float = 0.0  # per running channel, memory-bound modules; > 0: host-staged (SHM) fabric

    def __post_init__(self) -> None:
        if self.algorithm not in ("ring", "tree"):
            raise LadderizeError(f"interconnect {self.name!r}: algorithm must be 'ring' or 'tree', got {self.algorithm!r}")
        if (self.launch_s < 0 or self.latency_s < 0 or self.overlap_slowdown < 0 or self.hbm_traffic < 0
                or self.host_staged_channel_slowdown < 0):
            raise LadderizeError(f"interconnect {self.name!r}: latencies, overlap_slowdown, hbm_traffic and "
                                 "host_staged_channel_slowdown must be >= 0")
        if self.large_latency_s is not None and self.large_latency_s < 0:
            raise LadderizeError(f"interconnect {self.name!r}: large_latency_s must be >= 0")
        if self.group_size < 0 or (self.cross_latency_s is not None and self.cross_latency_s < 0) or (
                self.cross_small_bus_bytes_per_s is not None and self.cross_small_bus_bytes_per_s <= 0):
            raise LadderizeError(f"interconnect {self.name!r}: group_size and cross_latency_s must be >= 0, "
                                 "cross_small_bus_bytes_per_s positive")
        if self.bus_bytes_per_s <= 0 or (self.small_bus_bytes_per_s is not None and self.small_bus_bytes_per_s <= 0):
            raise LadderizeError(f"interconnect {self.name!r}: bandwidths must be positive")
        if self.gpu_hbm_bytes_per_s <= 0:
            raise LadderizeError(f"interconnect {self.name!r}: gpu_hbm_bytes_per_s must be positive")
        if self.nccl_channels < 0 or self.sms_per_channel < 1 or self.gpu_sm_count < 1:
            raise LadderizeError(f"interconnect {self.name!r}: nccl_channels must be >= 0, sms_per_channel and "
                                 "gpu_sm_count >= 1")
        if self.nccl_channels > 0:  # the SM share decides; overlap_slowdown records the value used
            object.__setattr__(self, "overlap_slowdown",
                               sm_share_slowdown(self.nccl_channels, self.sms_per_channel, self.gpu_sm_count))

    @property
    def sm_slowdown(self) -> float:
        """How much the SMs NCCL holds slow an overlapped kernel (``overlap_slowdown``)."""
        return self.overlap_slowdown

    def steps(self, ranks: int) -> int:
        """Sequential hops of one all-reduce over ``ranks`` ranks."""
        if ranks <= 1:
            return 0
        if self.algorithm == "ring":
            return 2 * (ranks - 1)
        return 2 * math.ceil(math.log2(ranks))

    def _protocol_s(self, nbytes: float, ranks: int) -> tuple[float, float | None]:
        """The latency protocol's and the bandwidth protocol's time (None: one protocol), without ``launch_s``."""
        volume = ring_volume(nbytes, ranks)
        steps = self.steps(ranks)
        latency, small_bus = self.latency_s, self.small_bus_bytes_per_s or self.bus_bytes_per_s
        if self.group_size and ranks > self.group_size:  # the ring crosses groups: its slowest hop sets each step
            latency = self.cross_latency_s if self.cross_latency_s is not None else latency
            small_bus = self.cross_small_bus_bytes_per_s or small_bus
        small = steps * latency + volume / small_bus
        if self.large_latency_s is None:
            return small, None
        return small, steps * self.large_latency_s + volume / self.bus_bytes_per_s

    def allreduce_s(self, nbytes: float, ranks: int) -> float:
        """Seconds for one all-reduce of ``nbytes`` (the full buffer each rank holds) over ``ranks`` ranks."""
        if ranks <= 1 or nbytes <= 0:
            return 0.0
        small, large = self._protocol_s(nbytes, ranks)
        return self.launch_s + (small if large is None else min(small, large))

    def channels_for(self, nbytes: float, ranks: int) -> int:
        """The channels one all-reduce of ``nbytes`` runs on (``nccl_ring_channels``, with the protocol the cost model
        picks): 0 where the profile has no channel count."""
        if ranks <= 1 or nbytes <= 0 or self.nccl_channels <= 0:
            return 0
        small, large = self._protocol_s(nbytes, ranks)
        return nccl_ring_channels(nbytes, ranks, self.nccl_channels, latency_protocol=large is None or small <= large)

    def bus_rate(self, nbytes: float, ranks: int) -> float:
        """The achieved bus bandwidth (nccl-tests "busbw") of one all-reduce of ``nbytes``."""
        seconds = self.allreduce_s(nbytes, ranks)
        return 0.0 if seconds <= 0 else ring_volume(nbytes, ranks) / seconds

    @property
    def wave_slowdown(self) -> float:
        """How much the SMs NCCL holds slow a one-wave (persistent-grid) GEMM: a second wave (``one_wave_slowdown``);
        the SM share where the channel count is unknown."""
        if self.nccl_channels <= 0:
            return self.sm_slowdown
        return max(self.sm_slowdown, one_wave_slowdown(self.nccl_channels, self.sms_per_channel, self.gpu_sm_count))

    def overlap_slowdown_for(self, nbytes: float, ranks: int, memory_bound: bool, one_wave_gemms: bool = False) -> float:
        """How much an all-reduce of ``nbytes`` slows a module it overlaps: SMs always, HBM for memory-bound ones, and on a
        host-staged fabric ``host_staged_channel_slowdown`` per channel it runs on for memory-bound ones.

        ``one_wave_gemms``: the GPU's compute-bound GEMMs run as one wave of persistent CTAs (``GPUProfile``
        ``persistent_gemm_grid``), so a compute-bound (prefill) module pays ``wave_slowdown`` instead of the SM share.
        """
        if not memory_bound and one_wave_gemms:
            return self.wave_slowdown
        if not memory_bound:
            return self.sm_slowdown
        slowdown = self.sm_slowdown
        if self.hbm_traffic > 0:
            slowdown += self.hbm_traffic * self.bus_rate(nbytes, ranks) / self.gpu_hbm_bytes_per_s
        if self.host_staged_channel_slowdown > 0:  # P2P off: each running channel's blocks stage through host memory
            slowdown += self.host_staged_channel_slowdown * self.channels_for(nbytes, ranks)
        return slowdown

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["sources"] = dict(self.sources)
        return data


def _nvlink() -> InterconnectProfile:
    return InterconnectProfile(
        name="h100-nvlink",
        description="8x H100 SXM on NVLink 4 / NVSwitch (HGX/DGX H100), NCCL ring",
        algorithm="ring",
        launch_s=NVLINK_LAUNCH_S,
        latency_s=NVLINK_LATENCY_S,
        bus_bytes_per_s=NVLINK_BUS_BYTES_PER_S,
        overlap_slowdown=OVERLAP_SLOWDOWN,
        large_latency_s=NVLINK_LARGE_LATENCY_S,
        small_bus_bytes_per_s=NVLINK_SMALL_BUS_BYTES_PER_S,
        hbm_traffic=3.0,
        nccl_channels=NVLINK_CHANNELS,
        gpu="h100-gpt-fast",
        sources={
            "launch_s": f"fitted: dense minus upper-bound decode per all-reduce at TP4 and TP8, batch 1 (16 KB), jointly "
                        f"with latency_s ({_LOGS})",
            "latency_s": f"fitted: the same two logged runs (14 ring hops at TP8 against 6 at TP4), which also give the "
                         f"paper's 1.43x upper bound at batch 1 ({_LOGS})",
            "small_bus_bytes_per_s": f"fitted: dense minus upper-bound decode per all-reduce at TP8, batch 64 (1 MB) ({_LOGS})",
            "large_latency_s": f"fitted: dense minus upper-bound prefill per all-reduce at TP8, batch 1 (16.8 MB), jointly "
                               f"with bus_bytes_per_s ({_LOGS}); NCCL's Simple-protocol ring hop is 5.7 us in "
                               f"{_NCCL_TUNER}",
            "bus_bytes_per_s": f"fitted: the same at TP8, batch 64 (1.07 GB) ({_LOGS}); against {_NCCL_TESTS} and the "
                               "H100 datasheet's 450 GB/s NVLink each way",
            "overlap_slowdown": f"derived, not fitted: {NVLINK_CHANNELS} of {H100_SM_COUNT} SMs held by NCCL, "
                                f"share / (1 - share) = {OVERLAP_SLOWDOWN:.3f}",
            "nccl_channels": _CHANNELS,
            "sms_per_channel": _CHANNELS,
            "gpu_sm_count": _SM_COUNT,
            "gpu": _DEFAULT_GPU,
            "hbm_traffic": "a ring step reads the local and the received chunk and writes the sum: 3 HBM bytes per bus "
                           "byte (assumption from the algorithm, not measured)",
            "gpu_hbm_bytes_per_s": "NVIDIA H100 SXM datasheet: 3.35 TB/s",
        },
    )


def _no_p2p() -> InterconnectProfile:
    fitted = f"fitted: dense minus upper bound per all-reduce in the authors' P2P-disabled logs ({_NO_P2P_LOGS})"
    return InterconnectProfile(
        name="h100-no-p2p",
        description="8x H100 with peer-to-peer disabled (NCCL_P2P_DISABLE=1), as the Ladder authors ran it: NCCL splits "
                    "the node into two groups of 4, and small all-reduces pay several times NVLink's latency",
        algorithm="ring",
        launch_s=NVLINK_LAUNCH_S,
        latency_s=NO_P2P_LATENCY_S,
        bus_bytes_per_s=NO_P2P_BUS_BYTES_PER_S,
        overlap_slowdown=NO_P2P_OVERLAP_SLOWDOWN,
        large_latency_s=NO_P2P_LARGE_LATENCY_S,
        small_bus_bytes_per_s=NO_P2P_SMALL_BUS_BYTES_PER_S,
        hbm_traffic=2.0,
        nccl_channels=NO_P2P_CHANNELS,
        gpu="h100-gpt-fast",
        group_size=NO_P2P_GROUP_SIZE,
        cross_latency_s=NO_P2P_CROSS_LATENCY_S,
        cross_small_bus_bytes_per_s=NO_P2P_CROSS_SMALL_BUS_BYTES_PER_S,
        host_staged_channel_slowdown=NO_P2P_HOST_STAGED_CHANNEL_SLOWDOWN,
        sources={
            "latency_s": f"{fitted}: decode at TP4, batch 1 and 16 (16 KB and 256 KB, a ring inside one group of 4), "
                         "jointly with small_bus_bytes_per_s; the paper's 1.60x Ladder figure is held out",
            "small_bus_bytes_per_s": f"{fitted}: the same two TP4 decode runs",
            "cross_latency_s": f"{fitted}: decode at TP8, batch 1 and 4 (16 KB and 64 KB, a ring across both groups), "
                               "jointly with cross_small_bus_bytes_per_s",
            "cross_small_bus_bytes_per_s": f"{fitted}: the same two TP8 decode runs",
            "large_latency_s": f"{fitted}: prefill at TP8, batch 1 and 4 (16.8 MB and 67 MB), jointly with bus_bytes_per_s",
            "bus_bytes_per_s": f"{fitted}: the same two TP8 prefill runs; the held-out TP4 prefill all-reduces (16.8 MB to "
                               "1.07 GB) agree. Large messages are not PCIe-bound (nccl-tests put 8x H100 over PCIe at "
                               f"35-45 GB/s, {_NCCL_TESTS}): the authors' scripts also set NCCL_NVLS_ENABLE=1, and NCCL's "
                               "NVLink SHARP path does not use the P2P transport (inference from the logs, not measured)",
            "group_size": "the authors' disable.log (NCCL 2.20.5, NCCL_P2P_LEVEL=LOC): the 8 GPUs form two groups of 4 "
                          "joined over the network",
            "launch_s": "shared with h100-nvlink (same NCCL call path)",
            "overlap_slowdown": f"derived, not fitted: {NO_P2P_CHANNELS} of {H100_SM_COUNT} SMs held by NCCL "
                                f"(disable.log), share / (1 - share) = {NO_P2P_OVERLAP_SLOWDOWN:.3f}",
            "nccl_channels": _CHANNELS,
            "sms_per_channel": _CHANNELS,
            "gpu_sm_count": _SM_COUNT,
            "gpu": _DEFAULT_GPU,
            "hbm_traffic": "2 HBM bytes per bus byte (read the chunk, write the result); assumption from the algorithm",
            "gpu_hbm_bytes_per_s": "NVIDIA H100 SXM datasheet: 3.35 TB/s",
            "host_staged_channel_slowdown": (
                "fitted, one Ladder figure: the P2P-disabled log at 70B, TP4, batch 64 (1 MB decode all-reduces), so "
                "that figure is a fit point, not held out. Per channel the all-reduce runs on, added to the slowdown "
                "of a memory-bound (decode) module. The channel count is NCCL's (src/enqueue.cc channel tuning, the "
                "thresholds disable.log prints): 1 channel at 16 KB, 16 at 256 KB and 1 MB for TP4. With P2P off the "
                "intra-group transport is SHM/direct/direct (disable.log: no copy engine, NCCL_SHM_USE_CUDA_MEMCPY "
                "off), so each channel's thread block stores into and polls pinned host memory over PCIe for the whole "
                "transfer; why that costs an HBM-streaming kernel about 7.6x a channel's SM share is not documented "
                "(inference from the logs: 16 KB all-reduces hide 87% of their time at TP4, 256 KB-1 MB ones 55%)"),
        },
    )


def _pcie() -> InterconnectProfile:
    return InterconnectProfile(
        name="pcie-gen5",
        description="GPUs with peer-to-peer over PCIe Gen5 switches and no NVLink (e.g. PCIe-card servers)",
        algorithm="ring",
        launch_s=NVLINK_LAUNCH_S,
        latency_s=PCIE_LATENCY_S,
        bus_bytes_per_s=PCIE_BUS_BYTES_PER_S,
        overlap_slowdown=NO_P2P_OVERLAP_SLOWDOWN,
        hbm_traffic=3.0,
        nccl_channels=NO_P2P_CHANNELS,
        gpu="h100-gpt-fast",
        sources={
            "bus_bytes_per_s": f"{_NCCL_TESTS}: 40 GB/s for 8xH100 PCIe",
            "nccl_channels": f"assumption: as h100-no-p2p ({NO_P2P_CHANNELS}), the PCIe ring's channel count ({_CHANNELS})",
            "gpu_sm_count": _SM_COUNT,
            "gpu": _DEFAULT_GPU + " (SXM peaks; a PCIe H100's are lower)",
            "latency_s": "derived, not calibrated: half the host-staged hop latency that the paper's 1.60x no-P2P Ladder "
                         "figure gives (5.27 us; one PCIe crossing per hop instead of two through host memory)",
            "launch_s": "shared with h100-nvlink",
            "overlap_slowdown": "derived from nccl_channels as h100-no-p2p (SM-driven PCIe copies)",
        },
    )


def _infiniband() -> InterconnectProfile:
    return InterconnectProfile(
        name="infiniband-ndr",
        description="TP across nodes: every hop crosses InfiniBand NDR (one 400 Gb/s ConnectX-7 per GPU), NCCL tree",
        algorithm="tree",
        launch_s=NVLINK_LAUNCH_S,
        latency_s=5e-6,
        bus_bytes_per_s=IB_NDR_BUS_BYTES_PER_S,
        overlap_slowdown=OVERLAP_SLOWDOWN,
        nccl_channels=NVLINK_CHANNELS,
        gpu="h100-gpt-fast",
        sources={
            "bus_bytes_per_s": "NVIDIA ConnectX-7 datasheet: 400 Gb/s NDR per port = 50 GB/s each way; DGX H100 user "
                               "guide: one ConnectX-7 per GPU on the compute fabric",
            "latency_s": f"assumption, not calibrated: 5 us per inter-node hop (NET ring LL hwLat 0.9 us plus switch and "
                         f"proxy; {_NCCL_TUNER}); no published figure in this project's calibration set",
            "launch_s": "shared with h100-nvlink",
            "overlap_slowdown": "derived from nccl_channels (assumption: as h100-nvlink's 24)",
            "nccl_channels": f"assumption: as h100-nvlink's {NVLINK_CHANNELS} ({_CHANNELS}); no inter-node log",
            "gpu_sm_count": _SM_COUNT,
            "gpu": _DEFAULT_GPU,
        },
    )


def builtin_profiles() -> dict[str, InterconnectProfile]:
    """The shipped profiles (the calibration fits trial values with ``dataclasses.replace`` on them)."""
    profiles = [_nvlink(), _no_p2p(), _pcie(), _infiniband()]
    return {p.name: p for p in profiles}


PROFILES: dict[str, InterconnectProfile] = builtin_profiles()
_ALIASES = {"nvlink": "h100-nvlink", "h100-host": "h100-no-p2p", "no-p2p": "h100-no-p2p", "pcie": "pcie-gen5",
            "infiniband": "infiniband-ndr", "ib": "infiniband-ndr"}


def load_interconnect(spec: str | Path) -> InterconnectProfile:
    """A built-in profile name, or a JSON file with the ``InterconnectProfile`` fields."""
    text = str(spec).strip()
    key = _ALIASES.get(text.lower(), text.lower())
    if key in PROFILES and key != text.lower():  # an alias: say which profile it stands for
        profile = PROFILES[key]
        return replace(profile, description=f"{profile.description} ('{text}' is an alias of {profile.name})")
    if key in PROFILES:
        return PROFILES[key]
    path = Path(text).expanduser()
    if path.is_file():
        try:
            data = json.loads(path.read_text())
            return InterconnectProfile(**{"name": path.stem, "description": f"custom profile {path}", **data})
        except (OSError, json.JSONDecodeError, TypeError) as exc:
            raise LadderizeError(f"cannot read interconnect profile {path}: {exc}") from None
    raise LadderizeError(
        f"unknown interconnect {text!r}: choose one of {', '.join(PROFILES)} or give a JSON file with the profile fields"
    )
