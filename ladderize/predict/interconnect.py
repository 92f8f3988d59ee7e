"""All-reduce cost model and documented interconnect profiles.

One all-reduce of ``nbytes`` over ``N`` ranks costs

    launch_s + steps(N) * latency_s + 2 (N - 1) / N * nbytes / bus_bytes_per_s

* ``steps``: 2 (N - 1) for a ring (reduce-scatter then all-gather, one hop each), 2 ceil(log2 N) for a
  tree (reduce up, broadcast down).
* ``bus_bytes_per_s`` follows the nccl-tests convention ("busbw"): the per-rank link rate a ring
  saturates, so the 2 (N - 1) / N factor converts it to the time for the whole buffer.
* ``launch_s`` is the fixed cost of one collective call (kernel launch, synchronisation).

``overlap_slowdown`` is not part of the all-reduce cost: it says how much an all-reduce running beside a
compute kernel slows that kernel (NCCL kernels hold SMs and memory bandwidth). While both run, compute
progresses at ``1 / (1 + overlap_slowdown)`` of its normal rate; see ``ladderize.predict.schedule``.

Every parameter carries its source in ``sources``; "fitted" parameters name the published figure that
fixed them (``ladderize.predict.calibration`` re-derives them, docs/predict.md tabulates them).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, Mapping

from ..errors import LadderizeError

Algorithm = Literal["ring", "tree"]

# Fitted by ladderize.predict.calibration.fit_interconnects() (tests/predict/test_calibration.py re-runs it).
NVLINK_LAUNCH_S = 7.318e-6
NVLINK_LATENCY_S = 1.199e-6
OVERLAP_SLOWDOWN = 0.2628
NO_P2P_LATENCY_S = 6.048e-6

NVLINK_BUS_BYTES_PER_S = 450e9
PCIE5_BUS_BYTES_PER_S = 63e9
IB_NDR_BUS_BYTES_PER_S = 50e9

_LADDER = "Ladder Residual (arXiv:2501.06589) and its authors' blog table, Llama-3.1-70B at TP8 on 8xH100"
_LOGS = "the Ladder authors' published logs, github.com/mayank31398/ladder-residual-inference final-results-512/"


@dataclass(frozen=True)
class InterconnectProfile:
    """Latency/bandwidth parameters of one collective fabric, each with its source."""

    name: str
    description: str
    algorithm: Algorithm
    launch_s: float
    latency_s: float
    bus_bytes_per_s: float
    overlap_slowdown: float
    sources: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.algorithm not in ("ring", "tree"):
            raise LadderizeError(f"interconnect {self.name!r}: algorithm must be 'ring' or 'tree', got {self.algorithm!r}")
        if self.launch_s < 0 or self.latency_s < 0 or self.overlap_slowdown < 0:
            raise LadderizeError(f"interconnect {self.name!r}: latencies and overlap_slowdown must be >= 0")
        if self.bus_bytes_per_s <= 0:
            raise LadderizeError(f"interconnect {self.name!r}: bus_bytes_per_s must be positive")

    def steps(self, ranks: int) -> int:
        """Sequential hops of one all-reduce over ``ranks`` ranks."""
        if ranks <= 1:
            return 0
        if self.algorithm == "ring":
            return 2 * (ranks - 1)
        return 2 * math.ceil(math.log2(ranks))

    def allreduce_s(self, nbytes: float, ranks: int) -> float:
        """Seconds for one all-reduce of ``nbytes`` (the full buffer each rank holds) over ``ranks`` ranks."""
        if ranks <= 1 or nbytes <= 0:
            return 0.0
        volume = 2.0 * (ranks - 1) / ranks * nbytes
        return self.launch_s + self.steps(ranks) * self.latency_s + volume / self.bus_bytes_per_s

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["sources"] = dict(self.sources)
        return data


def _nvlink(launch_s: float = NVLINK_LAUNCH_S, latency_s: float = NVLINK_LATENCY_S,
            overlap_slowdown: float = OVERLAP_SLOWDOWN) -> InterconnectProfile:
    return InterconnectProfile(
        name="h100-nvlink",
        description="8x H100 SXM on NVLink 4 / NVSwitch (HGX/DGX H100), NCCL ring",
        algorithm="ring",
        launch_s=launch_s,
        latency_s=latency_s,
        bus_bytes_per_s=NVLINK_BUS_BYTES_PER_S,
        overlap_slowdown=overlap_slowdown,
        sources={
            "bus_bytes_per_s": "NVIDIA H100 datasheet: NVLink 900 GB/s per GPU, both directions, so 450 GB/s each way",
            "latency_s": f"fitted: 1.43x upper bound at batch 1 ({_LADDER})",
            "launch_s": f"fitted: 1.162x upper bound at TP4, batch 1 ({_LOGS}: 69.04 vs 59.41 tokens/s)",
            "overlap_slowdown": f"fitted: 1.31x Ladder speed-up at batch 1 ({_LADDER})",
        },
    )


def _no_p2p(latency_s: float = NO_P2P_LATENCY_S) -> InterconnectProfile:
    return InterconnectProfile(
        name="h100-no-p2p",
        description="8x H100 with peer-to-peer disabled (NCCL_P2P_DISABLE): NCCL stages every hop through host "
                    "memory over PCIe Gen5",
        algorithm="ring",
        launch_s=NVLINK_LAUNCH_S,
        latency_s=latency_s,
        bus_bytes_per_s=PCIE5_BUS_BYTES_PER_S,
        overlap_slowdown=OVERLAP_SLOWDOWN,
        sources={
            "bus_bytes_per_s": "PCI Express 5.0 x16: 32 GT/s x 16 lanes, 128b/130b, about 63 GB/s each way (PCI-SIG); "
                               "the GPU->host and host->GPU copies of a hop use different links and pipeline",
            "latency_s": f"fitted: 1.60x Ladder speed-up at batch 1 with peer-to-peer disabled ({_LADDER})",
            "launch_s": "shared with h100-nvlink (same NCCL call path)",
            "overlap_slowdown": "shared with h100-nvlink (assumption: the same NCCL kernels occupy the SMs)",
        },
    )


def _pcie(latency_s: float = NO_P2P_LATENCY_S / 2) -> InterconnectProfile:
    return InterconnectProfile(
        name="pcie-gen5",
        description="GPUs with peer-to-peer over PCIe Gen5 switches and no NVLink (e.g. PCIe-card servers)",
        algorithm="ring",
        launch_s=NVLINK_LAUNCH_S,
        latency_s=latency_s,
        bus_bytes_per_s=PCIE5_BUS_BYTES_PER_S,
        overlap_slowdown=OVERLAP_SLOWDOWN,
        sources={
            "bus_bytes_per_s": "PCI Express 5.0 x16, about 63 GB/s each way (PCI-SIG)",
            "latency_s": "derived, not calibrated: half the fitted h100-no-p2p hop latency (one PCIe crossing per hop "
                         "instead of two through host memory)",
            "launch_s": "shared with h100-nvlink",
            "overlap_slowdown": "shared with h100-nvlink (assumption)",
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
        sources={
            "bus_bytes_per_s": "NVIDIA ConnectX-7 datasheet: 400 Gb/s NDR per port = 50 GB/s each way; DGX H100 user "
                               "guide: one ConnectX-7 per GPU on the compute fabric",
            "latency_s": "assumption, not calibrated: 5 us per inter-node hop (switch traversal plus NCCL network proxy); "
                         "no published figure in this project's calibration set",
            "launch_s": "shared with h100-nvlink",
            "overlap_slowdown": "shared with h100-nvlink (assumption)",
        },
    )


def builtin_profiles(
    nvlink_launch_s: float = NVLINK_LAUNCH_S,
    nvlink_latency_s: float = NVLINK_LATENCY_S,
    overlap_slowdown: float = OVERLAP_SLOWDOWN,
) -> dict[str, InterconnectProfile]:
    """The shipped profiles (the calibration passes trial values for the fitted NVLink parameters)."""
    profiles = [_nvlink(nvlink_launch_s, nvlink_latency_s, overlap_slowdown), _no_p2p(), _pcie(), _infiniband()]
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
