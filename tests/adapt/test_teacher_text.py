"""``ladderize sample``: calibration text sampled from the dense teacher, resumable byte for byte."""

from __future__ import annotations

import json
import signal

from ladderize.adapt import teacher_text
from ladderize.corpus.windows import pack_tokens
from ladderize.errors import Interrupted
from tests.cli_helpers import error_lines, run_cli

FAST = ["--new-tokens", 8, "--batch-size", 2]


def records(path) -> list[str]:
    return [json.loads(line)["text"] for line in path.read_text(encoding="utf-8").splitlines()]


def test_sample_writes_records_provenance_and_adapt_reads_them(dense_dir, tmp_path, capsys, monkeypatch):
    out = tmp_path / "calib.jsonl"
    code, stdout, stderr = run_cli(["sample", dense_dir, out, "--sequences", 5, *FAST], capsys, monkeypatch)
    assert code == 0, stderr
    assert "sampled 5 records" in stdout
    texts = records(out)
    prompts = teacher_text.story_prompts(5, 0)
    assert len(texts) == 5 and all(text.startswith(prompt) for text, prompt in zip(texts, prompts))
    provenance = json.loads((tmp_path / "calib.jsonl.json").read_text())
    assert provenance["source"] == str(dense_dir) and provenance["prompts"] == "stories" and provenance["sequences"] == 5
    assert 0 < provenance["tokens_generated"] <= 5 * 8 and provenance["seconds"] > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["calib.jsonl", "calib.jsonl.json"]  # no partial or sidecar left
    from ladderize.checkpoint.io import load_tokenizer

    assert pack_tokens(str(out), load_tokenizer(dense_dir), seq_len=16).shape[1] == 16

    before = out.read_bytes()
    code, _, stderr = run_cli(["sample", dense_dir, out, "--sequences", 5, *FAST], capsys, monkeypatch)
    assert code == 2 and len(error_lines(stderr)) == 1 and "already exists; pass --force" in stderr
    code, _, stderr = run_cli(["sample", dense_dir, out, "--sequences", 5, *FAST, "--force"], capsys, monkeypatch)
    assert code == 0, stderr
    assert out.read_bytes() == before  # the same seed gives the same records


def test_resume_writes_the_same_bytes_as_an_uninterrupted_run(dense_dir, tmp_path, capsys, monkeypatch):
    whole, resumed = tmp_path / "whole.jsonl", tmp_path / "resumed.jsonl"
    code, _, stderr = run_cli(["sample", dense_dir, whole, "--sequences", 4, *FAST], capsys, monkeypatch)
    assert code == 0, stderr

    real = teacher_text.sample_batch

    def interrupted_at_second_batch(model, tokenizer, prompts, settings, index):
        if index == 1:
            raise Interrupted(signal.SIGINT)
        return real(model, tokenizer, prompts, settings, index)

    monkeypatch.setattr(teacher_text, "sample_batch", interrupted_at_second_batch)
    code, _, stderr = run_cli(["sample", dense_dir, resumed, "--sequences", 4, *FAST], capsys, monkeypatch)
    assert code == 130 and "--resume" in stderr
    partial = tmp_path / "resumed.jsonl.partial"
    assert not resumed.exists() and len(partial.read_text().splitlines()) == 2
    monkeypatch.setattr(teacher_text, "sample_batch", real)
    with partial.open("a") as handle:
        handle.write('{"text": "a line cut by the kil')  # an incomplete trailing line is dropped

    code, _, stderr = run_cli(["sample", dense_dir, resumed, "--sequences", 4, *FAST], capsys, monkeypatch)
    assert code == 2 and len(error_lines(stderr)) == 1 and "--resume" in stderr
    code, _, stderr = run_cli(["sample", dense_dir, resumed, "--sequences", 4, *FAST, "--temperature", 0.7, "--resume"], capsys, monkeypatch)
    assert code == 2 and len(error_lines(stderr)) == 1 and "temperature" in stderr
    code, _, stderr = run_cli(["sample", dense_dir, resumed, "--sequences", 4, *FAST, "--resume"], capsys, monkeypatch)
    assert code == 0, stderr
    assert "resuming" in stderr and "at 2/4 records" in stderr
    assert resumed.read_bytes() == whole.read_bytes()
    assert not partial.exists() and not (tmp_path / "resumed.jsonl.partial.json").exists()
    assert json.loads((tmp_path / "resumed.jsonl.json").read_text())["tokens_generated"] == json.loads(
        (tmp_path / "whole.jsonl.json").read_text())["tokens_generated"]


def test_prompts_file_lines_are_cycled(dense_dir, tmp_path, capsys, monkeypatch):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Once upon a time\n\nThe ship sank\n")
    out = tmp_path / "out.jsonl"
    code, _, stderr = run_cli(["sample", dense_dir, out, "--prompts", prompts, "--sequences", 3, *FAST], capsys, monkeypatch)
    assert code == 0, stderr
    starts = ["Once upon a time", "The ship sank", "Once upon a time"]
    assert [text[:len(start)] for text, start in zip(records(out), starts)] == starts


def test_refusals_are_one_line(dense_dir, ladder_dir, tmp_path, capsys, monkeypatch):
    cases = [
        ([ladder_dir, tmp_path / "a.jsonl"], "converted checkpoint"),
        ([tmp_path / "missing", tmp_path / "b.jsonl"], "not found"),
        ([dense_dir, tmp_path / "c.jsonl", "--prompts", tmp_path / "nope.txt"], "--prompts must be"),
        ([dense_dir, tmp_path / "d.jsonl", "--top-p", 0], "--top-p"),
    ]
    for args, message in cases:
        code, _, stderr = run_cli(["sample", *args, *FAST], capsys, monkeypatch)
        assert code == 2 and len(error_lines(stderr)) == 1 and message in stderr, (args, stderr)
    assert not any(p.name.endswith((".jsonl", ".partial", ".json")) for p in tmp_path.iterdir())
