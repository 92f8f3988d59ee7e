"""Where an adapted checkpoint's loss gap to its dense teacher sits: on words copied from the context, near or far.

Each predicted token of unseen WikiText-2 (``adapt_recovery``'s tune window) and of LAMBADA passages 1,000.. falls in
one group: ``near`` (a word of four letters or more, not a function word, whose previous occurrence in the window is
under ``--distance`` tokens before the position that predicts it), ``far`` (the same, ``--distance`` or more) or
``other``. Per group: the mean KL(teacher || student) and the student's NLL minus the teacher's. LAMBADA's last word
appears earlier in its passage, as the same string, in 49% of the 5,153 passages, 18 words back or more in 42%.

    taskset -c 1 python lab/copied_word_gap.py bare=OUT seqonly=OUT2 --threads 1

writes ``lab/results/copied_word_gap.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "benchmarks"))
sys.path.insert(0, str(HERE.parent))

FUNCTION_WORDS = set(
    "that this with from have were they their there what when which would been said into more some them then than also "
    "only other about after could before these those where while will your such each over very just most like upon "
    "many much even here should being does made make under because through".split())
GROUPS = ("near", "far", "other")


def copied_words(tokenizer) -> list[bool]:
    """Per token id: whether it starts a word of four letters or more that is not a function word."""
    marks = []
    for index in range(len(tokenizer)):
        piece = tokenizer.convert_ids_to_tokens(index) or ""
        word = piece[1:].lower()
        marks.append(piece[:1] in ("\u0120", "\u2581") and word.isalpha() and len(word) >= 4 and word not in FUNCTION_WORDS)
    return marks


def groups(ids: list[int], is_word: list[bool], distance: int) -> list[str]:
    """The group of each predicted position ``t`` (predicting ``ids[t + 1]``)."""
    last, out = {}, []
    for t in range(len(ids) - 1):
        last[ids[t]] = t
        target = ids[t + 1]
        if target in last and is_word[target]:
            out.append("near" if t - last[target] < distance else "far")
        else:
            out.append("other")
    return out


def measure(student, teacher, texts: dict, is_word: list[bool], distance: int) -> dict:
    from adapt_domain_gap import token_gaps

    row = {}
    for name, windows in texts.items():
        sums = {group: [0.0, 0.0, 0] for group in GROUPS}
        for ids in windows:
            kl, gap = (values.tolist() for values in token_gaps(student, teacher, ids))
            for group, k, g in zip(groups(ids[0].tolist(), is_word, distance), kl, gap):
                sums[group][0] += k
                sums[group][1] += g
                sums[group][2] += 1
        row[name] = {group: {"kl": s[0] / s[2] if s[2] else None, "nll_gap": s[1] / s[2] if s[2] else None,
                             "tokens": s[2]} for group, s in sums.items()}  # None: no token of that group
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoints", nargs="+", help="NAME=CKPT")
    parser.add_argument("--seqs", type=int, default=4, help="512-token sequences of unseen WikiText-2")
    parser.add_argument("--passages", type=int, default=100, help="LAMBADA passages from 1,000 on")
    parser.add_argument("--distance", type=int, default=24, help="tokens back from which a copied word is far")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "copied_word_gap.json")
    from adapt_common import dense_source, named_checkpoints, parse_args

    args = parse_args(parser)
    checkpoints = named_checkpoints(args.checkpoints)  # refused before any model loads
    if min(args.seqs, args.passages, args.distance) < 1:
        raise SystemExit(f"--seqs, --passages and --distance must be at least 1, got {args.seqs}, {args.passages}, {args.distance}")
    from transformers import AutoTokenizer

    from adapt_domain_gap import lambada_windows
    from adapt_recovery import FINAL_LAMBADA, save_report, wikitext_eval_ids
    from ladderize.checkpoint.io import load_model

    dense = dense_source()
    tokenizer = AutoTokenizer.from_pretrained(dense)
    unseen, unseen_label = wikitext_eval_ids(tokenizer, "tune", args.seqs, None)
    texts = {"wikitext": [unseen[i: i + 1] for i in range(unseen.shape[0])],
             "lambada": [ids for ids, _ in lambada_windows(tokenizer, FINAL_LAMBADA, args.passages)]}
    is_word = copied_words(tokenizer)
    teacher = load_model(dense).eval()
    report = {"texts": {"wikitext": unseen_label, "lambada": f"LAMBADA passages {FINAL_LAMBADA}..{FINAL_LAMBADA + args.passages}"},
              "distance": args.distance, "rows": {}}
    for name, path in checkpoints:
        print(f"measuring {name}", flush=True)
        report["rows"][name] = {"checkpoint": path, **measure(load_model(path).eval(), teacher, texts, is_word, args.distance)}
        save_report(report, args.out)
    print("| checkpoint | text | NLL gap: near / far / other | KL: near / far / other | far tokens |")
    print("| --- | --- | --- | --- | --- |")
    for name, row in report["rows"].items():
        for text in texts:
            cells = row[text]
            gaps = " / ".join("-" if cells[g]["tokens"] == 0 else f"{cells[g]['nll_gap']:+.3f}" for g in GROUPS)
            kls = " / ".join("-" if cells[g]["tokens"] == 0 else f"{cells[g]['kl']:.3f}" for g in GROUPS)
            print(f"| {name} | {text} | {gaps} | {kls} | {cells['far']['tokens']} |")
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
