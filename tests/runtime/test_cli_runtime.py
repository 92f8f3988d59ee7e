"""``ladderize generate`` and ``ladderize bench`` through the CLI entry point, and their one-line errors."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from ladderize import cli
from tests.runtime.runtime_helpers import TINY_TP23, hf_greedy, save_char_tokenizer, save_tiny, shape_for


def run_cli(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", ["ladderize", *map(str, args)])
    code = 0
    try:
        cli.main()
    except SystemExit as exc:
        code = exc.code or 0
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture(scope="module")
def chat_ckpt(tmp_path_factory):
    """A TP-2 tiny ladder/spd checkpoint with a character tokenizer, and its in-memory model."""
    path = tmp_path_factory.mktemp("cli") / "ckpt"
    model = save_tiny(path, seed=3, **shape_for(2), layer_modes=["dense", "ladder", "spd", "ladder"], spd_tp_size=2)
    save_char_tokenizer(path)
    return path, model


def test_generate_json_matches_transformers(chat_ckpt, monkeypatch, capsys):
    path, model = chat_ckpt
    code, out, err = run_cli(
        monkeypatch, capsys, "generate", path, "--prompt", "Hello, ladder!", "--max-new-tokens", "6", "--tp", "2", "--json"
    )
    assert code == 0, err
    result = json.loads(out)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    ids = torch.tensor([tokenizer("Hello, ladder!")["input_ids"]])
    assert result["tokens"] == hf_greedy(model, ids, 6)[0]
    assert result["text"] == tokenizer.decode(result["tokens"], skip_special_tokens=True)


def test_tp_that_does_not_divide_heads_is_one_line(chat_ckpt, monkeypatch, capsys):
    code, out, err = run_cli(monkeypatch, capsys, "generate", chat_ckpt[0], "--prompt", "hi", "--tp", "3", "--oversubscribe")
    assert code == 2 and "does not divide" in err and len(err.strip().splitlines()) == 1


def test_more_ranks_than_cores_needs_oversubscribe(tmp_path, monkeypatch, capsys):
    # a model TP 3 can run: the checkpoint's own TP checks come first, before the runtime (and torch) loads
    path = tmp_path / "dense"
    save_tiny(path, **TINY_TP23)
    save_char_tokenizer(path)
    monkeypatch.setattr("ladderize.runtime.host.cpu_cores", lambda: 2)
    code, out, err = run_cli(monkeypatch, capsys, "generate", path, "--prompt", "hi", "--tp", "3")
    assert code == 2 and "--oversubscribe" in err and len(err.strip().splitlines()) == 1


def test_spd_mismatch_is_refused(tmp_path, monkeypatch, capsys):
    path = tmp_path / "spd3"
    save_tiny(path, **TINY_TP23, layer_modes=["dense", "spd", "spd", "dense"], spd_tp_size=3)
    save_char_tokenizer(path)
    code, out, err = run_cli(monkeypatch, capsys, "generate", path, "--prompt", "hi", "--tp", "2")
    assert code == 2 and "converted for TP=3" in err and "--allow-spd-mismatch" in err
    code, out, err = run_cli(monkeypatch, capsys, "bench", path, "--tp", "2", "--schedules", "native")
    assert code == 2 and "--allow-spd-mismatch" in err


def test_bench_writes_rows_and_comparisons(tmp_path, monkeypatch, capsys):
    out_file = tmp_path / "bench.json"
    code, out, err = run_cli(
        monkeypatch, capsys, "bench", "--synthetic", "tiny", "--ladder", "all", "--tp", "2", "--batch", "1,2",
        "--prompt", "8", "--gen", "4", "--warmup", "1", "--repeats", "2", "--json", out_file,
    )
    assert code == 0, err
    data = json.loads(out_file.read_text())
    rows = data["rows"]
    assert {(r["schedule"], r["batch"]) for r in rows} == {
        (s, b) for s in ("native", "dense", "upper-bound", "domino") for b in (1, 2)
    }
    keys = {"schedule", "tp", "batch", "prompt_len", "decode_steps", "prefill_s", "decode_s_per_token", "decode_tokens_per_s",
            "e2e_tokens_per_s", "allreduces_per_decode_step", "decode_allreduce_share", "decode_speedup_vs_dense",
            "e2e_speedup_vs_dense", "decode_gap_closed"}
    assert all(keys <= set(r) for r in rows)
    by = {(r["schedule"], r["batch"]): r for r in rows}
    assert by[("native", 1)]["allreduces_per_decode_step"] == 8 and by[("upper-bound", 1)]["allreduces_per_decode_step"] == 0
    assert by[("domino", 2)]["allreduces_per_decode_step"] == 16 and by[("dense", 2)]["decode_speedup_vs_dense"] == 1.0
    assert data["record"] == "ladderize-bench" and data["layout"] == "ladder 0:4"
    assert "synthetic:tiny" in out  # the rich table's title


def test_bench_rejects_two_sources(tmp_path, monkeypatch, capsys):
    code, out, err = run_cli(monkeypatch, capsys, "bench", tmp_path, "--synthetic", "tiny")
    assert code == 2 and "not both" in err
    code, out, err = run_cli(monkeypatch, capsys, "bench", "--synthetic", "no-such-shape")
    assert code == 2 and "preset" in err


def test_bench_off_a_terminal_says_what_it_runs(monkeypatch, capsys):
    """Issue 37 item 12: off a terminal the spinner shows nothing, and bench was silent for 93 s."""
    code, out, err = run_cli(monkeypatch, capsys, "bench", "--synthetic", "tiny", "--tp", "1", "--batch", "1", "--prompt", "4",
                             "--gen", "2", "--warmup", "0", "--repeats", "1", "--schedules", "native,dense")
    assert code == 0, err
    assert "benchmarking synthetic:tiny at TP 1: 2 schedule(s) x 1 batch size(s) x 1 round(s)" in err.replace("\n", " ")


def test_sample_says_how_much_it_will_sample(tmp_path, monkeypatch, capsys):
    """Issue 37 item 12: sample's defaults (200 x 512 tokens) take hours on a CPU, and it gave no estimate."""
    path = tmp_path / "dense"
    save_tiny(path, **TINY_TP23)
    save_char_tokenizer(path)
    code, out, err = run_cli(monkeypatch, capsys, "sample", path, tmp_path / "s.jsonl", "--sequences", "2", "--new-tokens", "3",
                             "--batch-size", "2")
    assert code == 0, err
    assert "sampling up to 6 tokens (2 records x up to 3) in batches of 2" in err.replace("\n", " ")
