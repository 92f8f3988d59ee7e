"""The token store (``corpus/token_store.py``), the windows read from it (``corpus/windows.py``) and the batches a
step takes of them (``adapt/plan/batches.py``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from ladderize.corpus import token_store
from ladderize.corpus.windows import TokenWindows, pack_tokens, token_windows
from ladderize.adapt.plan.batches import StepSplit, batch_order
from ladderize.corpus.token_store import (
    ensure_store, is_store, open_store, split_document, splittable, store_key, tokenizer_identity,
)
from ladderize.errors import LadderizeError
from tests.adapt.conftest import char_tokenizer
from tests.adapt.test_batches import batch_rows

DOCS = ["abc def", "   ", "ghij\nklm", "nopq rstuv wxyz " * 5, "A B C"]


def jsonl(path: Path, documents: list[str]) -> Path:
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in documents))
    return path


def reference_stream(documents: list[str], tokenizer) -> list[int]:
    """What the store must hold: each non-blank document's own ids, EOS between two documents."""
    stream: list[int] = []
    for text in documents:
        if not text.strip():
            continue
        if stream:
            stream.append(tokenizer.eos_token_id)
        stream.extend(tokenizer(text, add_special_tokens=False)["input_ids"])
    return stream


@pytest.mark.parametrize("workers", [1, 2])
def test_store_holds_the_tokenizers_ids_with_boundaries(tmp_path, workers):
    tokenizer = char_tokenizer()
    store = ensure_store(str(jsonl(tmp_path / "d.jsonl", DOCS)), tokenizer, root=tmp_path / "stores", workers=workers)
    expected = reference_stream(DOCS, tokenizer)
    assert store.meta.dtype == "uint16" and store.tokens.dtype == np.uint16  # 100 ids fit
    assert store.tokens.tolist() == expected
    assert store.meta.documents == 4 and store.meta.documents_read == 5 and store.meta.complete
    starts = store.doc_starts().tolist()
    lengths = [len(tokenizer(d, add_special_tokens=False)["input_ids"]) for d in DOCS if d.strip()]
    assert starts == [0] + list(np.cumsum([n + 1 for n in lengths[:-1]]))  # each start after its separator
    assert all(expected[s - 1] == tokenizer.eos_token_id for s in starts[1:])


def wide_tokenizer():
    """A character tokenizer with 70,000 ids (beyond uint16): the store must take uint32."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "</s>": 1}
    for code in range(32, 127):
        vocab[chr(code)] = len(vocab)
    for extra in range(70_000 - len(vocab)):
        vocab[f"<extra{extra}>"] = len(vocab)
    vocab["z"], vocab[f"<extra{69_000}>"] = vocab[f"<extra{69_000}>"], vocab["z"]  # 'z' gets a large id
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="</s>", unk_token="<unk>")


def test_a_vocabulary_beyond_uint16_is_stored_as_uint32(tmp_path):
    tokenizer = wide_tokenizer()
    store = ensure_store(str(jsonl(tmp_path / "d.jsonl", ["zzz abc", "z"])), tokenizer, root=tmp_path)
    assert store.meta.dtype == "uint32"
    assert store.tokens.tolist() == reference_stream(["zzz abc", "z"], tokenizer)
    assert max(store.tokens.tolist()) > 65_535


def test_reused_then_invalidated_by_a_changed_file_or_another_tokenizer(tmp_path):
    data = jsonl(tmp_path / "d.jsonl", DOCS)
    first = ensure_store(str(data), char_tokenizer(), root=tmp_path / "s")
    stamp = (first.path / "tokens.bin").stat().st_mtime_ns
    again = ensure_store(str(data), char_tokenizer(), root=tmp_path / "s")
    assert again.path == first.path and (again.path / "tokens.bin").stat().st_mtime_ns == stamp  # not rebuilt
    jsonl(data, DOCS + ["more text"])
    changed = ensure_store(str(data), char_tokenizer(), root=tmp_path / "s")
    assert changed.path != first.path and changed.tokens.tolist() == reference_stream(DOCS + ["more text"], char_tokenizer())
    assert store_key(str(data), wide_tokenizer()) != store_key(str(data), char_tokenizer())


def test_a_store_built_with_another_tokenizer_is_refused_in_one_line(tmp_path):
    store = ensure_store(str(jsonl(tmp_path / "d.jsonl", DOCS)), char_tokenizer(), out=tmp_path / "store")
    assert is_store(tmp_path / "store")
    with pytest.raises(LadderizeError) as excinfo:
        pack_tokens(str(store.path), wide_tokenizer(), 4)
    assert "another tokenizer" in str(excinfo.value) and "\n" not in str(excinfo.value)
    assert torch.equal(pack_tokens(str(store.path), char_tokenizer(), 4),
                       pack_tokens(str(tmp_path / "d.jsonl"), char_tokenizer(), 4))  # a store folder reads as its text


def test_a_budget_builds_a_prefix_that_a_larger_budget_continues(tmp_path, monkeypatch):
    monkeypatch.setattr(token_store, "BATCH_CHARS", 100)  # a budget stops at the end of a batch
    documents = [f"document number {i} " * 3 for i in range(40)]
    data = str(jsonl(tmp_path / "d.jsonl", documents))
    whole = reference_stream(documents, char_tokenizer())
    part = ensure_store(data, char_tokenizer(), root=tmp_path / "s", min_tokens=200)
    assert not part.meta.complete and 200 <= part.num_tokens < len(whole)
    assert part.tokens.tolist() == whole[: part.num_tokens]
    assert pack_tokens(data, char_tokenizer(), 8, max_tokens=100).shape == (13, 8)  # from the prefix: no rebuild
    full = ensure_store(data, char_tokenizer(), root=tmp_path / "s")
    assert full.path == part.path and full.meta.complete and full.tokens.tolist() == whole


def test_windows_cut_the_stream_and_batch_at_reads_the_epoch_order(tmp_path):
    data = str(jsonl(tmp_path / "d.jsonl", [f"text {i} " * 7 for i in range(30)]))
    stream = torch.tensor(reference_stream([f"text {i} " * 7 for i in range(30)], char_tokenizer()))
    windows = token_windows(data, char_tokenizer(), 16)
    assert len(windows) == len(stream) // 16
    dense = stream[: len(windows) * 16].view(-1, 16)
    assert torch.equal(windows.all(), dense)
    for step in range(3 * len(windows) // 4):  # several epochs: each row is the epoch's permutation at its offset
        rows = [batch_order(len(windows), p // len(windows), 5)[p % len(windows)] for p in range(step * 4, step * 4 + 4)]
        assert torch.equal(windows.rows(batch_rows(len(windows), step, 4, 5)), dense[torch.stack(rows)])


def test_process_shares_are_disjoint_and_together_the_single_process_order():
    """The rows ``StepSplit`` gives each process and micro-batch: together, each step's rows of one process taking the
    whole batch, none twice and none left out (epochs wrap: 5 steps of 24 rows over 50 sequences)."""
    batch, accum, world, steps, sequences = 24, 2, 4, 5, 50
    split = StepSplit(batch, world, accum)
    for step in range(steps):
        shares = [row for rank in range(world) for micro in range(accum) for row in split.rows(sequences, step, micro, rank, 9)]
        assert sorted(shares) == sorted(batch_rows(sequences, step, batch, 9))  # as a multiset: no row twice, none left


def test_windows_memory_does_not_grow_with_the_corpus(tmp_path):
    """A window set holds memory maps and, for a mixture, 8 bytes of order per sequence: never the tokens."""
    data = str(jsonl(tmp_path / "d.jsonl", ["x" * 4000] * 50))
    windows = token_windows(data, char_tokenizer(), 8)
    assert isinstance(windows.stores[0].tokens, np.memmap) and windows._part is None
    mixed = token_windows(f"{data}*1+{data}*1", char_tokenizer(), 8)
    assert isinstance(mixed, TokenWindows) and mixed._part.nbytes == 8 * len(mixed)


def test_blank_or_empty_corpora_are_one_line(tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(LadderizeError, match="is empty"):
        ensure_store(str(tmp_path / "empty.jsonl"), char_tokenizer(), root=tmp_path / "s")
    jsonl(tmp_path / "blank.jsonl", ["  ", "\n\n"])
    with pytest.raises(LadderizeError, match="holds no text"):
        ensure_store(str(tmp_path / "blank.jsonl"), char_tokenizer(), root=tmp_path / "s")
    assert not list((tmp_path / "s").glob("*/store.json"))  # nothing committed that a later run could reuse


def test_a_full_disk_is_one_line_and_leaves_the_committed_prefix(tmp_path, monkeypatch):
    data = str(jsonl(tmp_path / "d.jsonl", [f"line {i} " * 20 for i in range(200)]))
    monkeypatch.setattr(token_store, "COMMIT_TOKENS", 1000)
    monkeypatch.setattr(token_store, "BATCH_CHARS", 500)
    real = token_store._commit
    commits = []

    def commit_then_fill(*args):
        real(*args)
        commits.append(1)
        if len(commits) == 2:
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(token_store, "_commit", commit_then_fill)
    with pytest.raises(LadderizeError) as excinfo:
        ensure_store(data, char_tokenizer(), out=tmp_path / "store")
    assert "disk full" in str(excinfo.value) and "\n" not in str(excinfo.value)
    monkeypatch.setattr(token_store, "_commit", real)
    committed = token_store.read_meta(tmp_path / "store")
    assert committed is not None and not committed.complete and committed.tokens > 0
    whole = reference_stream([f"line {i} " * 20 for i in range(200)], char_tokenizer())
    assert ensure_store(data, char_tokenizer(), out=tmp_path / "store").tokens.tolist() == whole  # continued


KILLED_BUILD = """
import os, signal, sys
from ladderize.corpus import token_store
from ladderize.synthetic import char_tokenizer
token_store.COMMIT_TOKENS, token_store.BATCH_CHARS = 2000, 2000
batches = [0]
def progress(documents, tokens, chars):
    batches[0] += 1
    if batches[0] == 7:  # killed outright, mid-build: after some commits, with bytes written after the last
        os.kill(os.getpid(), signal.SIGKILL)
token_store.ensure_store(sys.argv[1], char_tokenizer(), out=__import__("pathlib").Path(sys.argv[2]), workers=1, progress=progress)
"""


def test_a_killed_build_leaves_no_corrupt_store_and_continues(tmp_path):
    documents = [f"passage {i}: " + "lorem ipsum " * 30 for i in range(300)]
    data = str(jsonl(tmp_path / "d.jsonl", documents))
    script = tmp_path / "build.py"
    script.write_text(KILLED_BUILD)
    done = subprocess.run([sys.executable, str(script), data, str(tmp_path / "store")], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert done.returncode == -signal.SIGKILL, done.stderr
    meta = token_store.read_meta(tmp_path / "store")
    assert meta is not None and not meta.complete and meta.tokens > 0
    on_disk = (tmp_path / "store" / "tokens.bin").stat().st_size
    assert on_disk > meta.tokens * 2  # bytes written after the last commit: cut off, never read
    whole = reference_stream(documents, char_tokenizer())
    assert open_store(tmp_path / "store").tokens.tolist() == whole[: meta.tokens]
    assert ensure_store(data, char_tokenizer(), out=tmp_path / "store").tokens.tolist() == whole


def test_sigterm_ends_the_tokenize_command_and_a_rerun_completes(tmp_path):
    documents = [f"passage {i}: " + "lorem ipsum dolor " * 40 for i in range(3000)]
    data = jsonl(tmp_path / "d.jsonl", documents)
    tok = tmp_path / "tok"
    char_tokenizer().save_pretrained(tok)
    env = {**os.environ, "LADDERIZE_PROGRESS_INTERVAL": "0", "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "ladderize.cli", "tokenize", str(data), "--tokenizer", str(tok), "--out",
               str(tmp_path / "store"), "--workers", "2"]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in process.stdout:
        if line.startswith("tokenize "):  # the first progress line: the build is under way
            process.send_signal(signal.SIGTERM)
            break
    output = process.communicate(timeout=120)[0]
    assert process.returncode == 143 and "interrupted" in output, output
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert open_store(tmp_path / "store").tokens.tolist() == reference_stream(documents, char_tokenizer())


def test_huge_documents_are_cut_only_where_the_ids_stay_the_same(smollm2_dir, bundled_data_dir, monkeypatch):
    from transformers import AutoTokenizer

    from ladderize.eval.perplexity import wikitext2_valid_path

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    assert splittable(tokenizer)  # byte-level BPE without a prefix space
    text = wikitext2_valid_path().read_text(encoding="utf-8")
    pieces = split_document(text, 4096, token_store.cut_checker(tokenizer))
    assert len(pieces) > 10 and "".join(pieces) == text
    assert all(p.endswith("\n") for p in pieces[:-1])
    whole = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert sum((tokenizer(p, add_special_tokens=False)["input_ids"] for p in pieces), []) == whole
    monkeypatch.setattr(token_store, "SPLIT_BYTES", 4096)
    store = ensure_store(str(wikitext2_valid_path()), tokenizer, root=bundled_data_dir.parent / "never-used",
                         out=Path(os.environ[token_store.ROOT_ENV]) / "wiki-split")
    assert store.tokens.tolist() == whole


def test_a_prefix_space_tokenizer_takes_its_documents_whole():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel(vocab={"<unk>": 0, "▁a": 1}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    assert not splittable(PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>"))
    assert splittable(char_tokenizer())
    assert tokenizer_identity(char_tokenizer())["sha256"] == tokenizer_identity(char_tokenizer())["sha256"]


def test_tokenize_command_builds_reuses_and_refuses(tmp_path):
    data = jsonl(tmp_path / "d.jsonl", DOCS * 20)
    tok = tmp_path / "tok"
    char_tokenizer().save_pretrained(tok)
    command = [sys.executable, "-m", "ladderize.cli", "tokenize", str(data), "--tokenizer", str(tok), "--json", str(tmp_path / "r.json")]
    first = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    record = json.loads((tmp_path / "r.json").read_text())
    assert record["tokens"] == len(reference_stream(DOCS * 20, char_tokenizer())) and record["dtype"] == "uint16"
    assert record["complete"] and not record["reused"] and Path(record["path"]).parent == Path(os.environ[token_store.ROOT_ENV])
    assert f"{record['tokens']:,} tokens" in first.stdout
    second = subprocess.run(command + ["--force"], capture_output=True, text=True, timeout=120)
    assert second.returncode == 0 and "reused" not in second.stdout  # --force builds again
    third = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert "reused" in third.stdout
    (tmp_path / "not-a-store").mkdir()
    (tmp_path / "not-a-store" / "keep.txt").write_text("mine")
    refused = subprocess.run(command[:-2] + ["--out", str(tmp_path / "not-a-store")], capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "not a token store" in refused.stderr
    assert (tmp_path / "not-a-store" / "keep.txt").read_text() == "mine"


def store_of(text_file: Path, tmp_path: Path) -> Path:
    return ensure_store(str(text_file), char_tokenizer(), out=tmp_path / "store").path


def test_every_stage_reads_a_store_as_it_reads_its_text(ladder_dir, spd_dir, dense_dir, text_file, tmp_path):
    """joint (kd), sequential, sensitivity and head grouping give the same results from a store as from its text."""
    from ladderize.adapt.plan.config import AdaptConfig
    from ladderize.convert.convert_support import head_group_checkpoint
    from ladderize.adapt.stage_run import adapt
    from ladderize.convert.sensitivity import checkpoint_sensitivity
    from ladderize.model import LayerMode
    from ladderize.checkpoint.io import read_provenance
    import shutil

    store = str(store_of(text_file, tmp_path))
    for settings in (dict(objectives="kd", tokens=4 * 64, seq_len=32, batch_size=2),
                     dict(objectives="local", local_schedule="sequential", tokens=4 * 32, seq_len=32, batch_size=2, epochs=1)):
        curves = []
        for name, data in (("text", str(text_file)), ("store", store)):
            result = adapt(AdaptConfig.from_flat(checkpoint=str(ladder_dir), out=str(tmp_path / f"{name}-{settings['objectives']}"),
                                       data=data, lr=1e-3, **settings))
            curves.append([{k: v for k, v in r.items() if k.startswith("loss")} for r in result.curve])
        assert curves[0] == curves[1]
    reports = [checkpoint_sensitivity(str(dense_dir), LayerMode.SPD, 3, data, samples=2, seq_len=32, layers="2:4")
               for data in (str(text_file), store)]
    assert reports[0].dense_ppl == reports[1].dense_ppl and reports[0].blocks == reports[1].blocks
    orders = []
    for name, data in (("text", str(text_file)), ("store", store)):
        copy = tmp_path / f"grouped-{name}"
        shutil.copytree(spd_dir, copy)
        orders.append(head_group_checkpoint(copy, str(dense_dir), data=data, samples=2, seq_len=32))
    assert orders[0] == orders[1]


def test_adapt_refuses_a_store_of_another_tokenizer_before_writing_anything(ladder_dir, tmp_path):
    from ladderize.adapt.plan.config import AdaptConfig
    from ladderize.adapt.stage_run import adapt

    store = ensure_store(str(jsonl(tmp_path / "d.jsonl", DOCS * 50)), wide_tokenizer(), out=tmp_path / "wide-store")
    config = AdaptConfig.from_flat(checkpoint=str(ladder_dir), out=str(tmp_path / "out"), data=str(store.path), objectives="kd",
                         tokens=64, seq_len=16)
    with pytest.raises(LadderizeError, match="another tokenizer"):
        adapt(config)
    assert not config.resolved_run_dir().exists() and not (tmp_path / "out").exists()
