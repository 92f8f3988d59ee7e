"""Where an adapted checkpoint departs from its dense teacher: on the text it trained on, on unseen text of the same
corpus, and on another domain (LAMBADA's fiction), side by side.

For each ``NAME=CKPT`` (SmolLM2-135M converted and adapted with ``--data wikitext2-heldout``, as
``benchmarks/adapt_recovery.py`` runs it), ``teacher_agreement`` (KL(teacher || student) per predicted token, top-1
agreement, both NLLs) on three texts:

- ``trained``: the first ``--seqs`` 512-token sequences of ``wikitext2-heldout`` as ``adapt`` packs them (the default
  recipe trains on its first 128);
- ``unseen``: the same number of WikiText-2 valid sequences that no run trains on (``adapt_recovery``'s tune window);
- ``lambada``: LAMBADA passages 1,000.. (``--passages``; each whole passage, one window each), and on them the last
  word's KL and NLL gap alone (lm-eval's split: the context, then " " + the last word).

A recipe that restores the dense function has the same KL on all three; one that fits its text has a lower KL on
``trained`` than on ``unseen`` (the sequences); one that fits the corpus's domain a lower KL on both than on
``lambada``. Prints a markdown table and writes ``results/adapt_domain_gap/<name>.json``:

    taskset -c 0 python benchmarks/adapt_domain_gap.py bare=OUT seqonly=OUT2 --name levers --threads 1
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
RESULTS = HERE / "results" / "adapt_domain_gap"


def lambada_windows(tokenizer, first: int, count: int) -> list[tuple["torch.Tensor", int]]:
    """LAMBADA passages ``first..first+count`` as ``([1, S] ids, tokens of the last word)``, split as lm-eval splits
    them (the context up to the last space, then " " + the last word, tokenized apart)."""
    import torch

    from ladderize.eval.perplexity import shared_data_dir

    lines = (shared_data_dir() / "lambada_openai" / "lambada_test.jsonl").read_text(encoding="utf-8").splitlines()
    windows = []
    for line in lines[first: first + count]:
        context, word = json.loads(line)["text"].rsplit(" ", 1)
        context_ids = tokenizer(context)["input_ids"]
        word_ids = tokenizer(" " + word, add_special_tokens=False)["input_ids"]
        windows.append((torch.tensor([context_ids + word_ids]), len(word_ids)))
    return windows


def token_gaps(student, teacher, ids) -> tuple["torch.Tensor", "torch.Tensor"]:
    """Per predicted position of the ``[1, S]`` window (``S - 1`` of them): KL(teacher || student) and the student's
    NLL of the next token minus the teacher's."""
    import torch
    import torch.nn.functional as F

    with torch.no_grad():
        log_q = F.log_softmax(student(input_ids=ids, use_cache=False).logits[0, :-1].float(), -1)
        log_p = F.log_softmax(teacher(input_ids=ids, use_cache=False).logits[0, :-1].float(), -1)
    targets = ids[0, 1:, None]
    kl = (log_p.exp() * (log_p - log_q)).sum(-1)
    return kl, (log_p.gather(-1, targets) - log_q.gather(-1, targets))[:, 0]


def last_word(student, teacher, ids, word_tokens: int) -> tuple[float, float]:
    """KL(teacher || student) summed over the last word's predicted tokens, and the student's NLL minus the teacher's."""
    kl, gap = token_gaps(student, teacher, ids)
    return kl[-word_tokens:].sum().item(), gap[-word_tokens:].sum().item()


def measure(student, teacher, texts: dict, passages: list) -> dict:
    """``teacher_agreement`` on each text, then the LAMBADA passages one at a time (weighted by their tokens)."""
    from teacher_agreement import teacher_agreement

    row = {}
    for name, ids in texts.items():
        result = teacher_agreement(student, teacher, ids, batch_size=2, buckets=1)
        row[name] = {key: result[key] for key in ("kl", "top1", "nll_student", "nll_teacher", "tokens")}
    sums = {"kl": 0.0, "top1": 0.0, "nll_student": 0.0, "nll_teacher": 0.0}
    tokens, word_kl, word_gap = 0, 0.0, 0.0
    for ids, word_tokens in passages:
        result = teacher_agreement(student, teacher, ids, batch_size=1, buckets=1)
        for key in sums:
            sums[key] += result[key] * result["tokens"]
        tokens += result["tokens"]
        kl, gap = last_word(student, teacher, ids, word_tokens)
        word_kl += kl
        word_gap += gap
    row["lambada"] = {**{key: value / tokens for key, value in sums.items()}, "tokens": tokens,
                      "last_word_kl": word_kl / len(passages), "last_word_nll_gap": word_gap / len(passages)}
    return row


def table(report: dict) -> str:
    lines = ["| checkpoint | KL trained | KL unseen | KL LAMBADA | LAMBADA / unseen | last word: KL | last word: NLL gap | top-1 trained / unseen / LAMBADA |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, row in report["rows"].items():
        t, u, lam = row["trained"], row["unseen"], row["lambada"]
        lines.append(f"| {name} | {t['kl']:.4f} | {u['kl']:.4f} | {lam['kl']:.4f} | {lam['kl'] / u['kl']:.2f} | "
                     f"{lam['last_word_kl']:.3f} | {lam['last_word_nll_gap']:+.3f} | "
                     f"{t['top1']:.1%} / {u['top1']:.1%} / {lam['top1']:.1%} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoints", nargs="+", help="NAME=CKPT: adapted (or zero-shot) checkpoints of the dense model")
    parser.add_argument("--name", default="levers", help="the JSON file's name")
    parser.add_argument("--dense", type=Path, default=None, help="dense checkpoint (default: ladderize pull smollm2-135m)")
    parser.add_argument("--seqs", type=int, default=8, help="512-token sequences of the trained and the unseen text")
    parser.add_argument("--passages", type=int, default=100, help="LAMBADA passages from 1,000 on")
    from adapt_common import dense_source, named_checkpoints, parse_args

    args = parse_args(parser)
    checkpoints = named_checkpoints(args.checkpoints)  # refused before any model loads
    if args.seqs < 1 or args.passages < 1:
        raise SystemExit(f"--seqs and --passages must be at least 1, got {args.seqs} and {args.passages}")
    from transformers import AutoTokenizer

    from adapt_recovery import FINAL_LAMBADA, save_report, training_sequences, wikitext_eval_ids
    from ladderize.checkpoint.io import load_model

    dense = args.dense or dense_source()
    tokenizer = AutoTokenizer.from_pretrained(dense)
    unseen, unseen_label = wikitext_eval_ids(tokenizer, "tune", args.seqs, None)
    texts = {"trained": training_sequences(tokenizer)[: args.seqs], "unseen": unseen}
    passages = lambada_windows(tokenizer, FINAL_LAMBADA, args.passages)
    teacher = load_model(dense).eval()
    report = {"texts": {"trained": f"wikitext2-heldout sequences 0..{args.seqs} x 512", "unseen": unseen_label,
                        "lambada": f"LAMBADA (OpenAI) passages {FINAL_LAMBADA}..{FINAL_LAMBADA + len(passages)}"},
              "rows": {}}
    for name, path in checkpoints:
        print(f"measuring {name}", flush=True)
        report["rows"][name] = {"checkpoint": path, **measure(load_model(path).eval(), teacher, texts, passages)}
    out = RESULTS / f"{args.name}.json"
    save_report(report, out)
    print(table(report))
    print(f"-> {out}")


if __name__ == "__main__":
    main()
