"""Runtime benchmarks on CPU: each subcommand prints a summary and saves JSON under benchmarks/results/.

    python benchmarks/bench_runtime.py ladder         # (a) TP=2 gloo: ladder vs dense vs upper-bound
    python benchmarks/bench_runtime.py single-device  # (b) TP=1 runtime vs transformers generate, SmolLM2-135M
    python benchmarks/bench_runtime.py domino         # (c) TP=2 gloo: domino vs dense at batch >= 4
    python benchmarks/bench_runtime.py overlap        # why ladder leaves a gap: gloo all-reduce latency and overlap
    python benchmarks/bench_runtime.py progress       # does an in-flight gloo all-reduce progress while the rank computes?
    python benchmarks/bench_runtime.py all

Timings on a shared machine are noisy: every JSON records the load average before and after.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from ladderize.records import BenchRow
from ladderize.runtime.bench import BenchSpec, run_bench, synthetic_source
from ladderize.runtime.launch import LaunchSpec, RankContext, run_ranks
from ladderize.runtime.timing import load_average, time_decode

RESULTS = Path(__file__).resolve().parent / "results"


def save(name: str, payload: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / name
    path.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"saved {path}")
    return path


def percent(value: float | None) -> str:
    """``gap_closed`` is undefined (None) when noise makes the upper bound no faster than dense."""
    return "n/a" if value is None else f"{value:.0%}"


def launch_spec(args) -> LaunchSpec:
    """TP=2 on this machine, with the thread/pinning/priority choices of the command line."""
    return LaunchSpec(tp=2, threads_per_rank=args.threads_per_rank, pin_cores=args.pin_cores, comm_nice=args.comm_nice)


def rows_table(rows: list[BenchRow]) -> None:
    print(f"{'schedule':<12} {'tp':>2} {'batch':>5} {'prefill ms':>10} {'decode ms/tok':>13} {'decode tok/s':>12} "
          f"{'ARs/step':>8} {'comm':>5} {'decode vs dense':>15} {'gap closed':>10}")
    for r in rows:
        gap = "-" if r.decode_gap_closed is None else percent(r.decode_gap_closed)
        speed = "-" if r.decode_speedup_vs_dense is None else f"{r.decode_speedup_vs_dense:.3f}x"
        print(f"{r.schedule:<12} {r.tp:>2} {r.batch:>5} {r.prefill_s * 1e3:>10.1f} "
              f"{r.decode_s_per_token * 1e3:>13.2f} {r.decode_tokens_per_s:>12.1f} {r.allreduces_per_decode_step:>8} "
              f"{r.decode_allreduce_share:>5.0%} {speed:>15} {gap:>10}")


# --- (a) ladder vs dense at TP=2 --------------------------------------------------------------


def _bench_tp2(args, source, schedules: tuple[str, ...], options=None):
    """Run ``schedules`` at TP=2 on ``source`` and print the table; return the result and the load before."""
    from ladderize.runtime.generate import RuntimeOptions

    before = load_average()
    spec = BenchSpec(schedules, tuple(args.batch), args.prompt, args.gen, args.warmup, args.repeats)
    result = run_bench(source, [2], spec, launch_spec(args), options or RuntimeOptions())
    rows_table(result.rows)
    return result, before


def _save_tp2(args, result, summary: dict, before: list[float], default_name: str) -> dict:
    payload = {**result.to_json(), "summary": summary, "load_average_before": before, "load_average_after": load_average(),
               "command": " ".join(sys.argv)}
    save(args.out or default_name, payload)
    return payload


def bench_ladder(args) -> dict:
    result, before = _bench_tp2(args, synthetic_source(args.shape, {"ladder": "all"}), ("native", "dense", "upper-bound"))
    summary = {}
    for batch in args.batch:
        native = next(r for r in result.rows if r.schedule == "native" and r.batch == batch)
        summary[f"batch{batch}"] = {"ladder_decode_speedup_vs_dense": native.decode_speedup_vs_dense,
                                    "ladder_e2e_speedup_vs_dense": native.e2e_speedup_vs_dense,
                                    "decode_gap_closed": native.decode_gap_closed}
        print(f"batch {batch}: ladder decode speed-up vs dense {native.decode_speedup_vs_dense:.3f}x, "
              f"dense->upper-bound gap closed {percent(native.decode_gap_closed)}")
    return _save_tp2(args, result, summary, before, "runtime_cpu_tp2_ladder.json")


# --- (c) domino vs dense at TP=2 --------------------------------------------------------------


def bench_domino(args) -> dict:
    from ladderize.runtime.generate import RuntimeOptions

    result, before = _bench_tp2(args, synthetic_source(args.shape), ("dense", "upper-bound", "domino"),
                                RuntimeOptions(domino_chunks=args.chunks))
    summary = {}
    for batch in args.batch:
        row = next(r for r in result.rows if r.schedule == "domino" and r.batch == batch)
        dense = next(r for r in result.rows if r.schedule == "dense" and r.batch == batch)
        summary[f"batch{batch}"] = {"domino_decode_speedup_vs_dense": row.decode_speedup_vs_dense,
                                    "domino_e2e_speedup_vs_dense": row.e2e_speedup_vs_dense,
                                    "decode_gap_closed": row.decode_gap_closed,
                                    "prefill_speedup_vs_dense": dense.prefill_s / row.prefill_s}
        print(f"batch {batch}: domino x{args.chunks} decode speed-up vs dense {row.decode_speedup_vs_dense:.3f}x "
              f"(gap closed {percent(row.decode_gap_closed)}), prefill {summary[f'batch{batch}']['prefill_speedup_vs_dense']:.3f}x")
    return _save_tp2(args, result, summary, before, "runtime_cpu_tp2_domino.json")


# --- (b) single device: runtime vs transformers generate ---------------------------------------


def _smollm2_path(arg: str | None) -> Path:
    if arg:
        return Path(arg)
    try:
        from ladderize.convert.pull import pull_model
    except ImportError:
        raise SystemExit("pass --checkpoint DIR (a dense SmolLM2-135M safetensors checkpoint)") from None
    return Path(pull_model("smollm2-135m"))


def stock_llama(path: Path, dtype: torch.dtype):
    """transformers' own LlamaForCausalLM on the checkpoint (a dense ladder_llama config is read as Llama)."""
    from transformers import LlamaForCausalLM

    from ladderize.checkpoint.io import plain_llama_config

    raw = json.loads((path / "config.json").read_text())
    if raw.get("model_type") == "ladder_llama":
        if any(mode != "dense" for mode in raw.get("layer_modes") or []):
            raise SystemExit("the transformers baseline needs a dense checkpoint")
        return LlamaForCausalLM.from_pretrained(path, config=plain_llama_config(raw), dtype=dtype).eval()
    return LlamaForCausalLM.from_pretrained(path, dtype=dtype).eval()


def bench_single_device(args) -> dict:
    from ladderize.errors import LadderizeError
    from ladderize.runtime.allreduce import Communicator
    from ladderize.runtime.decode import Decoder, generate_on_rank
    from ladderize.checkpoint.io import load_config
    from ladderize.checkpoint.shapes import ModelShape
    from ladderize.runtime.engine import RankModel
    from ladderize.runtime.kernels import LinearKernel, linear_fn, prepare_weights, resolve_kernel
    from ladderize.runtime.plan import build_plan
    from ladderize.runtime.tp_slicing import SafetensorsSource
    from ladderize.runtime.weights import load_rank_weights

    before = load_average()
    path = _smollm2_path(args.checkpoint)
    torch.set_num_threads(args.threads)
    config = load_config(path)
    layout = config.layout
    dims = ModelShape.from_config(config)
    dtype = getattr(torch, args.dtype)
    prompt = torch.randint(0, dims.vocab_size, (args.batch, args.prompt), generator=torch.Generator().manual_seed(0))
    gen = args.gen
    results: dict[str, dict] = {}

    with torch.inference_mode():
        weights = load_rank_weights(SafetensorsSource(path), dims, layout, 1, 0, dtype)
        model = RankModel(weights, config, Communicator(1), max_positions=args.prompt + gen + 1, linear=args.linear)
        decoder = Decoder(model, build_plan(layout), args.batch, args.prompt + gen + 1)

        def runtime_run(n: int):
            start = time.perf_counter()
            out = generate_on_rank(decoder, prompt, n)  # no EOS ids: exactly `n` tokens, like min_new_tokens
            return time.perf_counter() - start, out

        hf = stock_llama(path, dtype)
        hf.generation_config.pad_token_id = hf.generation_config.eos_token_id

        def hf_run(n: int):
            start = time.perf_counter()
            out = hf.generate(prompt, max_new_tokens=n, min_new_tokens=n, do_sample=False)
            return time.perf_counter() - start, out[:, args.prompt :]

        # the one decode formula (runtime/timing.py), the two engines interleaved so load changes hit both alike
        timed = time_decode({"runtime": runtime_run, "transformers": hf_run}, gen, args.warmup, args.repeats)
        tokens = {name: t["tokens"] for name, t in timed.items()}
        for name, t in timed.items():
            results[name] = {
                "prefill_s": t["prefill_s"],
                "decode_s_per_token": t["decode_s_per_token"],
                "decode_tokens_per_s": args.batch / t["decode_s_per_token"],
                "decode_s_per_token_runs": t["decode_s_per_token_runs"],
            }
        # the floor: one decode step's matrix-vector products alone (every weight byte read once, nothing else),
        # per kernel that can run here; aten (F.linear on the dense weights) is transformers' kernel
        floors = {}
        for kernel in (LinearKernel.ATEN, LinearKernel.ONEDNN, LinearKernel.GEMV):
            try:
                resolve_kernel(kernel, torch.device("cpu"), dtype)
            except LadderizeError:
                continue
            w = model.w if kernel is model.kernel else prepare_weights(weights, kernel)
            floors[kernel.value] = (linear_fn(kernel), [m for lw in w.layers for m in (lw.qkv, lw.o, lw.gate_up, lw.down)] + [w.lm_head])
        matrices = floors["aten"][1]
        inputs = [torch.randn(args.batch, 1, m.shape[1], dtype=dtype) for m in matrices]
        floor_runs: dict[str, list[float]] = {name: [] for name in floors}
        for _ in range(args.repeats):  # interleaved, like the decode runs
            for name, (linear, ms) in floors.items():
                start = time.perf_counter()
                for _ in range(8):
                    for m, x in zip(ms, inputs):
                        linear(x, m)
                floor_runs[name].append((time.perf_counter() - start) / 8)
        weight_bytes = sum(m.numel() * m.element_size() for m in matrices)
    speedup = results["runtime"]["decode_tokens_per_s"] / results["transformers"]["decode_tokens_per_s"]
    same = torch.equal(tokens["runtime"], tokens["transformers"])
    floor_by_kernel = {name: statistics.median(runs) for name, runs in floor_runs.items()}
    floor_s = floor_by_kernel["aten"]
    runtime_floor_s = floor_by_kernel[model.kernel.value]
    for name, value in floor_by_kernel.items():
        print(f"floor ({name}): the matrix-vector products alone take {value * 1e3:.2f} ms per step "
              f"({weight_bytes / 1e6:.0f} MB of weights, {weight_bytes / value / 1e9:.1f} GB/s)")
    for name, r in results.items():
        print(f"{name:<13} prefill {r['prefill_s'] * 1e3:8.1f} ms   decode {r['decode_s_per_token'] * 1e3:7.2f} ms/token   "
              f"{r['decode_tokens_per_s']:7.1f} decode tokens/s")
    print(f"runtime linear kernel: {model.kernel.value}")
    print(f"runtime vs transformers generate: {speedup:.2f}x decode tokens/s; identical greedy tokens: {same}")
    payload = {
        "model": str(path), "dtype": args.dtype, "threads": args.threads, "batch": args.batch, "prompt_len": args.prompt,
        "gen_len": gen, "warmup": args.warmup, "repeats": args.repeats, "results": results,
        "runtime_decode_speedup_vs_transformers": speedup, "identical_greedy_tokens": same, "torch": torch.__version__,
        "linear_kernel": model.kernel.value,
        "gemv_floor_s_per_token": floor_s, "weight_bytes_per_token": weight_bytes,
        "runtime_gemv_floor_s_per_token": runtime_floor_s,
        "gemv_floor_s_per_token_by_kernel": floor_by_kernel,
        "runtime_overhead_above_floor_s": results["runtime"]["decode_s_per_token"] - runtime_floor_s,
        "transformers_overhead_above_floor_s": results["transformers"]["decode_s_per_token"] - floor_s,
        "load_average_before": before, "load_average_after": load_average(), "command": " ".join(sys.argv),
    }
    save(args.out or f"runtime_single_device_smollm2_{args.dtype}.json", payload)
    return payload


# --- stretch: gloo all-reduce latency and how much of it compute can hide ---------------------


def _overlap_job(context: RankContext, hidden: int, batches: list[int], work_sizes: list[int], iters: int, rounds: int) -> list[dict]:
    """Per (batch, MLP width): all-reduce alone, compute alone, the two in series, overlapped, and ladder-pipelined."""
    import torch.distributed as dist
    import torch.nn.functional as F

    rows = []
    for batch in batches:
        for inner in work_sizes:  # an MLP-like shard: [B, D] x [D, 2*inner] then [inner, D]
            gate_up, down = torch.randn(2 * inner, hidden) * 0.02, torch.randn(hidden, inner) * 0.02
            x = torch.randn(batch, 1, hidden)
            messages = [torch.randn(batch, 1, hidden) for _ in range(2)]

            def compute():
                g, u = F.linear(x, gate_up).chunk(2, dim=-1)
                return F.linear(F.silu(g) * u, down)

            def allreduce_only():
                for _ in range(iters):
                    dist.all_reduce(messages[0])

            def compute_only():
                for _ in range(iters):
                    compute()

            def serial():  # dense: blocking all-reduce, then the next module
                for _ in range(iters):
                    dist.all_reduce(messages[0])
                    compute()

            def overlapped():  # one all-reduce in flight behind one module's compute
                for _ in range(iters):
                    work = dist.all_reduce(messages[0], async_op=True)
                    compute()
                    work.wait()

            def ladder():  # the ladder loop: issue k, compute k+1, then wait for k-1 (two in flight)
                pending = None
                for i in range(iters):
                    work = dist.all_reduce(messages[i % 2], async_op=True)
                    compute()
                    if pending is not None:
                        pending.wait()
                    pending = work
                pending.wait()

            compute_estimate = [0.0]

            def overlapped_idle():  # the same, but the "compute" sleeps: the CPU stays free for gloo's threads
                for _ in range(iters):
                    work = dist.all_reduce(messages[0], async_op=True)
                    time.sleep(compute_estimate[0])
                    work.wait()

            def sleep_only():
                for _ in range(iters):
                    time.sleep(compute_estimate[0])

            # calibrate the sleep to this rank's compute time (rank 0's value, so both ranks sleep alike)
            start = time.perf_counter()
            compute_only()
            calibration = torch.tensor([(time.perf_counter() - start) / iters])
            dist.broadcast(calibration, src=0)
            compute_estimate[0] = float(calibration)

            variants = {"allreduce": allreduce_only, "compute": compute_only, "serial": serial, "overlapped": overlapped,
                        "ladder": ladder, "sleep": sleep_only, "overlapped_idle": overlapped_idle}
            samples: dict[str, list[float]] = {name: [] for name in variants}
            for _ in range(rounds):  # interleave variants so load changes hit all of them
                for name, fn in variants.items():
                    dist.barrier()
                    start = time.perf_counter()
                    fn()
                    samples[name].append((time.perf_counter() - start) / iters)
            t = {name: statistics.median(values) for name, values in samples.items()}
            floor = min(t["allreduce"], t["compute"])
            rows.append({
                "batch": batch, "hidden": hidden, "mlp_inner": inner, "message_bytes": batch * hidden * 4,
                **{f"{name}_s": value for name, value in t.items()},
                "hidden_fraction_overlapped": (t["serial"] - t["overlapped"]) / floor if floor else None,
                "hidden_fraction_ladder": (t["serial"] - t["ladder"]) / floor if floor else None,
                # with an idle CPU behind the wait: how much of the all-reduce a sleeping "module" hides
                "hidden_fraction_idle": (t["allreduce"] + t["sleep"] - t["overlapped_idle"]) / min(t["allreduce"], t["sleep"])
                if min(t["allreduce"], t["sleep"]) else None,
                # how much longer compute takes while an all-reduce is in flight (gloo's threads take CPU from it)
                "overlapped_minus_compute_s": t["overlapped"] - t["compute"],
            })
    return rows


def bench_overlap(args) -> dict:
    before = load_average()
    job = functools.partial(_overlap_job, hidden=args.hidden, batches=args.batch, work_sizes=args.inner, iters=args.iters,
                            rounds=args.rounds)
    rows = run_ranks(job, launch_spec(args))
    print(f"{'batch':>5} {'inner':>6} {'AR ms':>7} {'compute ms':>10} {'serial ms':>9} {'overlap ms':>10} "
          f"{'ladder ms':>9} {'idle overlap ms':>15} {'hidden':>7} {'hidden (ladder)':>15} {'hidden (idle CPU)':>17}")
    for r in rows:
        print(f"{r['batch']:>5} {r['mlp_inner']:>6} {r['allreduce_s'] * 1e3:>7.3f} {r['compute_s'] * 1e3:>10.3f} "
              f"{r['serial_s'] * 1e3:>9.3f} {r['overlapped_s'] * 1e3:>10.3f} {r['ladder_s'] * 1e3:>9.3f} "
              f"{r['overlapped_idle_s'] * 1e3:>15.3f} {r['hidden_fraction_overlapped']:>7.0%} "
              f"{r['hidden_fraction_ladder']:>15.0%} {r['hidden_fraction_idle']:>17.0%}")
    payload = {"rows": rows, "threads_per_rank": args.threads_per_rank, "pin_cores": args.pin_cores,
               "comm_nice": args.comm_nice, "load_average_before": before, "load_average_after": load_average(),
               "command": " ".join(sys.argv)}
    save(args.out or "runtime_gloo_overlap.json", payload)
    return payload


def _progress_job(context: RankContext, hidden: int, gap_s: float, iters: int) -> dict:
    """Does an in-flight gloo all-reduce progress while this rank's thread computes, or only while it sleeps?"""
    import torch.distributed as dist

    message = torch.randn(1, 1, hidden)
    results = {}
    for mode in ("blocking", "async_then_sleep", "async_then_busy"):
        issue, wait = [], []
        for _ in range(iters):
            dist.barrier()
            start = time.perf_counter()
            if mode == "blocking":
                dist.all_reduce(message)
                issue.append(time.perf_counter() - start)
                wait.append(0.0)
                continue
            work = dist.all_reduce(message, async_op=True)
            issued = time.perf_counter()
            if mode == "async_then_sleep":
                time.sleep(gap_s)  # the CPU is free for gloo's threads
            else:
                while time.perf_counter() < issued + gap_s:  # busy, like a module computing
                    pass
            before_wait = time.perf_counter()
            work.wait()
            issue.append(issued - start)
            wait.append(time.perf_counter() - before_wait)
        results[mode] = {"issue_s": statistics.median(issue), "wait_s": statistics.median(wait)}
    return results


def bench_progress(args) -> dict:
    before = load_average()
    job = functools.partial(_progress_job, hidden=args.hidden, gap_s=args.gap_ms / 1e3, iters=args.iters)
    rows = run_ranks(job, launch_spec(args))
    print(f"all-reduce of {args.hidden * 4} bytes at TP=2, then {args.gap_ms} ms before waiting:")
    for mode, r in rows.items():
        print(f"{mode:<17} issue {r['issue_s'] * 1e3:7.3f} ms   wait {r['wait_s'] * 1e3:7.3f} ms")
    payload = {"results": rows, "hidden": args.hidden, "gap_ms": args.gap_ms, "iters": args.iters,
               "pin_cores": args.pin_cores, "load_average_before": before, "load_average_after": load_average(),
               "command": " ".join(sys.argv)}
    save(args.out or "runtime_gloo_progress.json", payload)
    return payload


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)

    def common(p, shape="cpu-1024", batch=(1,), prompt=64, gen=32, warmup=2, repeats=5):
        p.add_argument("--shape", default=shape, help="synthetic preset or config.json")
        p.add_argument("--batch", type=lambda s: [int(x) for x in s.split(",")], default=list(batch))
        p.add_argument("--prompt", type=int, default=prompt)
        p.add_argument("--gen", type=int, default=gen)
        p.add_argument("--warmup", type=int, default=warmup)
        p.add_argument("--repeats", type=int, default=repeats)
        p.add_argument("--threads-per-rank", type=int, default=0)
        p.add_argument("--pin-cores", action="store_true", help="bind each rank to its own core")
        p.add_argument("--comm-nice", type=int, default=None, help="nice value of gloo's threads (experimental)")
        p.add_argument("--out", default=None, help="file name under benchmarks/results/")

    common(sub.add_parser("ladder", help="(a) TP=2: ladder vs dense vs upper-bound"), batch=(1, 4))
    domino = sub.add_parser("domino", help="(c) TP=2: domino vs dense at batch >= 4")
    common(domino, batch=(4, 16))
    domino.add_argument("--chunks", type=int, default=2)
    single = sub.add_parser("single-device", help="(b) runtime vs transformers generate on SmolLM2-135M")
    single.add_argument("--checkpoint", default=None)
    single.add_argument("--dtype", default="float32")
    single.add_argument("--threads", type=int, default=2)
    single.add_argument("--batch", type=int, default=1)
    single.add_argument("--prompt", type=int, default=64)
    single.add_argument("--gen", type=int, default=64)
    single.add_argument("--warmup", type=int, default=1)
    single.add_argument("--repeats", type=int, default=5)
    single.add_argument("--linear", default="auto", help="runtime's linear kernel: auto, gemv, onednn or aten")
    single.add_argument("--out", default=None)
    overlap = sub.add_parser("overlap", help="gloo all-reduce latency and how much compute hides it")
    overlap.add_argument("--hidden", type=int, default=512)
    overlap.add_argument("--batch", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4])
    overlap.add_argument("--inner", type=lambda s: [int(x) for x in s.split(",")], default=[128, 384, 768, 1536])
    overlap.add_argument("--iters", type=int, default=50, help="operations per timed loop")
    overlap.add_argument("--rounds", type=int, default=7, help="timed loops per variant (median)")
    overlap.add_argument("--threads-per-rank", type=int, default=0)
    overlap.add_argument("--pin-cores", action="store_true", help="bind each rank to its own core")
    overlap.add_argument("--comm-nice", type=int, default=None, help="nice value of gloo's threads (experimental)")
    overlap.add_argument("--out", default=None)
    progress = sub.add_parser("progress", help="does an async gloo all-reduce progress while the rank computes?")
    progress.add_argument("--hidden", type=int, default=512)
    progress.add_argument("--gap-ms", type=float, default=2.0)
    progress.add_argument("--iters", type=int, default=300)
    progress.add_argument("--threads-per-rank", type=int, default=0)
    progress.add_argument("--pin-cores", action="store_true")
    progress.add_argument("--comm-nice", type=int, default=None)
    progress.add_argument("--out", default=None)
    sub.add_parser("all", help="ladder, domino, overlap (and single-device when a checkpoint is available)")
    args = parser.parse_args()
    if args.what == "all":
        import subprocess

        for what in ("ladder", "domino", "overlap", "progress", "single-device"):
            subprocess.run([sys.executable, __file__, what], check=True)
        return
    commands = {"ladder": bench_ladder, "domino": bench_domino, "single-device": bench_single_device,
                "overlap": bench_overlap, "progress": bench_progress}
    commands[args.what](args)


if __name__ == "__main__":
    main()
