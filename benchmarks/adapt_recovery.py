"""Does the bare ``ladderize adapt`` beat plain training at equal CPU? LAMBADA and WikiText-2 on SmolLM2-135M.

One thread on one pinned core, for every run and every score:

(a) the product: ``ladderize convert DENSE WORK/ladder15-29 --ladder 15:30`` (once), then
    ``ladderize adapt WORK/ladder15-29 OUT --data wikitext2-heldout --force [--adapt-flags ...]`` as a child
    (``taskset -c CPU``, ``OMP_NUM_THREADS=1``); its CPU time is the child tree's user + system
    (``getrusage(RUSAGE_CHILDREN)`` around it);
(b) a plain ``transformers.Trainer``: the converted layers (15..29) trainable, everything else frozen,
    causal-LM loss, AdamW lr 2e-4 (5 warm-up steps, linear decay), 2 x 512 tokens a step;
(c) a plain KL-to-teacher loop: student = the converted model (layers 15..29 trainable), teacher = dense,
    KL(teacher || student) on the logits, AdamW lr 2e-4 (5 warm-up steps, linear decay), 2 x 512 tokens a step.

(b) and (c) get the CPU seconds (a) used (``time.process_time()`` of this process, one thread, from before the
student is loaded; the number of steps is sized after two timed steps, and training stops at the budget anyway), on the
same training text: ``wikitext2-heldout`` (the WikiText-2 valid articles after the file's first eighth), packed into
512-token sequences and shuffled with seed 0.

Then dense, zero-shot (both cached per split in the JSON folder), (a), (b) and (c) are scored:

- ``--split final``: WikiText-2 *test* perplexity when ``--wikitext-test FILE`` (or ``DATA_DIR/wikitext-2/test.txt``)
  exists (``--wikitext-seqs`` packed 512-token sequences, each scored alone), else the project's reference window
  (the first 16 x 512 tokens of WikiText-2 valid, which no run trains on; the table says which); LAMBADA (OpenAI)
  accuracy and lm-eval's perplexity (exp(-mean last-word log-likelihood)) on the first 1,000 passages.
- ``--split tune`` (for choosing levers, never the final figures): WikiText-2 valid's first eighth after the reference
  window (sequences 16..16+``--wikitext-seqs``; no run trains on it either) and LAMBADA passages 1,000..1,000+``--lambada``.

Prints a markdown table; writes ``results/adapt_recovery/<split>-<name>.json`` (and ``.png``). Usage:

    taskset -c 1 python benchmarks/adapt_recovery.py --split final --cpu 1 --threads 1
    taskset -c 1 python benchmarks/adapt_recovery.py --split tune --name seqonly --skip-baselines \\
        --adapt-flags '--recipe seq-local --stage seq-local:tokens=98304'
    python benchmarks/adapt_recovery.py --table results/adapt_recovery/final-default.json

``--reuse-adapt OUT --adapt-cpu-s S`` scores an existing adapt output instead of running it (S: its CPU seconds).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
RESULTS = HERE / "results" / "adapt_recovery"
WORK = Path(os.environ.get("ADAPT_BENCH_WORK", "/tmp/adapt_bench/recovery"))
LADDER = (15, 30)  # the converted layers, [start, end)
DATA = "wikitext2-heldout"
SEQ_LEN = 512
FINAL_LAMBADA = 1000
REFERENCE_WINDOW = 16  # the project's WikiText-2 valid window: the first 16 x 512 tokens


# ---------------------------------------------------------------- data and scoring


def wikitext_eval_ids(tokenizer, split: str, seqs: int, test_file: Path | None):
    """The WikiText-2 sequences a split scores, and their label."""
    import torch

    from ladderize.eval.perplexity import _wikitext2_valid_text, packed_token_ids

    if split == "final":
        if test_file is not None and test_file.is_file():
            stream = tokenizer(test_file.read_text(encoding="utf-8"), add_special_tokens=False)["input_ids"]
            n = min(seqs, len(stream) // SEQ_LEN)
            return torch.tensor(stream[: n * SEQ_LEN]).view(n, SEQ_LEN), f"WikiText-2 test ({n} x {SEQ_LEN}, {test_file})"
        ids = packed_token_ids(tokenizer, _wikitext2_valid_text(), SEQ_LEN, REFERENCE_WINDOW)
        return ids, f"WikiText-2 valid reference window ({REFERENCE_WINDOW} x {SEQ_LEN}; no test.txt here)"
    # tune: the first eighth of valid after the reference window (the heldout articles start after that eighth)
    from ladderize.eval.perplexity import WIKITEXT2_HELDOUT_FRACTION

    text = _wikitext2_valid_text()
    head = text[: int(len(text) * WIKITEXT2_HELDOUT_FRACTION)]
    stream = tokenizer(head, add_special_tokens=False)["input_ids"][REFERENCE_WINDOW * SEQ_LEN:]
    n = min(seqs, len(stream) // SEQ_LEN)
    return torch.tensor(stream[: n * SEQ_LEN]).view(n, SEQ_LEN), f"WikiText-2 valid first eighth, sequences {REFERENCE_WINDOW}..{REFERENCE_WINDOW + n} x {SEQ_LEN}"


def lambada_data_dir(split: str, count: int, work: Path) -> tuple[Path, str]:
    """A data dir whose ``lambada_openai`` file holds the split's passages (final: the shared one, first ``count``)."""
    from ladderize.eval.perplexity import shared_data_dir

    shared = shared_data_dir()
    if split == "final":
        return shared, f"LAMBADA (OpenAI) passages 0..{count}"
    lines = (shared / "lambada_openai" / "lambada_test.jsonl").read_text(encoding="utf-8").splitlines()
    chosen = lines[FINAL_LAMBADA: FINAL_LAMBADA + count]
    folder = work / f"lambada-tune-{count}"
    (folder / "lambada_openai").mkdir(parents=True, exist_ok=True)
    (folder / "lambada_openai" / "lambada_test.jsonl").write_text("\n".join(chosen) + "\n", encoding="utf-8")
    wiki = folder / "wikitext-2"
    if not wiki.exists():
        wiki.symlink_to(shared / "wikitext-2")
    return folder, f"LAMBADA (OpenAI) passages {FINAL_LAMBADA}..{FINAL_LAMBADA + len(chosen)}"


def score(model, tokenizer, ids, lambada_dir: Path, lambada_count: int) -> dict:
    """WikiText perplexity on ``ids`` and LAMBADA acc / lm-eval perplexity on ``lambada_dir``'s first passages."""
    from ladderize.eval.harness import evaluate_model
    from ladderize.eval.perplexity import perplexity

    started = time.perf_counter()
    model.eval()
    ppl = perplexity(model, ids, seq_len=ids.shape[1], num_sequences=ids.shape[0])
    ppl_s = time.perf_counter() - started
    started = time.perf_counter()
    output = evaluate_model(model, tokenizer, "lambada_openai", limit=lambada_count, batch_size=16, data_dir=lambada_dir,
                            bootstrap_iters=0, log_samples=True)
    samples = sorted(output["samples"]["lambada_openai"], key=lambda s: s["doc_id"])
    hits = [bool(s["acc"]) for s in samples]
    lls = [float(s["perplexity"]) for s in samples]
    acc = sum(hits) / len(hits)
    se = math.sqrt(acc * (1 - acc) / (len(hits) - 1)) if len(hits) > 1 else float("nan")
    return {"wikitext_ppl": ppl, "lambada_acc": acc, "lambada_se": se, "lambada_ppl": math.exp(-sum(lls) / len(lls)),
            "lambada_n": len(hits), "lambada_hits": "".join("1" if h else "0" for h in hits),
            "score_s": {"ppl": round(ppl_s, 1), "lambada": round(time.perf_counter() - started, 1)}}


# ---------------------------------------------------------------- the product's run


def run_pinned(args: list[str], cpu: int | None, log: Path) -> dict:
    """``ladderize ARGS`` as a child on core ``cpu``, one thread: ``adapt_curve.run_pinned`` (wall and CPU seconds, user
    + system of the child tree, and its output's last lines)."""
    from adapt_curve import run_pinned as pinned

    log.parent.mkdir(parents=True, exist_ok=True)
    return pinned(args, cpu, log)


# ---------------------------------------------------------------- the plain alternatives


def training_sequences(tokenizer):
    """The training text as 512-token sequences (the same text ``adapt --data wikitext2-heldout`` reads)."""
    from ladderize.corpus.windows import pack_tokens

    return pack_tokens(DATA, tokenizer, SEQ_LEN)


def trainable_converted(model) -> int:
    """Freeze everything but the converted layers; the trainable parameter count."""
    for p in model.parameters():
        p.requires_grad_(False)
    count = 0
    for index in range(*LADDER):
        for p in model.model.layers[index].parameters():
            p.requires_grad_(True)
            count += p.numel()
    return count


class Budget:
    """This process's CPU seconds since ``start`` against ``seconds``."""

    def __init__(self, seconds: float):
        self.seconds, self.start = seconds, time.process_time()

    def used(self) -> float:
        return time.process_time() - self.start

    def spent(self) -> bool:
        return self.used() >= self.seconds


def plain_trainer(zero_shot: Path, out: Path, tokenizer, seconds: float, lr: float, batch_size: int, seed: int) -> dict:
    """(b): ``transformers.Trainer``, causal-LM loss, converted layers trainable, stopped at ``seconds`` of CPU."""
    import torch
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from ladderize.checkpoint.io import load_model

    budget = Budget(seconds)
    torch.manual_seed(seed)
    model = load_model(zero_shot)
    trainable = trainable_converted(model)
    data = training_sequences(tokenizer)
    dataset = [{"input_ids": row, "labels": row.clone()} for row in data]

    def collate(rows):
        return {k: torch.stack([r[k] for r in rows]) for k in rows[0]}

    # two timed steps size the schedule (their CPU counts in the budget)
    model.train()
    probe = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.0)
    t0 = time.process_time()
    for i in range(2):
        batch = collate(dataset[i * batch_size:(i + 1) * batch_size])
        model(**batch).loss.backward()
        probe.step()
        probe.zero_grad(set_to_none=True)
    step_s = (time.process_time() - t0) / 2 * 1.08  # AdamW's update and the Trainer's bookkeeping on top
    steps = max(1, int((seconds - budget.used()) / step_s))
    del probe

    class Stop(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if budget.spent():
                control.should_training_stop = True
            return control

    targs = TrainingArguments(output_dir=str(out) + ".trainer", per_device_train_batch_size=batch_size, learning_rate=lr,
                              max_steps=steps, warmup_steps=5, lr_scheduler_type="linear", weight_decay=0.0,
                              logging_steps=10, save_strategy="no", report_to=[], seed=seed, use_cpu=True,
                              dataloader_num_workers=0, disable_tqdm=True)
    trainer = Trainer(model=model, args=targs, train_dataset=dataset, data_collator=collate, callbacks=[Stop()])
    result = trainer.train()
    cpu_s = budget.used()
    save(model, zero_shot, out)
    return {"method": "transformers.Trainer, causal-LM loss", "lr": lr, "batch_size": batch_size, "planned_steps": steps,
            "steps": trainer.state.global_step, "tokens": trainer.state.global_step * batch_size * SEQ_LEN,
            "train_loss": result.training_loss, "trainable_params": trainable, "cpu_s": round(cpu_s, 1),
            "budget_s": round(seconds, 1), "log": trainer.state.log_history[-3:]}


def plain_kd(zero_shot: Path, dense: Path, out: Path, tokenizer, seconds: float, lr: float, batch_size: int, seed: int,
             temperature: float = 1.0) -> dict:
    """(c): a plain loop, KL(teacher || student) on the logits, converted layers trainable, stopped at ``seconds`` of CPU."""
    import torch
    import torch.nn.functional as F

    from ladderize.checkpoint.io import load_model

    budget = Budget(seconds)
    torch.manual_seed(seed)
    student = load_model(zero_shot)
    teacher = load_model(dense).eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    trainable = trainable_converted(student)
    params = [p for p in student.parameters() if p.requires_grad]
    data = training_sequences(tokenizer)
    generator = torch.Generator().manual_seed(seed)

    def batches():
        while True:
            order = torch.randperm(data.shape[0], generator=generator)
            for i in range(0, len(order) - batch_size + 1, batch_size):
                yield data[order[i:i + batch_size]]

    def loss_of(ids):
        with torch.no_grad():
            t = teacher(input_ids=ids, use_cache=False).logits.float() / temperature
        s = student(input_ids=ids, use_cache=False).logits.float() / temperature
        v = s.shape[-1]
        return F.kl_div(F.log_softmax(s, -1).view(-1, v), F.log_softmax(t, -1).view(-1, v), log_target=True,
                        reduction="batchmean") * temperature ** 2

    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    stream = batches()
    student.train()
    t0 = time.process_time()
    warm = 5
    plan = None
    step, losses = 0, []
    while True:
        if plan is not None and (step >= plan or budget.spent()):
            break
        if plan is None and step == 2:  # two timed steps size the schedule
            plan = max(3, step + int((seconds - budget.used()) / ((time.process_time() - t0) / 2)))
        total = plan or 10 ** 6
        scale = (step + 1) / warm if step < warm else max(0.0, (total - step) / max(1, total - warm))
        for group in optimizer.param_groups:
            group["lr"] = lr * scale
        loss = loss_of(next(stream))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        step += 1
        if step % 10 == 0:
            print(f"  kd step {step}/{plan} loss {sum(losses[-10:]) / 10:.4f} cpu {budget.used():.0f}/{seconds:.0f} s", flush=True)
    cpu_s = budget.used()
    save(student, zero_shot, out)
    return {"method": "plain KL-to-teacher loop on logits", "lr": lr, "batch_size": batch_size, "temperature": temperature,
            "planned_steps": plan, "steps": step, "tokens": step * batch_size * SEQ_LEN, "last_loss": sum(losses[-10:]) / max(1, len(losses[-10:])),
            "trainable_params": trainable, "cpu_s": round(cpu_s, 1), "budget_s": round(seconds, 1)}


def save(model, source: Path, out: Path) -> None:
    """The trained student as a checkpoint ``load_model`` reads: the source's files with the new weights."""
    import shutil

    from safetensors.torch import save_file

    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for f in source.iterdir():
        if f.is_file() and f.suffix != ".safetensors" and not f.name.endswith(".safetensors.index.json"):
            shutil.copy2(f, out / f.name)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if getattr(model.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})


# ---------------------------------------------------------------- report


def table(report: dict) -> str:
    dense = report["rows"]["dense"]
    lines = [f"split: {report['split']}; {report['wikitext']}; {report['lambada']}", "",
             "| model | CPU min | WikiText-2 ppl | vs dense | LAMBADA acc | Δ acc vs dense (paired) | LAMBADA ppl | vs dense |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, row in report["rows"].items():
        diff = [int(a) - int(b) for a, b in zip(row["lambada_hits"], dense["lambada_hits"])]
        mean = sum(diff) / len(diff)
        se = math.sqrt(sum((d - mean) ** 2 for d in diff) / (len(diff) - 1) / len(diff))
        cpu = row.get("cpu_s")
        lines.append(f"| {name} | {'-' if cpu is None else f'{cpu / 60:.1f}'} | {row['wikitext_ppl']:.2f} | "
                     f"{100 * (row['wikitext_ppl'] / dense['wikitext_ppl'] - 1):+.1f}% | {100 * row['lambada_acc']:.1f}% ± {100 * row['lambada_se']:.1f} | "
                     f"{100 * mean:+.1f} ± {100 * se:.1f} | {row['lambada_ppl']:.1f} | {100 * (row['lambada_ppl'] / dense['lambada_ppl'] - 1):+.1f}% |")
    return "\n".join(lines)


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["rows"]
    names = list(rows)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for ax, key, label in zip(axes, ("wikitext_ppl", "lambada_acc", "lambada_ppl"), ("WikiText-2 ppl", "LAMBADA acc", "LAMBADA ppl")):
        ax.bar(range(len(names)), [rows[n][key] for n in names], color=["k" if n == "dense" else "C0" for n in names])
        ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=7)
        ax.set_title(label)
        if key != "lambada_acc":
            ax.set_yscale("log")
    fig.suptitle(f"SmolLM2-135M ladder 15:30, {report['split']} split: {report['name']}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def save_report(report: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(report, indent=1) + "\n")
    tmp.replace(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--split", choices=("tune", "final"), default="tune", help="tune: held-out scoring for levers; final: the figures reported (never used to choose a lever)")
    parser.add_argument("--name", default="default", help="this run's name (JSON file and table rows)")
    parser.add_argument("--adapt-flags", default="", help="extra ladderize adapt flags, shell-quoted (a lever); default: the bare command")
    parser.add_argument("--reuse-adapt", type=Path, default=None, help="score this adapt output instead of running adapt")
    parser.add_argument("--adapt-cpu-s", type=float, default=None, help="with --reuse-adapt: its CPU seconds")
    parser.add_argument("--budget-s", type=float, default=None, help="CPU seconds for the plain runs (default: what adapt used)")
    parser.add_argument("--skip-baselines", action="store_true", help="only the adapt run (levers on the tune split)")
    parser.add_argument("--only", choices=("trainer", "kd"), action="append", default=None, help="run only these baselines")
    parser.add_argument("--lr", type=float, default=2e-4, help="the plain runs' learning rate")
    parser.add_argument("--batch-size", type=int, default=2, help="the plain runs' sequences per step")
    parser.add_argument("--lambada", type=int, default=None, help="LAMBADA passages (final: 1000; tune: passages 1000.., default 500)")
    parser.add_argument("--wikitext-seqs", type=int, default=None, help="WikiText 512-token sequences (tune default 40; final test default 64)")
    parser.add_argument("--wikitext-test", type=Path, default=None, help="WikiText-2 test text (default DATA_DIR/wikitext-2/test.txt)")
    parser.add_argument("--cpu", type=int, default=1, help="the core for every run (taskset); -1: unpinned")
    parser.add_argument("--threads", type=int, default=1, help="torch threads here (1 for equal-CPU figures)")
    parser.add_argument("--work", type=Path, default=WORK, help="checkpoints ($ADAPT_BENCH_WORK)")
    parser.add_argument("--dense", type=Path, default=None, help="dense checkpoint (default: ladderize pull smollm2-135m)")
    parser.add_argument("--from-json", type=Path, default=None, help="take dense, zero-shot and the adapt row (and its CPU) "
                        "from this saved JSON instead of scoring them (run one plain baseline beside another: --only kd)")
    parser.add_argument("--table", type=Path, default=None, help="print the table of a saved JSON and exit")
    args = parser.parse_args()
    if args.table:
        print(table(json.loads(args.table.read_text())))
        return

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    cpu = None if args.cpu < 0 else args.cpu
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    from transformers import AutoTokenizer

    from adapt_common import dense_source
    from ladderize.checkpoint.io import load_model
    from ladderize.eval.perplexity import shared_data_dir

    dense = args.dense or dense_source()
    tokenizer = AutoTokenizer.from_pretrained(dense)
    lambada_count = args.lambada or (FINAL_LAMBADA if args.split == "final" else 500)
    if args.split == "final" and lambada_count != FINAL_LAMBADA:
        print(f"note: final split with {lambada_count} LAMBADA passages, not {FINAL_LAMBADA}")
    test_file = args.wikitext_test or shared_data_dir() / "wikitext-2" / "test.txt"
    seqs = args.wikitext_seqs or (64 if args.split == "final" else 40)
    ids, wiki_label = wikitext_eval_ids(tokenizer, args.split, seqs, test_file)
    lam_dir, lam_label = lambada_data_dir(args.split, lambada_count, args.work)
    out_json = RESULTS / f"{args.split}-{args.name}.json"
    report = json.loads(out_json.read_text()) if out_json.exists() else {}
    report.update({"split": args.split, "name": args.name, "wikitext": wiki_label, "lambada": lam_label,
                   "adapt_flags": args.adapt_flags, "threads": args.threads, "cpu_core": cpu})
    report.setdefault("rows", {})
    report.setdefault("runs", {})

    if args.from_json:
        saved = json.loads(args.from_json.read_text())
        report["rows"].update({k: v for k, v in saved["rows"].items() if k in ("dense", "zero-shot") or k.startswith("ladderize adapt")})
        report["runs"]["adapt"] = saved["runs"]["adapt"]
        adapt_cpu = saved["runs"]["adapt"]["cpu_s"]
        zero_shot = args.work / "ladder15-29"
    else:
        # references, cached per split and evaluation set
        cache = RESULTS / f"{args.split}-references.json"
        refs = json.loads(cache.read_text()) if cache.exists() else {}
        key = f"{wiki_label} | {lam_label}"
        refs.setdefault(key, {})
        zero_shot = args.work / "ladder15-29"
        if not zero_shot.exists():
            report["runs"]["convert"] = run_pinned(["convert", str(dense), str(zero_shot), "--ladder", f"{LADDER[0]}:{LADDER[1]}"],
                                                   cpu, args.work / "convert.log")
        for name, path in (("dense", dense), ("zero-shot", zero_shot)):
            if name not in refs[key]:
                print(f"scoring {name}", flush=True)
                refs[key][name] = {"checkpoint": str(path), "cpu_s": 0.0 if name == "zero-shot" else None,
                                   **score(load_model(path), tokenizer, ids, lam_dir, lambada_count)}
                save_report(refs, cache)
            report["rows"][name] = refs[key][name]
            print(name, {k: v for k, v in refs[key][name].items() if k != "lambada_hits"}, flush=True)

        # (a) the product
        label = "ladderize adapt" + (f" {args.adapt_flags}" if args.adapt_flags else " (bare)")
        if args.reuse_adapt:
            adapted, adapt_cpu = args.reuse_adapt, args.adapt_cpu_s
            if adapt_cpu is None:
                raise SystemExit("--reuse-adapt needs --adapt-cpu-s")
            report["runs"]["adapt"] = {"reused": str(adapted), "cpu_s": adapt_cpu}
        else:
            adapted = args.work / f"{args.split}-{args.name}-adapt"
            adapt_args = ["adapt", str(zero_shot), str(adapted), "--data", DATA, "--force", *shlex.split(args.adapt_flags)]
            print("running: ladderize", shlex.join(adapt_args), flush=True)
            report["runs"]["adapt"] = run_pinned(adapt_args, cpu, args.work / f"{args.split}-{args.name}-adapt.log")
            adapt_cpu = report["runs"]["adapt"]["cpu_s"]
            save_report(report, out_json)
        print(f"adapt: {adapt_cpu:.0f} CPU s", flush=True)
        report["rows"][label] = {"checkpoint": str(adapted), "cpu_s": adapt_cpu, **score(load_model(adapted), tokenizer, ids, lam_dir, lambada_count)}
        save_report(report, out_json)
        print(table(report), flush=True)

    # (b), (c) the plain alternatives at the same CPU
    seconds = args.budget_s or adapt_cpu
    if not args.skip_baselines:
        for which in args.only or ["trainer", "kd"]:
            out = args.work / f"{args.split}-{args.name}-{which}"
            print(f"running the plain {which} for {seconds:.0f} CPU s", flush=True)
            if which == "trainer":
                run = plain_trainer(zero_shot, out, tokenizer, seconds, args.lr, args.batch_size, 0)
                row = f"plain Trainer, LM loss, lr {args.lr:g}"
            else:
                run = plain_kd(zero_shot, dense, out, tokenizer, seconds, args.lr, args.batch_size, 0)
                row = f"plain KL-to-teacher, lr {args.lr:g}"
            report["runs"][which] = run
            print(json.dumps(run), flush=True)
            report["rows"][row] = {"checkpoint": str(out), "cpu_s": run["cpu_s"], **score(load_model(out), tokenizer, ids, lam_dir, lambada_count)}
            save_report(report, out_json)
            print(table(report), flush=True)
    try:
        plot(report, out_json.with_suffix(".png"))
    except Exception as error:  # the PNG is a convenience
        print("no plot:", error)
    print(table(report))


if __name__ == "__main__":
    main()
