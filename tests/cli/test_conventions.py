"""CLI conventions: flags without value tags, --version, fast --help, one-line refusals of generate and report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cli_helpers import error_lines, run_cli

REPO = Path(__file__).resolve().parents[2]


def test_flags_show_no_value_tag(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    for command in ("convert", "adapt", "generate", "eval", "demo"):
        code, stdout, _ = run_cli([command, "--help"], capsys, monkeypatch)
        assert code == 0
        flag_lines = [line for line in stdout.splitlines() if any(f in line for f in ("--force", "--help", "--json", "--keep-state"))]
        assert flag_lines and not any("<bool>" in line or "BOOLEAN" in line for line in flag_lines), command
    code, stdout, _ = run_cli(["adapt", "--help"], capsys, monkeypatch)
    assert "--keep-state" in stdout and "<int>" in stdout  # valued options keep their tag


def test_version(capsys, monkeypatch):
    from ladderize import __version__

    code, stdout, _ = run_cli(["--version"], capsys, monkeypatch)
    assert code == 0 and stdout.strip() == f"ladderize {__version__}"


def test_help_and_version_import_neither_torch_nor_transformers():
    probe = (
        "import sys; from ladderize import cli; sys.argv = ['ladderize', '--help']\n"
        "try:\n    cli.main()\nexcept SystemExit:\n    pass\n"
        "print('HEAVY', sorted(m for m in ('torch', 'transformers', 'lm_eval', 'matplotlib') if m in sys.modules))"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120)
    seconds = time.perf_counter() - started
    assert result.returncode == 0, result.stderr
    assert "HEAVY []" in result.stdout
    assert seconds < 10  # < 2 s on an idle machine; this bound only catches a heavy import coming back


def test_cached_pull_imports_no_torch(tmp_path):
    home = tmp_path / "home"
    model = home / "models" / "smollm2-135m"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (model / "ladderize.json").write_text("{}")
    probe = (
        "import sys; from ladderize import cli; sys.argv = ['ladderize', 'pull']\n"
        "try:\n    cli.main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
        "print('HEAVY', sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "LADDERIZE_HOME": str(home)}
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    assert str(model) in result.stdout and "HEAVY []" in result.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["--temperature", "-0.5"], "--temperature must be 0 (greedy) or positive, got -0.5"),
        (["--top-p", "0"], "--top-p must be in (0, 1], got 0.0"),
        (["--top-p", "1.5"], "--top-p must be in (0, 1], got 1.5"),
        (["--top-k", "-1"], "--top-k must be 0 (all tokens) or positive, got -1"),
    ],
)
def test_generate_refuses_bad_sampling_in_one_line(args, message, tmp_path, capsys, monkeypatch):
    code, _, stderr = run_cli(["generate", tmp_path, "--prompt", "hi", *args], capsys, monkeypatch)
    lines = error_lines(stderr)
    assert code == 2 and lines == [f"error: {message}"]


def test_generate_text_file_is_not_a_checkpoint(tmp_path, capsys, monkeypatch):
    notes = tmp_path / "notes.txt"
    notes.write_text("hello")
    code, _, stderr = run_cli(["generate", notes, "--prompt", "hi"], capsys, monkeypatch)
    lines = error_lines(stderr)
    assert code == 2 and len(lines) == 1 and "is not a checkpoint" in lines[0] and "not found" not in lines[0]
    code, _, stderr = run_cli(["generate", tmp_path / "missing", "--prompt", "hi"], capsys, monkeypatch)
    assert code == 2 and "not found" in error_lines(stderr)[0]


def test_generate_spd_checkpoint_without_tp_names_the_tp_it_needs(tmp_path, capsys, monkeypatch):
    from tests.runtime.runtime_helpers import TINY_TP23, save_char_tokenizer, save_tiny

    path = tmp_path / "spd3"
    save_tiny(path, **TINY_TP23, layer_modes=["dense", "spd", "spd", "dense"], spd_tp_size=3)
    save_char_tokenizer(path)
    code, _, stderr = run_cli(["generate", path, "--prompt", "hi"], capsys, monkeypatch)
    lines = error_lines(stderr)
    assert code == 2 and len(lines) == 1
    assert "has SPD layers converted for TP=3: it needs --tp 3" in lines[0] and "rank" not in lines[0]


def test_generate_prints_tokens_per_second(tmp_path, capsys, monkeypatch):
    from tests.runtime.runtime_helpers import save_char_tokenizer, save_tiny, shape_for

    path = tmp_path / "dense"
    save_tiny(path, **shape_for(1))
    save_char_tokenizer(path)
    code, stdout, stderr = run_cli(["generate", path, "--prompt", "hi", "--max-new-tokens", "4"], capsys, monkeypatch)
    assert code == 0, stderr
    assert "tokens/s" in stderr and "tokens in" in stderr
    code, stdout, stderr = run_cli(["generate", path, "--prompt", "hi", "--max-new-tokens", "4", "--json"], capsys, monkeypatch)
    record = json.loads(stdout)
    assert record["wall_tokens_per_s"] > 0 and record["wall_s"] > 0


def test_report_refuses_a_predict_json(tmp_path, capsys, monkeypatch):
    predicted = tmp_path / "predict.json"
    code, _, stderr = run_cli(["predict", "--model", "llama-3.1-8b", "--tp", "1,2", "--batch", "1", "--compute", "roofline",
                               "--json", predicted], capsys, monkeypatch)
    assert code == 0, stderr
    code, _, stderr = run_cli(["report", predicted, "--out", tmp_path / "report"], capsys, monkeypatch)
    lines = error_lines(stderr)
    assert code == 2 and len(lines) == 1 and "is a 'ladderize predict' JSON" in lines[0]
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"hello": 1}))
    code, _, stderr = run_cli(["report", other, "--out", tmp_path / "report"], capsys, monkeypatch)
    assert code == 2 and "neither an eval record" in error_lines(stderr)[0]


def _header_only_checkpoint(folder: Path, heads: int = 3) -> Path:
    """A Llama checkpoint folder whose safetensors hold only the header-visible shapes (written with numpy)."""
    import numpy as np
    from safetensors.numpy import save_file

    folder.mkdir(parents=True)
    config = {"model_type": "llama", "hidden_size": 12 * heads, "intermediate_size": 24, "num_hidden_layers": 2,
              "num_attention_heads": heads, "num_key_value_heads": heads, "vocab_size": 32, "torch_dtype": "float32"}
    (folder / "config.json").write_text(json.dumps(config))
    save_file({"model.embed_tokens.weight": np.zeros((32, 12 * heads), dtype=np.float32)}, str(folder / "model.safetensors"))
    return folder


@pytest.mark.parametrize(
    "args, message",
    [
        (["inspect", "{ckpt}"], None),
        (["inspect", "{tmp}/missing"], "checkpoint {tmp}/missing not found"),
        (["convert", "/nonexistent-26", "{tmp}/out"], "source /nonexistent-26 does not exist"),
        (["generate", "{ckpt}", "--prompt", "hi", "--tp", "2"], "TP degree 2 does not divide the model's 3 query heads"),
        (["bench", "{ckpt}", "--tp", "1,2"], "TP degree 2 does not divide the model's 3 query heads"),
        (["eval", "{tmp}/missing", "--tasks", "shakespeare"], "checkpoint {tmp}/missing not found"),
        (["adapt", "{tmp}/missing", "{tmp}/out"], "checkpoint {tmp}/missing not found"),
        (["sensitivity", "{tmp}/missing", "--spd-tp", "2", "--json", "{tmp}/s.json"], "checkpoint {tmp}/missing not found"),
        (["sample", "{tmp}/missing", "{tmp}/s.jsonl"], "checkpoint {tmp}/missing not found"),
        (["report", "{tmp}/missing", "--out", "{tmp}/r"], "run {tmp}/missing does not exist"),
    ],
)
def test_header_reads_and_argument_errors_import_neither_torch_nor_transformers(args, message, tmp_path):
    """Issue 26 item 13: inspect (a header read) and every path/argument error came after 3-30 s of torch imports."""
    ckpt = _header_only_checkpoint(tmp_path / "ckpt")
    argv = [a.replace("{ckpt}", str(ckpt)).replace("{tmp}", str(tmp_path)) for a in args]
    probe = (
        f"import sys; from ladderize import cli; sys.argv = ['ladderize', *{argv!r}]\n"
        "code = 0\ntry:\n    cli.main()\nexcept SystemExit as e:\n    code = e.code\n"
        "print('HEAVY', sorted(m for m in ('torch', 'transformers', 'lm_eval', 'accelerate') if m in sys.modules), 'CODE', code)"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120)
    assert "HEAVY [] CODE" in result.stdout, (result.stdout, result.stderr)
    if message is None:
        assert result.stdout.rstrip().endswith("CODE 0") and "parameters: 1,152" in result.stdout, result.stdout
    else:
        lines = error_lines(result.stderr)
        assert result.stdout.rstrip().endswith("CODE 2") and lines == [f"error: {message.replace('{tmp}', str(tmp_path))}"], result.stderr


def test_help_text_names_arguments_as_the_readme_and_takes_dash_h(capsys, monkeypatch):
    """Issue 26 item 15: usage read '[OPTIONS] {src} {out}' with '<str>'/'<path>' tags, and -h was unknown."""
    monkeypatch.setenv("COLUMNS", "200")
    code, stdout, _ = run_cli(["convert", "-h"], capsys, monkeypatch)
    assert code == 0 and "ladderize convert [OPTIONS] SRC OUT" in stdout
    arguments = stdout[stdout.index("Arguments"):stdout.index("Options")]
    assert "<str>" not in arguments and "<path>" not in arguments
    ladder = " ".join(stdout[stdout.index("--ladder "):stdout.index("--spd ")].split())
    assert "a single layer '5'" in ladder and "'auto'" in ladder and "--ladder-budget" in ladder
    code, stdout, _ = run_cli(["-h"], capsys, monkeypatch)
    assert code == 0 and "ladderize [OPTIONS] COMMAND" in stdout
    code, stdout, _ = run_cli(["bench", "--help"], capsys, monkeypatch)
    assert "ladderize bench [OPTIONS] [CHECKPOINT]" in stdout
    assert "'auto'" not in " ".join(stdout[stdout.index("--ladder "):stdout.index("--spd ")].split())  # convert only


def test_an_error_inside_convert_has_no_empty_line_before_it(tmp_path, capsys, monkeypatch):
    """Issue 26 item 15: convert's progress bar printed an empty line before the error off a terminal."""
    ckpt = _header_only_checkpoint(tmp_path / "ckpt")
    code, _, stderr = run_cli(["convert", ckpt, tmp_path / "out", "--ladder", "40:50"], capsys, monkeypatch)
    assert code == 2 and stderr.startswith("error: layer range '40:50' is outside the model's 2 layers"), repr(stderr)


def test_adapt_hint_is_derived_from_the_model(tmp_path, capsys, monkeypatch):
    """Issue 26 item 15: the hint said '--ladder 16:32' whatever the model's layer count."""
    ckpt = _header_only_checkpoint(tmp_path / "ckpt")
    code, _, stderr = run_cli(["adapt", ckpt, tmp_path / "out"], capsys, monkeypatch)
    assert code == 2 and "has no converted layers (all 2 are dense)" in stderr
    assert "e.g. ladderize convert SRC OUT --ladder 1:2" in stderr and "16:32" not in stderr
