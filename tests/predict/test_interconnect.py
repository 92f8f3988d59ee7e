"""The all-reduce cost model and the shipped profiles."""

from __future__ import annotations

import dataclasses
import json

import pytest

from ladderize.errors import LadderizeError
from ladderize.predict.interconnect import PROFILES, InterconnectProfile, load_interconnect


def _profile(**overrides) -> InterconnectProfile:
    fields = dict(name="t", description="test", algorithm="ring", launch_s=2e-6, latency_s=1e-6,
                  bus_bytes_per_s=100e9, overlap_slowdown=0.0)
    return InterconnectProfile(**{**fields, **overrides})


def test_ring_allreduce_is_latency_steps_plus_volume_over_bandwidth():
    ring = _profile()
    nbytes = 8e6
    expected = 2e-6 + 2 * 7 * 1e-6 + 2 * 7 / 8 * nbytes / 100e9
    assert ring.allreduce_s(nbytes, 8) == pytest.approx(expected)
    assert ring.steps(8) == 14 and ring.steps(2) == 2
    assert ring.allreduce_s(nbytes, 1) == 0.0 and ring.allreduce_s(0, 8) == 0.0


def test_tree_has_logarithmic_steps():
    tree = _profile(algorithm="tree")
    assert tree.steps(8) == 6 and tree.steps(16) == 8 and tree.steps(3) == 4
    assert tree.allreduce_s(1.0, 16) < _profile().allreduce_s(1.0, 16)


def test_small_messages_pay_latency_large_ones_bandwidth():
    nvlink = PROFILES["h100-nvlink"]
    small, large = 16 * 1024, 256 * 2**20
    assert nvlink.allreduce_s(small, 8) == pytest.approx(nvlink.launch_s + 14 * nvlink.latency_s, rel=0.01)
    assert nvlink.allreduce_s(large, 8) == pytest.approx(
        nvlink.launch_s + 14 * nvlink.large_latency_s + 1.75 * large / nvlink.bus_bytes_per_s)
    assert nvlink.allreduce_s(2**32, 8) == pytest.approx(1.75 * 2**32 / nvlink.bus_bytes_per_s, rel=0.01)
    # Two protocols: the latency one below the crossover, the bandwidth one above it.
    two = _profile(large_latency_s=5e-6, small_bus_bytes_per_s=50e9)
    assert two.allreduce_s(1e3, 8) == pytest.approx(2e-6 + 14e-6 + 1.75e3 / 50e9)
    assert two.allreduce_s(1e9, 8) == pytest.approx(2e-6 + 14 * 5e-6 + 1.75e9 / 100e9)


def test_a_ring_across_groups_pays_the_cross_group_hop():
    """Issue 35: a node split into groups (P2P disabled: two groups of 4) prices a ring that crosses them with the
    cross-group latency-protocol hop and bandwidth; a ring inside a group, and the bandwidth protocol, are unchanged."""
    split = _profile(group_size=4, cross_latency_s=4e-6, cross_small_bus_bytes_per_s=10e9, small_bus_bytes_per_s=50e9,
                     large_latency_s=5e-6)
    assert split.allreduce_s(1e3, 4) == pytest.approx(2e-6 + 6 * 1e-6 + 1.5e3 / 50e9)
    assert split.allreduce_s(1e3, 8) == pytest.approx(2e-6 + 14 * 4e-6 + 1.75e3 / 10e9)
    assert split.allreduce_s(1e9, 8) == pytest.approx(2e-6 + 14 * 5e-6 + 1.75e9 / 100e9)
    assert _profile(group_size=4).allreduce_s(1e3, 8) == _profile().allreduce_s(1e3, 8)  # no cross fields: as one group
    with pytest.raises(LadderizeError):
        _profile(group_size=-1)


def test_overlap_slowdown_depends_on_what_the_allreduce_competes_for():
    nvlink, no_p2p = PROFILES["h100-nvlink"], PROFILES["h100-no-p2p"]
    decode, prefill = 64 * 8192 * 2, 64 * 1024 * 8192 * 2
    # Compute-bound modules lose the SMs NCCL holds; memory-bound ones also the HBM the all-reduce streams.
    assert nvlink.overlap_slowdown_for(prefill, 8, memory_bound=False) == nvlink.overlap_slowdown
    assert nvlink.overlap_slowdown_for(decode, 8, memory_bound=True) > nvlink.overlap_slowdown
    assert nvlink.overlap_slowdown_for(16 * 1024, 8, True) < nvlink.overlap_slowdown_for(decode, 8, True)
    # Host-staged: fewer channels (16 against 24), and PCIe-rate traffic is a negligible share of HBM.
    # Issue 35: the SM share is derived from NCCL's channels (one SM each) against the H100's 132 SMs, not fitted.
    assert nvlink.overlap_slowdown == pytest.approx(24 / (132 - 24))
    assert no_p2p.overlap_slowdown == pytest.approx(16 / (132 - 16))
    assert all(p.nccl_channels > 0 and p.gpu for p in PROFILES.values())
    # What a host-staged channel costs a memory-bound module: fitted on P2P off only; every other fabric has none.
    assert no_p2p.host_staged_channel_slowdown == pytest.approx(0.06543)
    assert all(p.host_staged_channel_slowdown == 0 for p in PROFILES.values() if p is not no_p2p)
    sm_and_hbm = dataclasses.replace(no_p2p, host_staged_channel_slowdown=0.0)
    assert sm_and_hbm.overlap_slowdown_for(decode, 8, True) - no_p2p.overlap_slowdown < 0.03
    for nbytes, tp in ((16 * 1024, 4), (256 * 1024, 4), (decode, 4), (decode, 8)):
        extra = no_p2p.overlap_slowdown_for(nbytes, tp, True) - sm_and_hbm.overlap_slowdown_for(nbytes, tp, True)
        assert extra == pytest.approx(0.06543 * no_p2p.channels_for(nbytes, tp))
        # Compute-bound (prefill) modules do not pay it.
        assert no_p2p.overlap_slowdown_for(nbytes, tp, False) == sm_and_hbm.overlap_slowdown_for(nbytes, tp, False)


def test_nccl_runs_a_small_allreduce_on_fewer_channels():
    """NCCL's channel tuning (src/enqueue.cc): channels drop while nBytes < channels x 512 threads x threadThreshold
    (8 x ranks bytes per thread for LL, 64 for Simple; disable.log prints 64/8/64 at 8 ranks)."""
    from ladderize.predict.interconnect import nccl_ring_channels

    assert nccl_ring_channels(16 * 1024, 4, 16, latency_protocol=True) == 1
    assert nccl_ring_channels(64 * 1024, 4, 16, latency_protocol=True) == 4
    assert nccl_ring_channels(256 * 1024, 4, 16, latency_protocol=True) == 16
    assert nccl_ring_channels(2**20, 4, 16, latency_protocol=True) == 16
    assert nccl_ring_channels(64 * 1024, 8, 16, latency_protocol=True) == 2  # 64 bytes per thread at 8 ranks
    assert nccl_ring_channels(2**20, 8, 24, latency_protocol=False) == 24  # Simple: 32 KB per channel
    assert nccl_ring_channels(1, 8, 16, latency_protocol=True) == 1
    assert nccl_ring_channels(2**20, 1, 16, latency_protocol=True) == 16 and nccl_ring_channels(2**20, 4, 0, True) == 0
    no_p2p = PROFILES["h100-no-p2p"]
    # The decode all-reduces of 70B at TP4 without P2P: batch 1 (16 KB) on 1 channel, batch 16 and 64 on all 16.
    assert [no_p2p.channels_for(b * 8192 * 2, 4) for b in (1, 16, 64)] == [1, 16, 16]
    assert no_p2p.channels_for(0, 4) == 0 and no_p2p.channels_for(16 * 1024, 1) == 0


def test_one_wave_gemms_lose_a_whole_wave_to_the_channels_nccl_holds():
    from ladderize.predict.interconnect import one_wave_slowdown

    nvlink, no_p2p = PROFILES["h100-nvlink"], PROFILES["h100-no-p2p"]
    prefill = 1024 * 8192 * 2
    # A persistent grid of 132 CTAs with 24 (or 16) SMs held: the CTAs left over run as a second wave, 2x the time
    # (the NVIDIA forum's H100 measurement: nearly 2x, MFU 80% to 47%), against the SM share's 24/108.
    assert one_wave_slowdown(24, 1, 132) == one_wave_slowdown(16, 1, 132) == 1.0
    assert one_wave_slowdown(0, 1, 132) == 0.0 and one_wave_slowdown(70, 1, 132) == 2.0
    with pytest.raises(LadderizeError):
        one_wave_slowdown(132, 1, 132)
    for profile in (nvlink, no_p2p):
        assert profile.overlap_slowdown_for(prefill, 8, memory_bound=False, one_wave_gemms=True) == 1.0
        assert profile.overlap_slowdown_for(prefill, 8, memory_bound=False) == profile.overlap_slowdown
        # Decode (memory-bound GEMVs) keeps the SM share plus HBM, one-wave GPU or not.
        assert (profile.overlap_slowdown_for(64 * 8192 * 2, 8, True, one_wave_gemms=True)
                == profile.overlap_slowdown_for(64 * 8192 * 2, 8, True))
    # Without a channel count there is no wave to lose: the given slowdown stands.
    unknown = dataclasses.replace(nvlink, nccl_channels=0, overlap_slowdown=0.3)
    assert unknown.overlap_slowdown_for(prefill, 8, False, one_wave_gemms=True) == 0.3


def test_profiles_cite_every_parameter_and_order_sensibly():
    for profile in PROFILES.values():
        for parameter in ("bus_bytes_per_s", "latency_s", "launch_s", "overlap_slowdown", "nccl_channels",
                          "gpu_sm_count", "gpu"):
            assert profile.sources.get(parameter), (profile.name, parameter)
    decode = 16 * 1024
    nvlink, no_p2p = PROFILES["h100-nvlink"], PROFILES["h100-no-p2p"]
    assert nvlink.allreduce_s(decode, 8) < PROFILES["pcie-gen5"].allreduce_s(decode, 8) < no_p2p.allreduce_s(decode, 8)
    assert "fitted" in nvlink.sources["latency_s"] and "1.43" in nvlink.sources["latency_s"]
    assert "nccl-tests" in nvlink.sources["bus_bytes_per_s"] and "nccl-tests" in no_p2p.sources["bus_bytes_per_s"]
    assert "1.60" in no_p2p.sources["latency_s"]


def test_load_by_name_alias_and_json(tmp_path):
    assert load_interconnect("h100-nvlink") is PROFILES["h100-nvlink"]
    alias = load_interconnect("NVLink")  # the same profile, and its description says which one the alias named
    assert alias == dataclasses.replace(PROFILES["h100-nvlink"], description=alias.description)
    assert alias.description.endswith("('NVLink' is an alias of h100-nvlink)")
    assert load_interconnect("h100-host").name == "h100-no-p2p"
    path = tmp_path / "mine.json"
    path.write_text(json.dumps({"algorithm": "tree", "launch_s": 0, "latency_s": 3e-6, "bus_bytes_per_s": 25e9,
                                "overlap_slowdown": 0.1}))
    custom = load_interconnect(path)
    assert custom.name == "mine" and custom.steps(4) == 4


def test_bad_profiles_are_user_errors(tmp_path):
    with pytest.raises(LadderizeError, match="unknown interconnect"):
        load_interconnect("carrier-pigeon")
    with pytest.raises(LadderizeError):
        _profile(algorithm="butterfly")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"latency_s": 1e-6}))
    with pytest.raises(LadderizeError, match="cannot read interconnect"):
        load_interconnect(bad)
