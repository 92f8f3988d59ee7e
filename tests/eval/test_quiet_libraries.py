"""Third-party noise stays out of ladderize's output: lm-eval's git probe, tqdm bars of transformers, datasets, lm-eval."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_lm_evals_git_probe_prints_nothing_outside_a_checkout(tmp_path, capfd, monkeypatch):
    """Issue 26 item 14: 'fatal: not a git repository' on stderr of every eval run outside a git checkout."""
    import lm_eval.evaluator as evaluator

    from ladderize.eval.harness import quiet_git_probe

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))  # no checkout above tmp_path either
    original = evaluator.get_git_commit_hash
    with quiet_git_probe():
        assert evaluator.get_git_commit_hash() is None  # what lm-eval records there, unchanged
    assert evaluator.get_git_commit_hash is original
    assert "fatal" not in capfd.readouterr().err


def test_the_command_line_turns_third_party_tqdm_bars_off(tmp_path):
    """Issue 26 item 14: datasets' 'Generating ... split', transformers' GGUF and lm-eval's tqdm bars leaked into logs."""
    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "a"}\n')
    def probe(cache: str) -> str:
        return ("import sys; from ladderize import cli; sys.argv = ['ladderize', *sys.argv[1:]]\n"
                "try:\n    cli.main()\nexcept SystemExit:\n    pass\n"
                f"import datasets; datasets.load_dataset('json', data_files={str(data)!r}, cache_dir={str(tmp_path / cache)!r})\n")

    env = {k: v for k, v in os.environ.items() if k != "TQDM_DISABLE"}
    env["PYTHONPATH"] = str(REPO)
    quiet = subprocess.run([sys.executable, "-c", probe("quiet"), "report", str(tmp_path / "none"), "--out", str(tmp_path / "r")],
                           capture_output=True, text=True, env=env, timeout=300)
    assert "Generating train split" not in quiet.stderr and quiet.stderr.startswith("error:"), quiet.stderr
    verbose = subprocess.run([sys.executable, "-c", probe("verbose"), "eval", "--verbose", "--help"],
                             capture_output=True, text=True, env=env, timeout=300)
    assert "Generating train split" in verbose.stderr  # --verbose keeps the libraries' own output
