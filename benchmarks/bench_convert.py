"""Benchmark `ladderize convert`: wall time and peak RSS against a plain copy of the same bytes.

Cases: the real SmolLM2-135M (one 538 MB shard) and a synthetic Llama of about 2 GB in
four ~500 MB fp16 shards. Each step runs in its own subprocess so its peak RSS is its own.

    python benchmarks/bench_convert.py [--synthetic-gb 2.0] [--json benchmarks/results/convert.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONVERT = """
import sys
from ladderize.convert.conversion import convert_checkpoint
convert_checkpoint(sys.argv[1], sys.argv[2], ladder="-8:", spd="0:4", spd_tp_size=1, max_shard_bytes=500_000_000)
"""
COPY = "import shutil, sys; shutil.copytree(sys.argv[1], sys.argv[2])"


def run_measured(code: str, *args: str) -> dict[str, float]:
    """Run python code in a fresh process; return wall seconds and that process's own peak RSS."""
    report = "\nimport resource; print('PEAK_RSS_KIB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code + report, *args], check=True, capture_output=True, text=True)
    wall_s = time.perf_counter() - start
    peak_kib = int(done.stdout.split("PEAK_RSS_KIB")[-1])
    return {"wall_s": round(wall_s, 3), "peak_rss_mb": round(peak_kib / 1024, 1)}


def make_synthetic(directory: Path, target_gb: float) -> dict[str, int]:
    """Write a random Llama-shaped fp16 checkpoint of about ``target_gb`` GB in ~500 MB shards.

    Through ``write_checkpoint`` (its shard writer and index), the tensor names from ``architectures``'
    table; one shard's tensors are in memory at a time.
    """
    import torch

    from ladderize.checkpoint.architectures import expected_tensors
    from ladderize.checkpoint.io import plain_llama_config, write_checkpoint

    hidden, inner, heads, kv, vocab = 2048, 5632, 16, 4, 32000
    per_layer = 2 * hidden * hidden + 2 * hidden * (hidden // heads * kv) + 3 * hidden * inner + 2 * hidden
    layers = max(1, int((target_gb * 1e9 / 2 - 2 * vocab * hidden) / per_layer))
    values = dict(hidden_size=hidden, intermediate_size=inner, num_attention_heads=heads, num_key_value_heads=kv,
                  num_hidden_layers=layers, vocab_size=vocab, dtype="float16")  # fmt: skip
    kv_dim = hidden // heads * kv
    shapes = {"embed_tokens": (vocab, hidden), "lm_head": (vocab, hidden), "norm": (hidden,), "layernorm": (hidden,),
              "q_proj": (hidden, hidden), "k_proj": (kv_dim, hidden), "v_proj": (kv_dim, hidden), "o_proj": (hidden, hidden),
              "gate_proj": (inner, hidden), "up_proj": (inner, hidden), "down_proj": (hidden, inner)}  # fmt: skip
    total = 0

    def tensors():
        nonlocal total
        for name in expected_tensors(values):
            module = name.split(".")[-2]  # q_proj, input_layernorm, norm, embed_tokens, lm_head
            tensor = torch.randn(shapes["layernorm" if module.endswith("layernorm") else module], dtype=torch.float16) * 0.02
            total += tensor.numel() * 2
            yield name, tensor

    write_checkpoint(directory, plain_llama_config(values), tensors(), max_shard_bytes=500_000_000)
    return {"layers": layers, "shards": len(list(directory.glob("*.safetensors"))), "bytes": total}


def bench_case(name: str, src: Path, work: Path) -> dict:
    copy = run_measured(COPY, str(src), str(work / f"{name}-copy"))
    convert = run_measured(CONVERT, str(src), str(work / f"{name}-converted"))
    nbytes = sum(p.stat().st_size for p in src.glob("*.safetensors"))
    largest = max(p.stat().st_size for p in src.glob("*.safetensors"))
    shutil.rmtree(work / f"{name}-copy")
    shutil.rmtree(work / f"{name}-converted")
    return {
        "case": name,
        "weight_bytes": nbytes,
        "largest_shard_bytes": largest,
        "copy": copy,
        "convert": convert,
        "convert_over_copy_time": round(convert["wall_s"] / copy["wall_s"], 2),
        "convert_peak_rss_over_largest_shard": round(convert["peak_rss_mb"] * 2**20 / largest, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--synthetic-gb", type=float, default=2.0)
    parser.add_argument("--json", type=Path, default=Path("benchmarks/results/convert.json"))
    args = parser.parse_args()

    from ladderize.convert.pull import pull_model

    smollm2 = pull_model("smollm2-135m")
    baseline = run_measured("import ladderize.checkpoint.io")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-convert-", dir=Path.home()) as tmp:
        work = Path(tmp)
        synthetic = work / "synthetic-src"
        shape = make_synthetic(synthetic, args.synthetic_gb)
        rows.append(bench_case("smollm2-135m", smollm2, work))
        rows.append({**bench_case(f"synthetic-{args.synthetic_gb:g}gb", synthetic, work), "synthetic": shape})
    result = {"import_baseline": baseline, "machine": {"cpus": __import__("os").cpu_count(), "python": platform.python_version()}, "rows": rows}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'case':<18} {'GB':>6} {'copy s':>8} {'convert s':>10} {'ratio':>6} {'peak RSS MB':>12} {'largest shard MB':>17}")
    for row in rows:
        print(
            f"{row['case']:<18} {row['weight_bytes'] / 1e9:>6.2f} {row['copy']['wall_s']:>8.2f} "
            f"{row['convert']['wall_s']:>10.2f} {row['convert_over_copy_time']:>6.2f} "
            f"{row['convert']['peak_rss_mb']:>12.0f} {row['largest_shard_bytes'] / 2**20:>17.0f}"
        )
    print(f"baseline (python + torch + transformers import): {baseline['wall_s']:.2f} s, {baseline['peak_rss_mb']:.0f} MB RSS")
    print(f"saved {args.json}")


if __name__ == "__main__":
    main()
