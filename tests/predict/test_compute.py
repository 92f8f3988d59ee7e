"""Module work accounting, the roofline, and measured timing (tiny shapes, CPU)."""

from __future__ import annotations

import json

import pytest

from ladderize.errors import LadderizeError
from ladderize.predict.compute import RooflineCompute, make_compute
from ladderize.predict.measured import MeasuredCompute
from ladderize.predict.work import module_work, roofline_s
from ladderize.predict.gpus import GPU_PROFILES, load_gpu_profile
from ladderize.predict.presets import ModelShape, load_model_shape

TINY = ModelShape("tiny", hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=8,
                  num_key_value_heads=4, head_dim=8, vocab_size=128)


def test_work_of_a_70b_rank_at_tp8():
    shape = load_model_shape("llama-3.1-70b")
    attention = module_work(shape, "attention", 8, 1, 1, 1280)
    mlp = module_work(shape, "mlp", 8, 1, 1, 0)
    assert (attention.heads, attention.kv_heads, mlp.intermediate_size) == (8, 1, 3584)
    weights_mb = (attention.weight_params + mlp.weight_params) * 2 / 1e6
    assert weights_mb == pytest.approx(213.9, abs=0.1)  # one layer's bf16 shard per rank
    assert attention.bytes - attention.weight_params * 2 == pytest.approx(1280 * 2 * 128 * 2, rel=0.1)  # KV read
    assert mlp.flops == pytest.approx(2 * mlp.weight_params)
    head = module_work(shape, "head", 8, 4, 1024, 0)
    assert head.q_len == 1 and head.weight_params == 8192 * 128256 + 8192  # replicated, last position only


def test_causal_prefill_counts_half_the_attention_matrix():
    prefill = module_work(TINY, "attention", 1, 1, 100, 100)
    dense_part = 2 * prefill.tokens * prefill.weight_params
    assert prefill.flops - dense_part == pytest.approx(4 * 8 * 100 * 50.5 * 8)


def test_roofline_takes_the_slower_bound_plus_overhead():
    gpu = GPU_PROFILES["h100"]
    fit = gpu.fit
    shape = load_model_shape("llama-3.1-70b")
    decode = module_work(shape, "mlp", 8, 1, 1, 0)
    attention = module_work(shape, "attention", 8, 4, 1, 1280)
    prefill = module_work(shape, "mlp", 8, 16, 1024, 0)
    model = RooflineCompute(gpu)
    assert model.module_s(decode) == pytest.approx(decode.bytes / fit.weight_bytes_per_s + fit.overhead_s["mlp"])
    kv = 4 * 1280 * 2 * 1 * 128 * 2
    assert model.module_s(attention) == pytest.approx(
        (attention.bytes - kv) / fit.weight_bytes_per_s + kv / fit.kv_bytes_per_s + fit.overhead_s["attention"])
    efficiency = fit.efficiency("mlp", 3584)
    assert model.module_s(prefill) == pytest.approx(prefill.flops / (gpu.peak_flops_per_s * efficiency) + fit.overhead_s["mlp"])
    assert roofline_s(decode, 1.0, 1.0) == max(decode.flops, decode.bytes)
    assert load_gpu_profile("H100-SXM").name == gpu.name
    with pytest.raises(LadderizeError):
        load_gpu_profile("tpu-v5")


def test_measured_times_modules_and_caches_them(tmp_path):
    first = MeasuredCompute(cache_dir=tmp_path, repeats=2, device="cpu")  # true on a GPU machine too
    assert not first.is_gpu and "CPU" in first.label
    works = [module_work(TINY, "attention", 2, 2, 1, 24), module_work(TINY, "attention", 2, 2, 16, 16),
             module_work(TINY, "mlp", 2, 2, 1, 0), module_work(TINY, "head", 2, 2, 1, 0)]
    seconds = [first.module_s(w) for w in works]
    assert all(0 < s < 0.5 for s in seconds)
    assert first.measured_count == len(works) and all(first.source(w) == "measured" for w in works)
    cache = json.loads((tmp_path / "measurements.json").read_text())
    assert len(cache["entries"]) == len(works) and cache["rates"]

    second = MeasuredCompute(cache_dir=tmp_path, repeats=2, device="cpu")
    assert [second.module_s(w) for w in works] == seconds
    assert second.measured_count == 0  # every module came from the cache


def test_measured_uses_a_scaled_proxy_when_over_budget(tmp_path):
    compute = MeasuredCompute(cache_dir=tmp_path, repeats=1, max_bytes=8 * 2**20)
    big = module_work(ModelShape("wide", 1024, 2048, 2, 8, 8, 128, 256), "mlp", 1, 1, 1, 0)
    proxy = compute.proxy_for(big)
    assert proxy.hidden_size < big.hidden_size and proxy.batch == big.batch  # memory-bound: width shrinks
    assert compute.module_s(big) > 0
    assert compute.source(big).startswith("measured proxy (hidden_size")


def test_make_compute_modes(tmp_path):
    assert isinstance(make_compute("roofline", GPU_PROFILES["a100"]), RooflineCompute)
    assert isinstance(make_compute("measured", cache_dir=tmp_path), MeasuredCompute)
    with pytest.raises(LadderizeError, match="unknown compute mode"):
        make_compute("guessed")


def test_measured_times_the_runtimes_own_modules_and_kernels(tmp_path, monkeypatch):
    """``--compute measured`` runs the runtime's RankModel modules (its kernels, norms, rotary, KV cache)."""
    from ladderize.runtime import engine
    from ladderize.runtime.plan import StepKind

    ran: list[tuple[str, tuple]] = []
    step, logits = engine.RankModel.step_partial, engine.RankModel.logits

    def counted_step(self, kind, lw, x, *rest):
        ran.append((kind.value, tuple(x.shape)))
        return step(self, kind, lw, x, *rest)

    def counted_logits(self, hidden):
        ran.append(("head", tuple(hidden.shape)))
        return logits(self, hidden)

    monkeypatch.setattr(engine.RankModel, "step_partial", counted_step)
    monkeypatch.setattr(engine.RankModel, "logits", counted_logits)
    compute = MeasuredCompute(cache_dir=tmp_path, repeats=1)
    for kind, q_len, kv_len in (("attention", 1, 24), ("mlp", 1, 0), ("head", 1, 0)):
        compute.module_s(module_work(TINY, kind, 2, 3, q_len, kv_len))
    assert {(name, shape) for name, shape in ran} >= {
        (StepKind.ATTENTION.value, (3, 1, 64)), (StepKind.MLP.value, (3, 1, 64)), ("head", (3, 1, 64))}  # fmt: skip


def test_measured_builds_only_the_module_within_its_memory_budget(tmp_path, monkeypatch):
    """Issue 26: a 70B TP8 rank's modules are built within the budget (no full-vocabulary embedding beside an
    attention block); the old build asked for 2 x 128256 x 8192 fp32 (8.4 GB) and the OOM killer ended predict."""
    from ladderize.runtime import weights

    built: list[tuple[str, float]] = []
    real = weights.random_rank_weights

    def bounded(dims, *args, **kwargs):
        built.append((dims.name, 4.0 * dims.num_parameters))
        assert 4.0 * dims.num_parameters <= compute.max_bytes, f"build of {dims.num_parameters:,} params over budget"
        return real(dims, *args, **kwargs)

    monkeypatch.setattr(weights, "random_rank_weights", bounded)
    compute = MeasuredCompute(cache_dir=tmp_path, repeats=1, device="cpu")
    shape = load_model_shape("llama-3.1-70b")
    for work in (module_work(shape, "attention", 8, 1, 1, 1280), module_work(shape, "mlp", 8, 1, 1, 0),
                 module_work(shape, "head", 8, 1, 1, 0)):
        assert compute.module_s(work) > 0
        assert compute.build_bytes(compute.proxy_for(work)) <= compute.max_bytes
    assert len(built) >= 3


def test_measured_refuses_in_one_line_what_cannot_fit(tmp_path, monkeypatch, capsys):
    """Before anything is allocated: the bytes a module needs against the memory available."""
    from ladderize.predict import measured
    from tests.cli_helpers import error_lines, run_cli

    monkeypatch.setattr(measured, "available_memory_bytes", lambda device=None: 64 * 2**10)
    fabric = tmp_path / "cpu-fabric.json"  # no "gpu": a CPU fabric, where measuring this CPU is the question
    fabric.write_text('{"algorithm": "ring", "launch_s": 5e-6, "latency_s": 2e-6, "bus_bytes_per_s": 5e9, '
                      '"overlap_slowdown": 0.0}')
    code, out, err = run_cli(["predict", "--model", "llama-3.1-70b", "--tp", "8", "--batch", "1", "--prompt", "64",
                              "--gen", "8", "--schedules", "dense", "--device", "cpu", "--cache-dir", tmp_path,
                              "--compute", "measured", "--interconnect", fabric], capsys, monkeypatch)
    assert code == 2 and "Traceback" not in err
    (line,) = error_lines(err)
    assert "needs about" in line and "GiB" in line and "--compute roofline" in line


def test_available_memory_is_bounded_by_the_address_space_limit():
    import resource

    from ladderize.predict.measured import available_memory_bytes

    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    room = available_memory_bytes()
    assert 0 < room < float("inf")
    cap = 64 * 2**30
    resource.setrlimit(resource.RLIMIT_AS, (cap if hard == resource.RLIM_INFINITY else min(cap, hard), hard))
    try:
        assert available_memory_bytes() <= cap
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
