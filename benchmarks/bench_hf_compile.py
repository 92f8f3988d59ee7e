"""Benchmark torch.compile on the HF model: a training step and HF generate, eager against compiled, per layout.

A small random Llama shape (default hidden 256, 6 layers, 8 query / 4 KV heads) as transformers' own
Llama (the anchor), as ladderize's dense model with the same weights, and as a hybrid (ladder on the
upper half, SPD at TP 2 on the lower half). Per layout it reports the graphs and breaks
``torch._dynamo.explain`` finds, then:

- train: AdamW steps on random tokens (batch x seq), the median step time eager and compiled
  (``torch.compile(model)``, inductor), the compile time (first compiled step), and the first loss of each;
- generate: greedy HF ``generate`` with a static cache, eager and with transformers' own compilation
  (``compile_config=CompileConfig(fullgraph=True)``, allowed on the CPU), tokens/s and whether the tokens agree.

Eager and compiled calls alternate (``interleaved``), so a load that drifts on a shared machine meets both.

    python benchmarks/bench_hf_compile.py [--hidden 256 --layers 6] [--json benchmarks/results/hf_compile.json]
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def build(layout: dict | None, args) -> "torch.nn.Module":
    """The ladderize model of ``layout``; ``None``: transformers' own LlamaForCausalLM with the dense model's weights."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from ladderize.model import LadderLlamaConfig, LadderLlamaForCausalLM

    if layout is None:
        dense = build({}, args)
        llama = LlamaForCausalLM(LlamaConfig(**{k: v for k, v in dense.config.to_dict().items() if k in LlamaConfig().to_dict()}))
        llama.load_state_dict(dense.state_dict(), strict=True)
        return llama
    torch.manual_seed(0)
    config = LadderLlamaConfig(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.hidden * 3, num_hidden_layers=args.layers,
        num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=1024, tie_word_embeddings=False,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, **layout)  # fmt: skip
    return LadderLlamaForCausalLM(config)


def graphs_and_breaks(model, ids) -> dict[str, int]:
    import torch._dynamo as dynamo

    dynamo.reset()
    explained = dynamo.explain(model)(ids, use_cache=False)
    return {"graphs": explained.graph_count, "breaks": explained.graph_break_count}


def interleaved(runs: dict[str, Callable[[], Any]], repeats: int) -> tuple[dict[str, float], dict[str, float], dict]:
    """Time each run once (its warm-up: the compile, when compiled), then ``repeats`` rounds that run
    each once in turn, so that a load that drifts meets every run alike. Returns the first call's
    seconds, the median seconds, and each first call's result."""
    first_s, firsts, times = {}, {}, {name: [] for name in runs}
    for name, run in runs.items():
        start = time.perf_counter()
        firsts[name] = run()
        first_s[name] = time.perf_counter() - start
    for _ in range(repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    return first_s, {name: statistics.median(t) for name, t in times.items()}, firsts


def training_step(model, ids, compiled: bool) -> Callable[[], float]:
    """One AdamW step on a copy of ``model`` (compiled with ``torch.compile``, inductor, or eager); returns the loss."""
    import torch

    model = copy.deepcopy(model).train()
    forward = torch.compile(model) if compiled else model
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> float:
        loss = forward(ids, labels=ids, use_cache=False).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.item()

    return step


def generation(model, prompt, new_tokens: int, compiled: bool) -> Callable[[], list[int]]:
    """Greedy HF ``generate`` with a static cache on a copy of ``model``: eager, or compiled by transformers
    (``compile_config``, fullgraph); returns the new tokens."""
    from transformers import CompileConfig

    model = copy.deepcopy(model).eval()
    options = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, cache_implementation="static",
                   pad_token_id=0)
    if compiled:
        config = CompileConfig(fullgraph=True, mode="default")
        config._compile_all_devices = True  # transformers compiles only on accelerators unless asked
        options["compile_config"] = config
    else:
        options["disable_compile"] = True
    return lambda: model.generate(prompt, **options)[0, prompt.shape[1]:].tolist()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--vocab", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, default=Path("benchmarks/results/hf_compile.json"))
    args = parser.parse_args()

    import torch

    from ladderize.runtime.timing import load_average

    torch.set_num_threads(args.threads)
    half = args.layers // 2
    layouts = {
        "llama": None,  # the anchor: transformers' Llama, same weights as dense
        "dense": {},
        "hybrid": dict(layer_modes=["spd"] * half + ["ladder"] * (args.layers - half), spd_tp_size=2),
    }
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, args.vocab, (args.batch, args.seq), generator=generator)
    prompt = torch.randint(3, args.vocab, (1, args.prompt), generator=generator)
    rows = {}
    load_before = load_average()
    for name, layout in layouts.items():
        model = build(layout, args)
        layout_name = "transformers LlamaForCausalLM" if layout is None else model.config.layout.describe()
        row = {"layout": layout_name, **graphs_and_breaks(model, ids)}
        first_s, step_s, losses = interleaved({c: training_step(model, ids, c) for c in (False, True)}, args.steps)
        row["train"] = {"eager_step_s": step_s[False], "compiled_step_s": step_s[True], "compile_s": first_s[True],
                        "speedup": step_s[False] / step_s[True], "first_loss_diff": abs(losses[False] - losses[True])}
        runs = {c: generation(model, prompt, args.new_tokens, c) for c in (False, True)}
        first_s, call_s, tokens = interleaved(runs, args.repeats)
        rate = {c: args.new_tokens / call_s[c] for c in (False, True)}
        row["generate"] = {"eager_tokens_per_s": rate[False], "compiled_tokens_per_s": rate[True],
                           "compile_s": first_s[True], "speedup": rate[True] / rate[False],
                           "same_tokens": tokens[False] == tokens[True]}
        rows[name] = row
        train, gen = row["train"], row["generate"]
        print(f"{name:6s} {row['layout']:30s} graphs {row['graphs']} breaks {row['breaks']} | "
              f"train step eager {train['eager_step_s'] * 1e3:6.1f} ms compiled {train['compiled_step_s'] * 1e3:6.1f} ms "
              f"x{train['speedup']:.2f} (compile {train['compile_s']:.0f} s, loss diff {train['first_loss_diff']:.1e}) | "
              f"generate eager {gen['eager_tokens_per_s']:6.1f} tok/s compiled {gen['compiled_tokens_per_s']:6.1f} tok/s "
              f"x{gen['speedup']:.2f} (compile {gen['compile_s']:.0f} s, same tokens {gen['same_tokens']})", flush=True)
    result = {
        "command": "python benchmarks/bench_hf_compile.py " + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()),
        "torch": torch.__version__, "machine": platform.machine(), "threads": args.threads,
        "load_average_before": load_before, "load_average_after": load_average(),
        "shape": {k: getattr(args, k) for k in ("hidden", "layers", "vocab", "batch", "seq", "prompt", "new_tokens")},
        "layouts": rows,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
