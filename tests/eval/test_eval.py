"""`ladderize eval` on a tiny model and tiny local tasks: record, lm-eval equality, rolling perplexity, bad input."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch

from ladderize.errors import LadderizeError
from ladderize.eval.harness import evaluate_checkpoint, evaluate_model, load_tokenizer
from ladderize.eval.local_tasks import parse_task_list, build_tasks, split_documents

from .conftest import PASSAGES


def _metrics(results: dict) -> dict:
    """Every numeric entry of lm-eval's results dict, keyed (task, metric)."""
    return {(task, key): value for task, values in results.items() for key, value in values.items() if isinstance(value, (int, float))}


def direct_lm_eval(model, tokenizer, tasks: list[str], data_dir: Path, tmp_path: Path, limit: int, batch_size: int, **plan_kwargs) -> dict:
    """lm-eval as a user would call it: HFLM around a transformers model, TaskManager on the task YAMLs, simple_evaluate."""
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    include = build_tasks(tasks, data_dir, **plan_kwargs).write(tmp_path / "direct-tasks")
    manager = TaskManager(include_path=str(include))
    lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size)
    return simple_evaluate(model=lm, tasks=tasks, task_manager=manager, limit=limit, bootstrap_iters=1000, log_samples=False)["results"]


def test_eval_record_on_tiny_ladder(tiny_ladder_dir: Path, tiny_data_dir: Path):
    record = evaluate_checkpoint(
        tiny_ladder_dir, "lambada_openai,wikitext2_valid", limit=4, batch_size=4, data_dir=tiny_data_dir, chunk_chars=200
    )
    assert record["layout"] == "ladder 2:4"
    assert record["layers_converted"] == 2 and record["num_layers"] == 4
    assert record["allreduces_per_decode_step"] == 8 and record["overlappable_allreduces_per_decode_step"] == 4
    assert record["record"] == "ladderize-eval" and record["version"] == 2
    assert record["checkpoint"] == str(tiny_ladder_dir)
    results = record["results"]
    assert results["lambada_openai"]["sample_len"] == 4
    assert 0.0 <= results["lambada_openai"]["acc,none"] <= 1.0
    assert results["lambada_openai"]["perplexity,none"] > 1.0
    assert results["wikitext2_valid"]["word_perplexity,none"] > 1.0
    assert results["wikitext2_valid"]["bits_per_byte,none"] > 0.0
    assert record["data"]["lambada_openai"].endswith("lambada_openai/lambada_test.jsonl")
    assert record["lm_eval"]["n-samples"]["wikitext2_valid"]["effective"] == 4
    json.dumps(record)  # serializable as is


def test_bootstrap_runs_in_process(tiny_ladder_dir: Path, tiny_data_dir: Path, monkeypatch):
    """Bootstrapped standard errors come without lm-eval's forked Pool (a fork of a threaded process can hang);
    ``test_dense_equals_direct_lm_eval_tiny`` checks they equal the Pool's."""
    import multiprocessing
    import os

    def no_pool(*_args, **_kwargs):
        raise AssertionError("lm-eval's bootstrap forked a Pool")

    monkeypatch.setattr(multiprocessing, "Pool", no_pool)
    monkeypatch.delenv("DISABLE_MULTIPROC", raising=False)
    record = evaluate_checkpoint(tiny_ladder_dir, "lambada_openai", limit=4, batch_size=4, data_dir=tiny_data_dir)
    stderr = record["results"]["lambada_openai"]["perplexity_stderr,none"]
    assert isinstance(stderr, float) and stderr > 0.0  # bootstrapped (perplexity has no closed form)
    assert "DISABLE_MULTIPROC" not in os.environ  # the setting does not outlive the evaluation


def test_dense_equals_direct_lm_eval_tiny(tiny_dense_dir: Path, tiny_data_dir: Path, tmp_path: Path):
    """Our model loaded from a dense checkpoint scores exactly what lm-eval gives transformers' own Llama."""
    from transformers import LlamaForCausalLM

    tasks = ["lambada_openai", "wikitext2_valid"]
    ours = evaluate_checkpoint(tiny_dense_dir, tasks, limit=6, batch_size=3, data_dir=tiny_data_dir, chunk_chars=300)
    reference = LlamaForCausalLM.from_pretrained(str(tiny_dense_dir)).eval()
    direct = direct_lm_eval(reference, load_tokenizer(tiny_dense_dir), tasks, tiny_data_dir, tmp_path, limit=6, batch_size=3, chunk_chars=300)
    ours_metrics, direct_metrics = _metrics(ours["results"]), _metrics(direct)
    assert ours_metrics.keys() == direct_metrics.keys()
    for key, value in direct_metrics.items():
        assert ours_metrics[key] == pytest.approx(value, rel=1e-6, abs=1e-9), key


def test_rolling_perplexity_is_lm_eval_word_perplexity(tiny_ladder_dir: Path, tmp_path: Path):
    """One short document: word perplexity = exp(-sum log p(token | prefix) / words), the first token after BOS."""
    from ladderize.checkpoint.io import load_model

    text = "to be or not to be"
    path = tmp_path / "line.txt"
    path.write_text(text)
    model, tokenizer = load_model(tiny_ladder_dir), load_tokenizer(tiny_ladder_dir)
    output = evaluate_model(model, tokenizer, f"ppl:{path}", batch_size=1)
    ids = torch.tensor([[tokenizer.bos_token_id] + tokenizer(text, add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        logprobs = torch.log_softmax(model(ids).logits.float(), -1)[0, :-1]
    loglikelihood = logprobs.gather(-1, ids[0, 1:, None]).sum().item()
    words = len(text.split())
    assert output["results"]["ppl_line"]["word_perplexity,none"] == pytest.approx(math.exp(-loglikelihood / words), rel=1e-4)
    assert output["ladderize_sources"]["ppl_line"] == str(path)


def test_split_documents():
    text = "a" * 5 + "\n\n" + "b" * 5 + "\n \n" + "c" * 30 + "\n\n\n" + "d"
    assert split_documents(text, 12) == ["aaaaa\n\nbbbbb", "c" * 30, "d"]
    assert split_documents("", 10) == []
    assert parse_task_list(["a, b", "c"]) == ["a", "b", "c"]
    with pytest.raises(LadderizeError, match="no tasks"):
        parse_task_list(" , ")


def _cli(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    from ladderize import cli

    monkeypatch.setattr(sys, "argv", ["ladderize", *args])
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    captured = capsys.readouterr()
    return exit_info.value.code, captured.out, captured.err


def test_cli_eval_writes_json(tiny_ladder_dir: Path, tiny_data_dir: Path, tmp_path: Path, monkeypatch, capsys):
    out = tmp_path / "eval.json"
    code, stdout, _ = _cli(
        monkeypatch, capsys, "eval", str(tiny_ladder_dir), "--tasks", "lambada_openai", "--limit", "3",
        "--batch-size", "2", "--data-dir", str(tiny_data_dir), "--json", str(out),
    )  # fmt: skip
    assert code == 0
    record = json.loads(out.read_text())
    assert record["results"]["lambada_openai"]["sample_len"] == 3 and record["layout"] == "ladder 2:4"
    assert "lambada_openai" in stdout and "acc" in stdout


@pytest.mark.parametrize(
    "case, message",
    [
        ("unknown-task", "unknown task 'lambada_opneai'; did you mean lambada_openai"),
        ("missing-lambada", "missing data file"),
        ("missing-text", "missing data file"),
        ("missing-data-dir", "does not exist"),
        ("not-a-model", "is not a model checkpoint: it has no config.json"),
        ("a-file", "is not a checkpoint: a checkpoint is a directory"),  # the one config reader's words, before torch
    ],
)
def test_cli_eval_bad_input_is_one_line(case, message, tiny_ladder_dir: Path, tiny_data_dir: Path, tmp_path: Path, monkeypatch, capsys):
    ckpt, tasks, data = str(tiny_ladder_dir), "lambada_openai", str(tiny_data_dir)
    if case == "unknown-task":
        tasks = "lambada_opneai"
    elif case == "missing-lambada":
        data = str(tmp_path)
    elif case == "missing-text":
        tasks = f"ppl:{tmp_path / 'nope.txt'}"
    elif case == "missing-data-dir":
        data = str(tmp_path / "no-such-dir")
    elif case == "not-a-model":
        ckpt = str(tmp_path)
    elif case == "a-file":
        (tmp_path / "weights.bin").write_bytes(b"\0")
        ckpt = str(tmp_path / "weights.bin")
    code, stdout, stderr = _cli(monkeypatch, capsys, "eval", ckpt, "--tasks", tasks, "--data-dir", data, "--limit", "2")
    assert code == 2
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), stderr
    assert message in lines[0]
