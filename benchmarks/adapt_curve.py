"""Recovery per compute: the product's ``ladderize adapt --budget`` on SmolLM2-135M layouts, one point per budget.

    python benchmarks/adapt_curve.py --points ladder15-29@5m,ladder15-29@15m,spd3-half@15m
    python benchmarks/adapt_curve.py --points ladder15-29@15m:lr2 --variant 'lr2=--stage seq-local:lr=2e-3 --stage kd'
    python benchmarks/adapt_curve.py --points dense,spd3-half-zero-shot --lambada 20   # references only
    python benchmarks/adapt_curve.py --plot

Each layout is converted once (``ladderize convert DENSE WORK/LAYOUT ...``). Each point
``LAYOUT@BUDGET[:VARIANT]`` runs ``ladderize adapt WORK/LAYOUT OUT --data wikitext2-heldout
--budget BUDGET --force`` (plus the layout's and the variant's flags; ``LAYOUT@default``: no ``--budget``) as a
child pinned to one core (``taskset -c CPU``, one thread), timed in wall and CPU seconds (the child's user + system).
The adapted checkpoint, and once each ``dense`` and ``LAYOUT-zero-shot`` (the converted checkpoint
before adapt), are scored here, on the same core with one thread:

- WikiText-2 valid-window perplexity (16 x 512, ``perplexity``) and the share of the
  zero-shot-to-dense gap it closes;
- LAMBADA (OpenAI) accuracy on the first ``--lambada`` passages with its standard error, the
  paired difference to dense with its standard error, and lm-eval's LAMBADA perplexity;
- ``teacher_agreement`` with the dense model on the same window (KL, top-1, gap by position).

One JSON per point in ``results/adapt_curve/`` (written by rename; an existing one is skipped
unless ``--force``, so a killed run resumes). ``--plot`` gathers them into
``results/adapt_curve.json`` and ``.png`` and prints a markdown table.

``--device cuda`` runs the same on a GPU: adapt gets ``--device cuda`` (its ``--budget`` then times the GPU), nothing
is pinned, the scoring runs there in the checkpoint's dtype, and the JSONs go to ``--results DIR`` (the GPU check's
``adapt_curve`` step: ``benchmarks/gpu_check.py``).
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import re
import resource
import shlex
import subprocess
import sys
import time
from pathlib import Path

import torch

from adapt_common import RESULTS, dense_source, lambada_samples, mean_se, paired
from ladderize.checkpoint.atomic import write_json
from ladderize.checkpoint.io import read_provenance

CURVE = RESULTS / "adapt_curve"
WORK = Path(os.environ.get("ADAPT_BENCH_WORK", "/tmp/adapt_bench/curve"))
DATA = "wikitext2-heldout"
# ladderize convert flags and ladderize adapt flags per layout. spd3-half: the 15 blocks that sensitivity on
# held-out WikiText picked (docs/adapt-measurements.md, "SPD at TP=3 on 15 blocks"), heads grouped on the adapt data.
LAYOUTS = {
    "ladder15-29": (["--ladder", "15:30"], []),
    "ladder10-29": (["--ladder", "10:30"], []),
    "spd3-half": (["--spd", "6:10,12:13,18:19,20:29", "--spd-tp", "3"], ["--head-grouping"]),
}
TAIL_LINES = 40
ZERO_SHOT = "-zero-shot"
PLAN_PREFIXES = ("budget ", "planned wall time")  # the lines adapt --budget prints its plan on
DEFAULT_BUDGET = "default"  # LAYOUT@default: adapt without --budget (the recipe as it is)


def parse_point(spec: str, variants: dict[str, list[str]]) -> dict:
    """``LAYOUT@BUDGET[:VARIANT]``, ``dense`` or ``LAYOUT-zero-shot`` as a point (a one-line exit on anything else)."""
    if spec == "dense" or (spec.endswith(ZERO_SHOT) and spec.removesuffix(ZERO_SHOT) in LAYOUTS):
        return {"name": spec, "kind": "reference", "layout": spec.removesuffix(ZERO_SHOT) if spec != "dense" else None}
    layout, _, rest = spec.partition("@")
    budget, _, variant = rest.partition(":")
    if layout not in LAYOUTS or not budget:
        raise SystemExit(f"point {spec!r}: expected LAYOUT@BUDGET[:VARIANT] with LAYOUT one of {', '.join(LAYOUTS)}")
    if variant and variant not in variants:
        raise SystemExit(f"point {spec!r}: no --variant {variant}=FLAGS given")
    return {"name": spec, "kind": "point", "layout": layout, "budget": budget, "variant": variant or None,
            "variant_flags": variants.get(variant, [])}


def ladderize_command() -> list[str]:
    """The product's console script beside this interpreter, else ``python -m ladderize.cli``."""
    script = Path(sys.executable).parent / "ladderize"
    return [str(script)] if script.exists() else [sys.executable, "-m", "ladderize.cli"]


def run_pinned(args: list[str], cpu: int | None, log: Path) -> dict:
    """Run ``ladderize ARGS`` on core ``cpu`` with one thread (``None``: unpinned, as on a GPU machine); wall and CPU
    seconds and the last lines of its output."""
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    if cpu is not None:
        env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    command = [*(["taskset", "-c", str(cpu)] if cpu is not None else []), *ladderize_command(), *args]
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    plan: list[str] = []  # what --budget planned (the first lines; the tail loses them on long runs)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    with open(log, "w") as out, subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env) as child:
        for line in child.stdout:
            out.write(line)
            tail.append(line.rstrip("\n"))
            if line.startswith(PLAN_PREFIXES):
                plan.append(line.rstrip("\n"))
            print("  |", line, end="", flush=True)
    wall_s = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if child.returncode:
        raise SystemExit(f"ladderize {shlex.join(args)} failed with exit code {child.returncode} (log: {log})")
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"command": shlex.join(["ladderize", *args]), "cpu_core": cpu, "wall_s": round(wall_s, 1), "cpu_s": round(cpu_s, 1),
            "plan": plan, "stdout_tail": list(tail)}


def converted(layout: str, dense: Path, work: Path, cpu: int | None) -> tuple[Path, dict | None]:
    """The zero-shot checkpoint of ``layout`` (converted once into ``work``) and the conversion's run record when made now."""
    path = work / layout
    if path.exists():
        return path, None
    work.mkdir(parents=True, exist_ok=True)
    return path, run_pinned(["convert", str(dense), str(path), *LAYOUTS[layout][0]], cpu, work / f"{layout}.convert.log")


def lambada_scores(model, tokenizer, limit: int | None, batch_size: int = 16) -> tuple[list[bool], float]:
    """Per-passage hits and lm-eval's ``perplexity`` of ``lambada_openai`` (exp(-mean) of the last words'
    log-likelihoods) from one evaluation."""
    samples = lambada_samples(model, tokenizer, limit, batch_size)
    loglikelihoods = [float(sample["perplexity"]) for sample in samples]
    return [bool(sample["acc"]) for sample in samples], math.exp(-sum(loglikelihoods) / len(loglikelihoods))


def score(model, tokenizer, teacher, ids: torch.Tensor, lambada: int) -> dict:
    """Perplexity on ``ids``, LAMBADA on the first ``lambada`` passages (0: all) and, with a ``teacher``, agreement with it."""
    from ladderize.eval.perplexity import perplexity
    from teacher_agreement import teacher_agreement  # beside this file

    times = {}
    started = time.perf_counter()
    result = {"lambada_limit": lambada, "window_sequences": ids.shape[0], "wikitext2_ppl": perplexity(model, ids, seq_len=ids.shape[1], num_sequences=ids.shape[0])}
    times["ppl_s"] = time.perf_counter() - started
    started = time.perf_counter()
    hits, lambada_ppl = lambada_scores(model, tokenizer, lambada or None)
    times["lambada_s"] = time.perf_counter() - started
    acc, se = mean_se([float(h) for h in hits])
    result.update({"lambada_n": len(hits), "lambada_acc": acc, "lambada_se": se, "lambada_ppl": lambada_ppl,
                   "lambada_hits": "".join("1" if h else "0" for h in hits)})
    if teacher is not None:
        started = time.perf_counter()
        result["teacher"] = teacher_agreement(model, teacher, ids)
        times["teacher_s"] = time.perf_counter() - started
    result["score_s"] = {k: round(v, 1) for k, v in times.items()}
    return result


def read_json(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.exists() else None


def point_file(name: str) -> Path:
    """A point's JSON (``:`` spelled ``+``: a name a Windows checkout can hold)."""
    return CURVE / f"{name.replace(':', '+')}.json"


def compare(record: dict, dense: dict, zero_shot: dict | None) -> dict:
    """Add the gap closed (with a zero-shot reference) and the paired LAMBADA difference to dense."""
    if zero_shot is not None:
        gap = zero_shot["wikitext2_ppl"] - dense["wikitext2_ppl"]
        record["gap_closed"] = (zero_shot["wikitext2_ppl"] - record["wikitext2_ppl"]) / gap
    record["lambada_diff_vs_dense"], record["lambada_diff_se"] = paired(record["lambada_hits"], dense["lambada_hits"])
    return record


class Scorer:
    """Loads the dense model, tokenizer and window once; scores checkpoints and caches the references' JSONs.

    A reference is scored again when its JSON is missing, holds another LAMBADA size, or ``rescore`` names it.
    """

    def __init__(self, dense: Path, lambada: int, rescore: set[str], device: str = "cpu", window: int = 16):
        from transformers import AutoTokenizer

        from ladderize.checkpoint.io import load_model
        from ladderize.eval.perplexity import wikitext2_ids

        self.dense_path, self.lambada, self.rescore, self.device = dense, lambada, set(rescore), device
        self.tokenizer = AutoTokenizer.from_pretrained(dense)
        self.ids = wikitext2_ids(self.tokenizer, 512, window)
        self.load_model = lambda path: load_model(path, device=device)
        self.dense_model = self.load_model(dense)
        self.references: dict[str, dict] = {}

    def fresh(self, record: dict | None) -> bool:
        """Whether a cached record was scored on the LAMBADA passages and the window asked for now."""
        return (record is not None and record.get("lambada_limit") == self.lambada
                and record.get("window_sequences", 16) == self.ids.shape[0])

    def _cached(self, name: str) -> dict | None:
        if name in self.references:
            return self.references[name]
        record = read_json(point_file(name))
        return record if self.fresh(record) and name not in self.rescore else None

    def dense(self) -> dict:
        record = self._cached("dense")
        if record is None:
            print("scoring dense", flush=True)
            record = {"name": "dense", "kind": "reference", "layout": None, "checkpoint": str(self.dense_path),
                      **score(self.dense_model, self.tokenizer, None, self.ids, self.lambada)}
            write_json(point_file("dense"), record)
        self.references["dense"] = record
        return record

    def checkpoint(self, path: Path, base: dict, zero_shot: dict | None) -> dict:
        """Score the checkpoint at ``path``: ``base`` plus the scores, compared with dense and ``zero_shot``."""
        dense = self.dense()
        print(f"scoring {base['name']} ({path})", flush=True)
        record = {**base, "checkpoint": str(path), **score(self.load_model(path), self.tokenizer, self.dense_model, self.ids, self.lambada)}
        if base["kind"] == "point":  # the precision adapt trained in, as its provenance records it (bf16-autocast, float32)
            record["precision"] = read_provenance(path)["history"][-1]["precision"]
        return compare(record, dense, zero_shot)

    def zero_shot(self, layout: str, work: Path, cpu: int | None) -> tuple[Path, dict]:
        """The converted checkpoint of ``layout`` (made once) and its scores."""
        path, conversion = converted(layout, self.dense_path, work, cpu)
        name = layout + ZERO_SHOT
        record = self._cached(name)
        if record is None:
            previous = read_json(point_file(name)) or {}
            base = {"name": name, "kind": "reference", "layout": layout, "convert_flags": LAYOUTS[layout][0],
                    "convert": conversion or previous.get("convert")}
            record = self.checkpoint(path, base, None)
            write_json(point_file(name), record)
        self.references[name] = record
        return path, record


def run_point(point: dict, scorer: Scorer, work: Path, cpu: int | None, force: bool) -> None:
    """Adapt (unless its JSON exists) and score one point; rescoring only when just the LAMBADA size changed."""
    name = point["name"]
    if point["kind"] == "reference":
        if point["layout"] is None:
            scorer.dense()
        else:
            scorer.zero_shot(point["layout"], work, cpu)
        return
    cached = read_json(point_file(name))
    if cached is not None and not force and scorer.fresh(cached):
        print(f"{name}: {point_file(name)} exists (--force reruns it)", flush=True)
        return
    source, zero_shot = scorer.zero_shot(point["layout"], work, cpu)
    out = work / name.replace(":", "-")
    if cached is not None and not force and out.exists():
        print(f"{name}: rescoring on {scorer.lambada or 'all'} LAMBADA passages", flush=True)
        adapt = cached["adapt"]
    else:
        budget = [] if point["budget"] == DEFAULT_BUDGET else ["--budget", point["budget"]]
        device = ["--device", scorer.device] if scorer.device != "cpu" else []
        args = ["adapt", str(source), str(out), "--data", DATA, *budget, "--force", *device, *LAYOUTS[point["layout"]][1],
                *point["variant_flags"]]
        print(f"{name}: ladderize {shlex.join(args)}", flush=True)
        adapt = run_pinned(args, cpu, work / f"{out.name}.adapt.log")
    record = scorer.checkpoint(out, {**point, "adapt": adapt, "device": device_name(scorer.device)}, zero_shot)
    write_json(point_file(name), record)
    print(json.dumps({k: v for k, v in record.items() if k not in ("lambada_hits", "adapt", "teacher")}), flush=True)


def device_name(device: str) -> str:
    """What ran a point: the GPU's name on cuda, else ``cpu``."""
    return torch.cuda.get_device_name(0) if device == "cuda" else "cpu"


def gather() -> tuple[dict, dict[str, dict], list[dict]]:
    """dense, the zero-shot references by layout and the adapted points from ``results/adapt_curve/``."""
    records = [json.loads(path.read_text()) for path in sorted(CURVE.glob("*.json"))]
    dense = next((r for r in records if r["name"] == "dense"), None)
    if dense is None:
        raise SystemExit(f"no dense.json in {CURVE}")
    zero = {r["layout"]: r for r in records if r["kind"] == "reference" and r.get("layout")}
    points = sorted((r for r in records if r["kind"] == "point"), key=lambda r: (r["layout"], r.get("variant") or "", minutes(r)))
    for record in [*zero.values(), *points]:  # the paired difference from the dense record as it is now
        compare(record, dense, zero.get(record["layout"]) if record["kind"] == "point" else None)
    return dense, zero, points


PLAN_LINE = re.compile(r"^budget [^:]+: ([\d,]+) token passes")
REPLAN_LINE = re.compile(r"^budget [^:]+: .*; re-planned .*: ([\d,]+) token passes")
# the one run re-planned before the line said its total: its kd stage's change ("re-planned kd OLD -> NEW tokens")
REPLANNED_KD = re.compile(r"; re-planned kd ([\d,]+) -> ([\d,]+) tokens \(")


def token_passes(record: dict) -> int | None:
    """The token passes the run's stages got: its plan's (``budget ...: N token passes``), or its last re-plan's
    (``...; re-planned ...: N token passes``, a wall budget after a stage); None without a plan line."""
    passes = None
    for line in record["adapt"].get("plan", record["adapt"]["stdout_tail"]):
        found = REPLAN_LINE.match(line) or PLAN_LINE.match(line)
        if found:
            passes = int(found.group(1).replace(",", ""))
        elif passes is not None and (kd := REPLANNED_KD.search(line)):
            passes += int(kd.group(2).replace(",", "")) - int(kd.group(1).replace(",", ""))
    return passes


def table(dense: dict, zero: dict[str, dict], points: list[dict]) -> str:
    """The markdown table of the references and points (a point's token passes: what a device at another pace buys
    by the same curve)."""
    def pct(value):
        return "-" if value is None else f"{100 * value:.1f}%"

    def over(record):
        return "-" if record is dense else f"{100 * (record['wikitext2_ppl'] / dense['wikitext2_ppl'] - 1):+.1f}%"

    def row(label, budget, record, cpu_min="-", wall_min="-", passes="-", precision="-"):
        diff, se = record.get("lambada_diff_vs_dense"), record.get("lambada_diff_se")
        delta = "-" if diff is None or record is dense else f"{100 * diff:+.2f} ± {100 * se:.2f}"
        teacher = record.get("teacher") or {}
        kl = f"{teacher['kl']:.4f}" if teacher else "-"
        top1 = pct(teacher.get("top1")) if teacher else "-"
        return (f"| {label} | {budget} | {precision} | {cpu_min} | {wall_min} | {passes} | {record['wikitext2_ppl']:.2f} | {over(record)} | {pct(record.get('gap_closed'))} | "
                f"{100 * record['lambada_acc']:.2f}% ± {100 * record['lambada_se']:.2f} | {delta} | {record['lambada_ppl']:.2f} | {kl} | {top1} |")

    lines = [f"| layout | budget | precision | CPU min | wall min | token passes | WikiText-2 ppl | vs dense | gap closed | LAMBADA acc (n={dense['lambada_n']}) | "
             "Δ vs dense (points) | LAMBADA ppl | KL to dense | top-1 |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
             row("dense", "-", dense)]
    for layout, record in zero.items():
        lines.append(row(layout, "zero-shot", {**record, "gap_closed": 0.0}, "0", "0", "0"))
    for record in points:
        label = record["layout"] + (f" ({record['variant']})" if record.get("variant") else "")
        passes = token_passes(record)
        lines.append(row(label, record["budget"], record, f"{record['adapt']['cpu_s'] / 60:.1f}", f"{record['adapt']['wall_s'] / 60:.1f}",
                         "-" if passes is None else f"{passes:,}", record["precision"]))
    return "\n".join(lines)


def minutes(record: dict) -> float:
    """A point's x: the adapt run's CPU minutes on one pinned core, its wall minutes on a GPU."""
    on_gpu = record.get("device", "cpu") != "cpu"
    return record["adapt"]["wall_s" if on_gpu else "cpu_s"] / 60


# the product command's series, joined by lines: the bare command (in its precision then) and its bf16 runs; every other
# variant (a setting, a batch order) is a point of its own, in the table and as an unjoined mark
PLOTTED_VARIANTS = frozenset({"", "bf16"})


def plot_curve(dense: dict, zero: dict[str, dict], points: list[dict], path: Path) -> None:
    """Gap closed, perplexity over dense, LAMBADA accuracy and KL to dense against the adapt run's CPU minutes, one line per layout."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("gap closed (% of zero-shot to dense, WikiText-2 ppl)", lambda r: 100 * r.get("gap_closed", 0.0)),
              ("WikiText-2 ppl over dense (%, log scale)", lambda r: 100 * (r["wikitext2_ppl"] / dense["wikitext2_ppl"] - 1)),
              (f"LAMBADA accuracy, first {dense['lambada_n']} (%)", lambda r: 100 * r["lambada_acc"]),
              ("KL(dense || student) per token (nats)", lambda r: r["teacher"]["kl"])]
    fig, axes = plt.subplots(1, len(panels), figsize=(21, 4.8))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    markers = "osD^vP*X"
    layouts = sorted({r["layout"] for r in points} | set(zero))
    for i, layout in enumerate(layouts):
        color = colors[i % len(colors)]
        variants = sorted({r.get("variant") or "" for r in points if r["layout"] == layout} & PLOTTED_VARIANTS)
        for j, variant in enumerate(variants or [""]):
            series = [r for r in points if r["layout"] == layout and (r.get("variant") or "") == variant]
            start = [({**zero[layout], "gap_closed": 0.0}, 0.0)] if layout in zero else []
            series = start + [(r, minutes(r)) for r in series]
            label = layout + (f" ({variant})" if variant else "")
            for ax, (_, value) in zip(axes, panels):
                ax.plot([x for _, x in series], [value(r) for r, _ in series], color=color, marker=markers[j % len(markers)],
                        ls="-" if not variant else "--", label=label)
        others = [r for r in points if r["layout"] == layout and (r.get("variant") or "") not in PLOTTED_VARIANTS]
        if others:  # every other setting or batch order: a point each, unjoined, one legend entry for them all
            for ax, (_, value) in zip(axes, panels):
                ax.scatter([minutes(r) for r in others], [value(r) for r in others], color=color, marker="x", s=18, alpha=0.45,
                           label=f"{layout}: {len(others)} runs of other settings (the table)")
    axes[0].axhline(100, color="k", ls="--", label="dense")
    axes[1].set_yscale("log")  # ladder 10-29 starts at +4,400%: only a log axis shows every layout's last points
    axes[2].axhline(100 * dense["lambada_acc"], color="k", ls="--", label="dense")
    axes[3].axhline(0, color="k", ls="--", label="dense")
    gpus = sorted({r["device"] for r in points if r.get("device", "cpu") != "cpu"})
    for ax, (ylabel, _) in zip(axes, panels):
        ax.set_xlabel(f"wall minutes of the adapt run on {', '.join(gpus)}" if gpus else "CPU minutes of the adapt run (one core, one thread)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7, loc="lower right")  # one legend: the panels share their series
    fig.suptitle(f"SmolLM2-135M: recovery per compute of ladderize adapt --budget{' on ' + ', '.join(gpus) if gpus else ''} (0 min: zero-shot)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot() -> None:
    """Write ``NAME.json`` and ``NAME.png`` beside the point JSONs' folder ``NAME`` from them and print the table."""
    stem = CURVE.parent / CURVE.name
    dense, zero, points = gather()
    slim = lambda r: {k: v for k, v in r.items() if k != "lambada_hits"}  # noqa: E731
    write_json(stem.with_suffix(".json"), {"dense": slim(dense), "zero_shot": {k: slim(v) for k, v in zero.items()},
                                           "points": [slim(r) for r in points]})
    plot_curve(dense, zero, points, stem.with_suffix(".png"))
    print(table(dense, zero, points))


def main() -> None:
    global CURVE
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--points", default="", help="comma-separated LAYOUT@BUDGET[:VARIANT], dense or LAYOUT-zero-shot; "
                        f"layouts: {', '.join(LAYOUTS)}; BUDGET as adapt --budget (15m, 1h, 90s wall time; 20M, 500K tokens)")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=FLAGS",
                        help="extra adapt flags of a named variant (shell-quoted), used by points LAYOUT@BUDGET:NAME; repeatable")
    parser.add_argument("--cpu", type=int, default=0, help="the core adapt and scoring run on (cpu device)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="where adapt and the scoring run; cuda: unpinned, adapt --device cuda")
    parser.add_argument("--results", type=Path, default=CURVE, help="the folder of the point JSONs")
    parser.add_argument("--window", type=int, default=16, help="512-token sequences of the WikiText-2 valid window "
                        "(16: the curve's; fewer only to rehearse the plumbing, as the GPU check's CPU rehearsal does)")
    parser.add_argument("--lambada", type=int, default=1000, help="first N LAMBADA passages (0: all 5153)")
    parser.add_argument("--work", type=Path, default=WORK, help="converted and adapted checkpoints ($ADAPT_BENCH_WORK)")
    parser.add_argument("--dense", type=Path, default=None, help="dense checkpoint (default: ladderize pull smollm2-135m)")
    parser.add_argument("--force", action="store_true", help="rerun points whose JSON exists (rescore the references named in --points)")
    parser.add_argument("--plot", action="store_true", help="gather results/adapt_curve/*.json into adapt_curve.json, .png and a table")
    args = parser.parse_args()
    if not args.points and not args.plot:
        parser.error("give --points, --plot or both")
    if any("=" not in v for v in args.variant):
        raise SystemExit("variants are given as NAME=FLAGS")
    variants = {name: shlex.split(flags) for name, flags in (v.split("=", 1) for v in args.variant)}
    points = [parse_point(spec.strip(), variants) for spec in args.points.split(",") if spec.strip()]
    CURVE = args.results
    cpu = args.cpu if args.device == "cpu" else None
    if points:
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})
            torch.set_num_threads(1)
        torch.manual_seed(0)
        rescore = {p["name"] for p in points if p["kind"] == "reference"} if args.force else set()
        scorer = Scorer(args.dense or dense_source(), args.lambada, rescore, args.device, args.window)
        for point in points:
            run_point(point, scorer, args.work, cpu, args.force)
    if args.plot:
        plot()


if __name__ == "__main__":
    main()
