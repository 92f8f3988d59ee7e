"""The GPU benchmark of issue 25, one run: JSON + PNG.

    python benchmarks/bench_gpu.py --out benchmarks/results/bench_gpu [--force] [--quick] [--skip adapt,eval]

What it measures, all on one CUDA device, in one process run (so every figure shares the machine's state):

- decode ms/token in bfloat16, batch 1/16/64, prompt 128, for the llama-1b and llama-8b shapes (random weights), in
  each runtime mode (eager, graphs, compile, graphs+compile), through the product's own decode loop
  (``ladderize.runtime.bench.decode_runner`` -> ``decode.generate_on_rank``), beside transformers' static-cache
  ``generate`` with ``torch.compile`` on the same shape, and beside the read-bandwidth floor measured in the same run
  (weights read per token / measured read bandwidth). Every decode figure comes from ``runtime/timing.time_decode``
  (the one formula: time of G tokens minus time of 1, over G - 1); prefill is its time of 1 token.
- the default adapt recipe (``ladderize adapt L OUT --data wikitext2-heldout``, ladder 15:30) on SmolLM2-135M, run
  as the CLI: wall time, peak device memory and GPU utilisation (sampled with nvidia-smi), and the CPU time of the
  process tree (GPU-bound when it stays near one core).
- eval throughput on lambada_openai (all 5,153 passages) through ``ladderize.eval.harness.evaluate_checkpoint``.

Without CUDA it refuses in one line (exit 2). ``--device cpu`` runs the decode part on the CPU (transformers' generate
uncompiled there, the read bandwidth of a smaller tensor): the GPU check's rehearsal (``benchmarks/gpu_check.py``).
Argument parsing, the JSON record and the plot run anywhere (``tests/test_bench_gpu_script.py``).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAPES = ("llama-1b", "llama-8b")
BATCHES = (1, 16, 64)
MODES = {  # mode -> RuntimeOptions fields
    "eager": {},
    "graphs": {"cuda_graphs": True},
    "compile": {"compile": True},
    "graphs+compile": {"cuda_graphs": True, "compile": True},
}
HF_MODE = "transformers static+compile"
PARTS = ("decode", "adapt", "eval")
RECORD = "ladderize-bench-gpu"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "bench_gpu",
                        help="Output stem: OUT.json and OUT.png.")
    parser.add_argument("--force", action="store_true", help="Replace OUT.json / OUT.png if they exist.")
    parser.add_argument("--shapes", default=",".join(SHAPES), help="Synthetic shapes (ladderize bench presets).")
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)), help="Decode batch sizes.")
    parser.add_argument("--modes", default=",".join(MODES), help=f"Runtime modes: {', '.join(MODES)}.")
    parser.add_argument("--prompt", type=int, default=128, help="Prompt tokens per row.")
    parser.add_argument("--gen", type=int, default=64, help="New tokens per timed generation (decode steps + 1).")
    parser.add_argument("--warmup", type=int, default=2, help="Untimed repeats (compile and graph capture happen here).")
    parser.add_argument("--repeats", type=int, default=5, help="Timed repeats (medians).")
    parser.add_argument("--skip", default="", help=f"Parts to leave out: {', '.join(PARTS)}.")
    parser.add_argument("--no-hf", action="store_true", help="Leave out transformers' static-cache compiled generate.")
    parser.add_argument("--data-dir", type=Path, default=None, help="Folder with lambada_openai/ (default: $LADDERIZE_DATA_DIR).")
    parser.add_argument("--work", type=Path, default=Path(os.environ.get("BENCH_GPU_WORK", "/tmp/bench_gpu")),
                        help="Scratch folder for the SmolLM2 checkpoints of the adapt and eval parts.")
    parser.add_argument("--quick", action="store_true", help="Tiny budgets (a smoke run: llama-1b, batch 1, 1 repeat).")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                        help="cuda (the benchmark), or cpu (a rehearsal of the decode part; see the docstring).")
    args = parser.parse_args(argv)
    from ladderize.errors import LadderizeError
    from ladderize.parsing import parse_int_list
    from ladderize.runtime.bench import SYNTHETIC_CONFIGS

    args.shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    try:
        args.batches = parse_int_list(args.batches, "--batches")
    except LadderizeError as exc:
        parser.error(str(exc))
    unknown_shapes = [s for s in args.shapes if s not in SYNTHETIC_CONFIGS]
    if unknown_shapes:
        parser.error(f"unknown shape(s) {', '.join(unknown_shapes)}; presets: {', '.join(SYNTHETIC_CONFIGS)}")
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    args.skip = {p.strip() for p in args.skip.split(",") if p.strip()}
    unknown = [m for m in args.modes if m not in MODES] + [p for p in args.skip if p not in PARTS]
    if unknown:
        parser.error(f"unknown mode or part: {', '.join(unknown)}")
    if args.gen < 2 or args.prompt < 1 or args.repeats < 1 or args.warmup < 1:
        parser.error("--gen must be at least 2, --prompt and --repeats at least 1, --warmup at least 1 (compile time stays untimed)")
    if args.quick:
        args.shapes, args.batches, args.gen, args.warmup, args.repeats = args.shapes[:1], args.batches[:1], 8, 1, 1
    return args


def outputs(stem: Path) -> tuple[Path, Path]:
    return stem.with_suffix(".json"), stem.with_suffix(".png")


def check_outputs(stem: Path, force: bool) -> None:
    """Refuse (one line) to overwrite an earlier run without ``--force``."""
    existing = [str(p) for p in outputs(stem) if p.exists()]
    if existing and not force:
        raise SystemExit(f"bench_gpu: {', '.join(existing)} exists; pass --force to replace it")


def write_record(record: dict[str, Any], stem: Path, force: bool) -> Path:
    """The JSON record, written atomically (``checkpoint/atomic``)."""
    from ladderize.checkpoint.atomic import write_file_atomic

    path = outputs(stem)[0]
    check_outputs(stem, force)
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_file_atomic(path, json.dumps(record, indent=2, default=str) + "\n")


# --- decode ---------------------------------------------------------------------------------------------------------


def sync(device) -> None:
    """Wait for the device's queued work (nothing to wait for on the CPU)."""
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def read_bandwidth_gbs(device, gib: float = 4.0, repeats: int = 10) -> float:
    """Measured read bandwidth (GB/s): the median time of a sum over a ``gib`` GiB bfloat16 tensor (read-bound)."""
    import torch

    x = torch.ones(int(gib * 2**30) // 2, dtype=torch.bfloat16, device=device)
    times = []
    for index in range(repeats + 2):
        sync(device)
        start = time.perf_counter()
        x.sum(dtype=torch.float32)
        sync(device)
        if index >= 2:
            times.append(time.perf_counter() - start)
    del x
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()
    return x_bytes(gib) / statistics.median(times) / 1e9


def x_bytes(gib: float) -> int:
    return (int(gib * 2**30) // 2) * 2


def hf_runner(shape: str, batch: int, prompt_len: int, max_new: int, device):
    """transformers' recipe for fast decode: ``generate`` with the static cache, which on a GPU compiles its decode step
    itself (auto-compile: ``torch.compile(mode="reduce-overhead")`` of the forward, prefill left eager); ``run(n)`` as
    ``decode_runner``. Compiling ``model.forward`` by hand as well (the older recipe) fails under transformers 5.17:
    the first GPU run, 2026-11-26, read a CUDA-graph output the next replay had overwritten (the cache update)."""
    import torch
    from transformers import LlamaForCausalLM

    from ladderize.checkpoint.io import plain_llama_config
    from ladderize.runtime.bench import SYNTHETIC_CONFIGS

    config = plain_llama_config(SYNTHETIC_CONFIGS[shape])
    with torch.device(device):
        model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    prompt = torch.randint(0, config.vocab_size, (batch, prompt_len), generator=torch.Generator().manual_seed(0)).to(device)

    def run(n: int):
        sync(device)
        start = time.perf_counter()
        with torch.inference_mode():
            # on the CPU (the rehearsal) transformers does not auto-compile: eager there
            out = model.generate(prompt, max_new_tokens=n, min_new_tokens=n, do_sample=False, cache_implementation="static")
        sync(device)
        return time.perf_counter() - start, out[:, prompt_len:].tolist()

    return run


def bench_decode(args, device, say) -> dict[str, Any]:
    import gc

    import torch

    from ladderize.checkpoint.shapes import ModelShape
    from ladderize.checkpoint.io import config_from_dict
    from ladderize.runtime.bench import SYNTHETIC_CONFIGS, decode_runner, synthetic_source
    from ladderize.runtime.generate import RuntimeOptions
    from ladderize.runtime.timing import time_decode

    cuda = device.type == "cuda"
    bandwidth = read_bandwidth_gbs(device, gib=4.0 if cuda else 0.25)
    say(f"read bandwidth {bandwidth:,.0f} GB/s")
    rows = []
    for shape in args.shapes:
        dims = ModelShape.from_config(config_from_dict(SYNTHETIC_CONFIGS[shape]))
        weight_bytes = dims.param_count() * 2  # bfloat16: every weight read once per decode step
        for batch in args.batches:
            runs = {mode: (lambda m=mode: decode_runner(synthetic_source(shape), batch, args.prompt, args.gen,
                                                        RuntimeOptions(dtype="bfloat16", **MODES[m]), device=str(device)))
                    for mode in args.modes}
            if not args.no_hf:
                runs[HF_MODE] = lambda: hf_runner(shape, batch, args.prompt, args.gen, device)
            for mode, build in runs.items():  # one engine at a time: an 8B model twice would not fit with batch 64
                if cuda:
                    torch.cuda.reset_peak_memory_stats(device)
                say(f"decode {shape} batch {batch} {mode}")
                started = time.perf_counter()
                timing = time_decode({mode: build()}, args.gen, warmup=args.warmup, repeats=args.repeats)[mode]
                rows.append({
                    "shape": shape, "batch": batch, "mode": mode, "prompt": args.prompt, "gen": args.gen,
                    "decode_ms_per_token": timing["decode_s_per_token"] * 1e3,
                    "decode_ms_per_token_runs": [x * 1e3 for x in timing["decode_s_per_token_runs"]],
                    "prefill_ms": timing["prefill_s"] * 1e3,
                    "floor_ms_per_token": weight_bytes / (bandwidth * 1e9) * 1e3,
                    "bandwidth_share": weight_bytes / (bandwidth * 1e9) / timing["decode_s_per_token"],
                    "peak_device_gib": torch.cuda.max_memory_allocated(device) / 2**30 if cuda else None,
                    "wall_s_incl_warmup": time.perf_counter() - started,
                })
                # each row in the log as it lands: a run cut at its time limit keeps what it measured
                say(f"decode {shape} batch {batch} {mode}: {rows[-1]['decode_ms_per_token']:.3f} ms/token "
                    f"(floor {rows[-1]['floor_ms_per_token']:.3f}), prefill {rows[-1]['prefill_ms']:.1f} ms")
                gc.collect()
                if cuda:
                    torch.cuda.empty_cache()
    for row in rows:  # speed-ups in the same run
        hf = next((r for r in rows if r["shape"] == row["shape"] and r["batch"] == row["batch"] and r["mode"] == HF_MODE), None)
        eager = next((r for r in rows if r["shape"] == row["shape"] and r["batch"] == row["batch"] and r["mode"] == "eager"), None)
        row["speedup_vs_hf_compiled"] = hf["decode_ms_per_token"] / row["decode_ms_per_token"] if hf else None
        row["speedup_vs_eager"] = eager["decode_ms_per_token"] / row["decode_ms_per_token"] if eager else None
    return {"read_bandwidth_gbs": bandwidth, "rows": rows}


# --- adapt and eval on SmolLM2 --------------------------------------------------------------------------------------


class GpuSampler:
    """nvidia-smi sampled every ``period`` seconds: GPU utilisation (%) and device memory used (MiB)."""

    def __init__(self, period: float = 0.5):
        self.period, self.samples, self._stop = period, [], threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        query = ["nvidia-smi", "--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader,nounits", "-i",
                 os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]]
        while not self._stop.is_set():
            try:
                util, used = subprocess.run(query, capture_output=True, text=True, timeout=5).stdout.strip().split(",")[:2]
                self.samples.append((float(util), float(used)))
            except (OSError, ValueError, subprocess.SubprocessError):
                pass
            self._stop.wait(self.period)

    def __enter__(self) -> "GpuSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self, baseline_mib: float) -> dict[str, Any]:
        if not self.samples:
            return {"gpu_util_mean_pct": None, "peak_device_mib": None}
        return {"gpu_util_mean_pct": statistics.fmean(s[0] for s in self.samples),
                "gpu_busy_share": sum(s[0] > 0 for s in self.samples) / len(self.samples),
                "peak_device_mib": max(s[1] for s in self.samples) - baseline_mib, "samples": len(self.samples)}


def smollm2_ladder(work: Path, say) -> Path:
    """SmolLM2-135M (``ladderize pull``) converted to ladder 15:30 by the product, once."""
    from ladderize.convert.conversion import convert_checkpoint
    from ladderize.convert.pull import pull_model

    out = work / "smollm2-ladder-15-30"
    if not (out / "config.json").is_file():
        say("convert SmolLM2-135M to ladder 15:30")
        convert_checkpoint(str(pull_model("smollm2-135m")), out, ladder="15:30", force=True)
    return out


def bench_adapt(args, say) -> dict[str, Any]:
    """The default recipe through the CLI, as a user runs it."""
    ladder = smollm2_ladder(args.work, say)
    out = args.work / "adapted"
    cmd = [sys.executable, "-m", "ladderize.cli", "adapt", str(ladder), str(out), "--data", "wikitext2-heldout", "--force"]
    baseline = GpuSampler()
    with baseline:
        time.sleep(1.0)
    base_mib = min((s[1] for s in baseline.samples), default=0.0)
    say("adapt (default recipe) on SmolLM2 ladder 15:30")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    with GpuSampler() as sampler:
        done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1:] or ["adapt failed"], "wall_s": wall}
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"command": " ".join(cmd[1:]), "wall_s": wall, "cpu_s": cpu, "cpu_cores_busy": cpu / wall,
            **sampler.summary(base_mib), "stdout_tail": done.stdout.strip().splitlines()[-3:]}


def bench_eval(args, say) -> dict[str, Any]:
    import torch

    from ladderize.eval.harness import evaluate_checkpoint

    ladder = smollm2_ladder(args.work, say)
    limit = 200 if args.quick else None
    say(f"eval lambada_openai ({limit or 'all 5,153'} passages) on SmolLM2 ladder 15:30")
    torch.cuda.reset_peak_memory_stats()
    record = evaluate_checkpoint(ladder, ["lambada_openai"], limit=limit, batch_size="auto", data_dir=args.data_dir, device="cuda")
    passages = record["results"]["lambada_openai"].get("sample_len") or limit
    return {"passages": passages, "eval_s": record["eval_s"], "passages_per_s": passages / record["eval_s"],
            "batch_size": record["batch_size"], "dtype": record["dtype"], "device": record["device"],
            "acc": record["results"]["lambada_openai"].get("acc,none"),
            "perplexity": record["results"]["lambada_openai"].get("perplexity,none"),
            "peak_device_gib": torch.cuda.max_memory_allocated() / 2**30}


# --- the plot -------------------------------------------------------------------------------------------------------


def plot(record: dict[str, Any], path: Path) -> Path:
    """Decode ms/token per mode and batch, one panel per shape, with the bandwidth floor; written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ladderize.checkpoint.atomic import write_file_atomic

    rows = record.get("decode", {}).get("rows", [])
    shapes = list(dict.fromkeys(r["shape"] for r in rows)) or ["(no decode rows)"]
    fig, axes = plt.subplots(1, len(shapes), figsize=(6 * len(shapes), 4.2), squeeze=False)
    for ax, shape in zip(axes[0], shapes):
        mine = [r for r in rows if r["shape"] == shape]
        batches = sorted({r["batch"] for r in mine})
        modes = list(dict.fromkeys(r["mode"] for r in mine))
        width = 0.8 / max(1, len(modes))
        for index, mode in enumerate(modes):
            values = [next((r["decode_ms_per_token"] for r in mine if r["batch"] == b and r["mode"] == mode), 0.0) for b in batches]
            ax.bar([i + index * width for i in range(len(batches))], values, width, label=mode)
        for i, b in enumerate(batches):
            floor = next((r["floor_ms_per_token"] for r in mine if r["batch"] == b), None)
            if floor:
                ax.hlines(floor, i - width / 2, i + 0.8 - width / 2, colors="black", linestyles="dashed",
                          label="read-bandwidth floor" if i == 0 else None)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(batches))], [f"batch {b}" for b in batches])
        ax.set_ylabel("decode ms/token (bf16)")
        ax.set_title(f"{shape}, prompt {mine[0]['prompt'] if mine else '-'}")
        ax.legend(fontsize=7)
    fig.suptitle(f"{record.get('device_name', '')}  torch {record.get('torch', '')}", fontsize=9)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120)
    plt.close(fig)
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_file_atomic(path, buffer.getvalue())


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench_gpu: needs a CUDA device (torch sees none); nothing was run", file=sys.stderr)
        return 2
    check_outputs(args.out, args.force)
    import ladderize

    def say(message: str) -> None:
        print(f"[bench_gpu {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)

    if args.device == "cpu":
        args.skip |= {"adapt", "eval"}  # the CPU runs the decode part only (a rehearsal)
    device = torch.device("cuda", torch.cuda.current_device()) if args.device == "cuda" else torch.device("cpu")
    record: dict[str, Any] = {
        "record": RECORD, "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda, "ladderize_version": ladderize.__version__, "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "args": {k: (sorted(v) if isinstance(v, set) else str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
    }
    if "decode" not in args.skip:
        record["decode"] = bench_decode(args, device, say)
    if "adapt" not in args.skip:
        record["adapt"] = bench_adapt(args, say)
    if "eval" not in args.skip:
        record["eval"] = bench_eval(args, say)
    json_path = write_record(record, args.out, force=True)
    png = plot(record, outputs(args.out)[1])
    say(f"wrote {json_path} and {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
