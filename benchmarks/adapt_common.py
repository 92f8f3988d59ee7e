"""Shared pieces of the adaptation benchmarks: evaluation, multi-phase recipes, JSON + PNG output."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import ladderize  # noqa: E402,F401
from ladderize.eval.perplexity import perplexity, shared_data_dir, wikitext2_ids  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
WORK = Path(os.environ.get("ADAPT_BENCH_WORK", "/tmp/adapt_bench"))


def parse_args(parser) -> "argparse.Namespace":
    """Add ``--threads``, parse, seed torch and set its thread count (0 keeps torch's default)."""
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default); pin with taskset to share the CPU")
    args = parser.parse_args()
    torch.manual_seed(0)
    if args.threads:
        torch.set_num_threads(args.threads)
    return args


def named_checkpoints(items: list[str]) -> list[tuple[str, str]]:
    """``NAME=CKPT`` command-line items as (name, path) pairs; a one-line exit on any other form, or where a CKPT is
    not a checkpoint folder (no ``config.json``)."""
    if any("=" not in item for item in items):
        raise SystemExit("checkpoints are given as NAME=CKPT")
    named = [tuple(item.split("=", 1)) for item in items]
    if missing := [path for _, path in named if not (Path(path) / "config.json").is_file()]:
        raise SystemExit(f"not a checkpoint folder (no config.json): {', '.join(missing)}")
    return named


def dense_source() -> Path:
    """The dense SmolLM2-135M checkpoint: $ADAPT_BENCH_DENSE, else ``ladderize pull``'s cache."""
    if os.environ.get("ADAPT_BENCH_DENSE"):
        return Path(os.environ["ADAPT_BENCH_DENSE"])
    from ladderize.convert.pull import pull_model

    return pull_model("smollm2-135m")


def lambada_samples(model, tokenizer, limit: int | None = 500, batch_size: int = 16) -> list[dict]:
    """lm-eval's ``lambada_openai`` samples of the first ``limit`` passages (all with None) in file order, through the
    product's evaluation (``ladderize eval``'s ``evaluate_model``): each has ``acc`` (greedy decoding gets every token
    of the last word) and ``perplexity`` (the last word's log-likelihood, which lm-eval aggregates as exp(-mean))."""
    from ladderize.eval.harness import evaluate_model

    model.eval()
    output = evaluate_model(model, tokenizer, "lambada_openai", limit=limit, batch_size=batch_size,
                            data_dir=shared_data_dir(), bootstrap_iters=0, log_samples=True)
    return sorted(output["samples"]["lambada_openai"], key=lambda sample: sample["doc_id"])


def lambada_hits(model, tokenizer, limit: int | None = 500, batch_size: int = 16) -> list[bool]:
    """Per passage of LAMBADA (OpenAI), lm-eval's ``lambada_openai`` ``acc``; hits are in file order (``lambada_samples``)."""
    return [bool(sample["acc"]) for sample in lambada_samples(model, tokenizer, limit, batch_size)]


def mean_se(values: list[float]) -> tuple[float, float]:
    """Mean and its standard error (sample standard deviation / sqrt(n))."""
    n = len(values)
    mean = sum(values) / n
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n) if n > 1 else float("nan")


def paired(hits: str, dense_hits: str) -> tuple[float, float] | tuple[None, None]:
    """Mean and standard error of the passage-by-passage difference of two hit strings (``0``/``1``, the same
    passages in the same order; None when their lengths differ)."""
    if len(hits) != len(dense_hits):
        return None, None
    return mean_se([int(a) - int(b) for a, b in zip(hits, dense_hits)])


def lambada_accuracy(model, tokenizer, limit: int = 500, batch_size: int = 16) -> float:
    """LAMBADA (OpenAI) last-word accuracy on the first ``limit`` passages (see ``lambada_hits``)."""
    hits = lambada_hits(model, tokenizer, limit, batch_size)
    return sum(hits) / len(hits)


def evaluate(model, tokenizer, lambada_limit: int, ppl_ids: torch.Tensor) -> dict:
    started = time.perf_counter()
    result = {"wikitext2_ppl": perplexity(model, ppl_ids, seq_len=512, num_sequences=16)}
    if lambada_limit:
        result["lambada_acc"] = lambada_accuracy(model, tokenizer, lambada_limit)
        result["lambada_n"] = lambada_limit
    result["eval_s"] = round(time.perf_counter() - started, 1)
    return result


def stage_of(phase: dict):
    """A benchmark phase (AdaptConfig overrides) as a stage of the product's recipes (``ladderize.adapt.recipe_run``)."""
    from ladderize.adapt.plan.stages import Stage

    if phase.get("local_schedule") == "sequential":
        name = "seq-local"
    else:
        name = {"kd": "kd", "lm": "lm"}.get(phase.get("objectives", "local"), "local")
    return Stage(name, dict(phase))


def run_recipe(name: str, checkpoint: Path, phases: "list[dict] | str", eval_every_tokens: int, lambada_limit: int, tokenizer, base: dict, work: Path = WORK) -> dict:
    """Run a recipe with the product's staged runner (``ladderize.adapt.recipe_run.run_recipe``), evaluating every
    ``eval_every_tokens`` and at the end of each stage.

    ``phases``: the stages' settings (AdaptConfig overrides, on top of ``base``), or the name of a built-in
    recipe (``"best"``: the stages and learning rates ``ladderize adapt`` runs by default).
    """
    from ladderize.adapt.plan.stages import Recipe, load_recipe
    from ladderize.adapt.plan.adapt_plan import build_plan
    from ladderize.adapt.plan.config import GivenSettings
    from ladderize.adapt.recipe_run import RunOptions, run_recipe as run_stages
    from ladderize.checkpoint.io import load_model

    if isinstance(phases, str):  # a built-in recipe keeps its own stage settings; the benchmark gives the data
        recipe = load_recipe(phases)
        base = {k: v for k, v in base.items() if k in ("data", "seq_len", "save_every")}
    else:
        recipe = Recipe(name, [stage_of(p) for p in phases])
    ppl_ids = wikitext2_ids(tokenizer, 512, 16)
    points = []
    start_model = load_model(checkpoint)
    points.append({"phase": "zero-shot", "tokens": 0, "train_s": 0.0, "cpu_s": 0.0, **evaluate(start_model, tokenizer, lambada_limit, ppl_ids)})
    del start_model
    offsets = {"tokens": 0, "train_s": 0.0, "cpu_s": 0.0}
    stage_now: dict = {}
    next_eval = [eval_every_tokens]

    plan: list[dict] = []

    def on_stage_start(line: str) -> None:
        print(line, flush=True)
        next_eval[0] = eval_every_tokens
        stage_now.clear()
        stage_now.update(plan[len(stages_done)])

    def on_step(info, model):
        # a sequential stage is only meaningful once every layer is trained: no evaluation inside it
        if eval_every_tokens and info.layer is None and info.tokens >= next_eval[0] and info.tokens < info.total_tokens:
            next_eval[0] += eval_every_tokens
            model.eval()
            points.append({"phase": stage_now.get("objectives"), "tokens": offsets["tokens"] + info.tokens, "train_s": offsets["train_s"] + info.train_s,
                           "cpu_s": None, "loss": info.losses["total"], **evaluate(model, tokenizer, 0, ppl_ids)})
            model.train()
            print(json.dumps(points[-1]), flush=True)

    def on_plan(planned):
        plan.extend(planned.steps)
        for step in planned.steps:
            print("plan", json.dumps(step), flush=True)

    stages_done: list[dict] = []

    def on_stage_end(stage, result, out):
        model = load_model(out)
        offsets["tokens"] += result.tokens
        offsets["train_s"] += result.train_s
        offsets["cpu_s"] += result.curve[-1]["cpu_s"]
        points.append({"phase": stage.resolved.objective.objectives, "tokens": offsets["tokens"], "train_s": offsets["train_s"], "cpu_s": offsets["cpu_s"],
                       "loss": result.curve[-1]["loss_total"], **evaluate(model, tokenizer, lambada_limit, ppl_ids)})
        print(json.dumps(points[-1]), flush=True)
        stages_done.append({**stage.settings, "checkpoint": str(out)})

    # one folder per benchmark tag: recipes of other tags keep theirs; the stage checkpoints stay in OUT.adapt-run
    out = work / f"{name}-final"
    planned = build_plan(checkpoint, shared=GivenSettings.of(base), recipe=recipe, say=print)
    outcome = run_stages(planned, out, RunOptions(force=True, keep_stages=True, progress=on_step, on_message=print,
                                                  on_plan=on_plan, on_stage_start=on_stage_start,
                                                  on_stage_end=on_stage_end))
    return {"recipe": name, "product_recipe": recipe.name, "phases": stages_done, "points": points, "final_checkpoint": str(outcome.out)}


def plot(results: list[dict], dense: dict, zero_shot_ppl: float, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for result in results:
        pts = result["points"]
        axes[0].plot([p["train_s"] / 60 for p in pts], [p["wikitext2_ppl"] for p in pts], marker="o", label=result["recipe"])
        lam = [p for p in pts if "lambada_acc" in p]
        axes[1].plot([p["train_s"] / 60 for p in lam], [100 * p["lambada_acc"] for p in lam], marker="o", label=result["recipe"])
    axes[0].axhline(dense["wikitext2_ppl"], color="k", ls="--", label="dense")
    axes[0].axhline(dense["wikitext2_ppl"] + 0.05 * (zero_shot_ppl - dense["wikitext2_ppl"]), color="g", ls=":", label="95% of gap closed")
    axes[0].set_yscale("log")
    axes[0].set_xlabel("adaptation wall time (min; threads and cores in the JSON)")
    axes[0].set_ylabel("WikiText-2 valid perplexity (16 x 512)")
    axes[1].axhline(100 * dense["lambada_acc"], color="k", ls="--", label="dense")
    axes[1].set_xlabel("adaptation wall time (min)")
    axes[1].set_ylabel(f"LAMBADA accuracy, first {dense.get('lambada_n')} (%)")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
