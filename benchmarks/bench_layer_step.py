"""Benchmark: one converted layer's training step, eager against compiled (``adapt --compile``), side by side.

    python benchmarks/bench_layer_step.py CKPT --cpu 0     # CKPT: a converted checkpoint, e.g. ladder 15-29 of SmolLM2

The step is what the sequential stage runs (``layer_training.train_layer``): the layer's forward on a batch of
``--batch x --seq`` states at the run's precision (bf16 autocast where the CPU multiplies bf16), a loss, the
backward, gradient clipping and the fused AdamW step. Three copies of the first converted layer run alternately
``--repeats`` times after ``--warmup`` untimed steps each, on one core with one thread: eager, through
``compilation.compile_layers`` (``compiled``: its attention's backward ``causal_attention``'s, fused by Inductor), and
compiled with the stock SDPA kernel's backward (``compiled_sdpa``); the JSON records each part's median milliseconds
(forward, backward, clip, optimizer) and the ratios of the totals. Beside it, the attention core alone (``scaled_dot_product_attention``, causal, at the
layer's head shapes) forward + backward, against the plain matmul-softmax form, to show what compiling cannot fuse
away. Saves results/bench_layer_step.json.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

RESULTS = Path(__file__).parent / "results"
PARTS = ("forward", "backward", "clip", "optimizer")


def step_parts(layer, params, optimizer, states, kwargs, precision) -> dict[str, float]:
    """One training step of ``layer``, each part's seconds."""
    times, start = {}, time.perf_counter()
    with precision.context(torch.device("cpu")):
        out = layer(*states, **kwargs)
        loss = sum(tensor.float().square().mean() for tensor in out)
    times["forward"], start = time.perf_counter() - start, time.perf_counter()
    loss.backward()
    times["backward"], start = time.perf_counter() - start, time.perf_counter()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    times["clip"], start = time.perf_counter() - start, time.perf_counter()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    times["optimizer"] = time.perf_counter() - start
    return times


def attention_ms(batch: int, heads: int, seq: int, head_dim: int, dtype: torch.dtype, repeats: int) -> dict[str, float]:
    """Median forward + backward milliseconds of causal attention: torch's fused kernel and the plain form."""
    causal = torch.ones(seq, seq, dtype=torch.bool).triu(1)

    def plain(q, k, v):
        scores = (q @ k.transpose(-1, -2) * head_dim**-0.5).masked_fill(causal, float("-inf"))
        return torch.softmax(scores.float(), -1).to(q.dtype) @ v

    def fused(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    result = {}
    for name, fn in (("fused", fused), ("plain", plain)):
        q, k, v = (torch.randn(batch, heads, seq, head_dim, dtype=dtype, requires_grad=True) for _ in range(3))
        grad = torch.randn(batch, heads, seq, head_dim, dtype=dtype)
        times = []
        for index in range(repeats + 2):
            start = time.perf_counter()
            fn(q, k, v).backward(grad)
            if index >= 2:
                times.append(time.perf_counter() - start)
        result[name] = round(statistics.median(times) * 1e3, 2)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", type=Path, help="a converted checkpoint (its first converted layer is timed)")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--cpu", type=int, default=0, help="the core it runs on, with one thread")
    parser.add_argument("--json", type=Path, default=RESULTS / "bench_layer_step.json")
    args = parser.parse_args()
    os.sched_setaffinity(0, {args.cpu})
    torch.set_num_threads(1)

    from ladderize.adapt.train.compilation import adamw, compile_layers
    from ladderize.adapt.layers.layer_source import StreamedLayers
    from ladderize.convert.residual_states import attention_kwargs
    from ladderize.checkpoint.atomic import write_json
    from ladderize.checkpoint.io import load_config
    from ladderize.checkpoint.placement import training_precision

    cpu = torch.device("cpu")
    first = min(load_config(args.checkpoint).layout.converted_layers)
    source = StreamedLayers(str(args.checkpoint), torch.float32, cpu)
    precision = training_precision(None, cpu, None)
    config = source.model.config
    generator = torch.Generator().manual_seed(0)
    states = tuple(torch.randn(args.batch, args.seq, config.hidden_size, generator=generator) for _ in range(2))
    kwargs = attention_kwargs(source.model, args.batch, args.seq, torch.float32, cpu)
    with source.layer(first) as layer:
        runs = {name: copy.deepcopy(layer) for name in ("eager", "compiled", "compiled_sdpa")}
    compile_layers([runs["compiled"], runs["compiled_sdpa"]], "cpu")
    runs["compiled_sdpa"].self_attn.attention_function = None  # the stock SDPA kernel's backward (before its first call)
    setups = {}
    for name, module in runs.items():
        module.requires_grad_(True)
        params = list(module.parameters())
        setups[name] = (module, params, adamw(params, lr=1e-12))
    samples: dict[str, list[dict[str, float]]] = {name: [] for name in runs}
    for index in range(args.warmup + args.repeats):
        for name, setup in setups.items():  # alternately, so that the machine's drift reaches both alike
            parts = step_parts(*setup, states, kwargs, precision)
            if index >= args.warmup:
                samples[name].append(parts)
    median = {name: {part: round(statistics.median(s[part] for s in runs_) * 1e3, 2) for part in PARTS}
              for name, runs_ in samples.items()}
    totals = {name: round(statistics.median(sum(s.values()) for s in runs_) * 1e3, 2) for name, runs_ in samples.items()}
    heads, head_dim = config.num_attention_heads, config.hidden_size // config.num_attention_heads
    result = {
        "checkpoint": str(args.checkpoint), "layer": first, "batch": args.batch, "seq": args.seq, "cpu": args.cpu,
        "threads": 1, "precision": precision.mixed_precision if precision.autocast is not None else "float32",
        "repeats": args.repeats, "torch": torch.__version__, "step_ms": median, "total_ms": totals,
        "eager_over_compiled": round(totals["eager"] / totals["compiled"], 3),
        "compiled_sdpa_over_compiled": round(totals["compiled_sdpa"] / totals["compiled"], 3),
        "attention_fwd_bwd_ms": attention_ms(args.batch, heads, args.seq, head_dim,
                                             torch.bfloat16 if precision.autocast is not None else torch.float32, args.repeats),
    }
    write_json(args.json, result)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
