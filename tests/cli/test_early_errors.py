"""Argument errors answer before torch loads (issue 37 item 9: they came after 4-36 s of imports): each bad command is
one line, exit 2, with neither torch nor transformers imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

PROBE = """
import json, os, sys
os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core: --tp 2 needs --oversubscribe on any machine
from ladderize import cli
results = []
for argv in json.loads(sys.argv[1]):
    sys.argv = ['ladderize', *argv]
    code = 0
    try:
        cli.main()
    except SystemExit as exc:
        code = exc.code
    results.append([code, [m for m in ('torch', 'transformers') if m in sys.modules]])
print('RESULTS', json.dumps(results))
"""


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="pins the probe to one core (Linux)")
def test_argument_errors_come_before_torch(tmp_path: Path) -> None:
    from tests.runtime.runtime_helpers import TINY_TP23, save_char_tokenizer, save_tiny

    ckpt, truncated, exists = tmp_path / "ckpt", tmp_path / "trunc", tmp_path / "exists"
    for path in (ckpt, truncated):
        save_tiny(path, **TINY_TP23)
        save_char_tokenizer(path)
    weights = truncated / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    exists.mkdir()
    cases = [
        ["convert", ckpt, tmp_path / "o", "--ladder", "abc"],
        ["convert", ckpt, tmp_path / "o", "--spd", "0:2", "--spd-tp", "5"],
        ["convert", ckpt, exists],
        ["generate", ckpt, "--prompt", "hi", "--schedule", "fast"],
        ["generate", ckpt, "--prompt", ""],
        ["generate", ckpt, "--prompt", "hi", "--tp", "2", "--device", "cpu"],
        ["generate", truncated, "--prompt", "hi"],
        ["bench", ckpt, "--tp", "1", "--schedules", "native,fast"],
        ["eval", truncated, "--tasks", "shakespeare"],
        ["adapt", ckpt, exists],
        ["adapt", truncated, tmp_path / "o"],
        ["sensitivity", ckpt, "--spd-tp", "3", "--json", tmp_path / "s.json", "--layers", "abc"],
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-c", PROBE, json.dumps([[str(a) for a in case] for case in cases])],
                            capture_output=True, text=True, env=env, timeout=300)
    line = next((l for l in result.stdout.splitlines() if l.startswith("RESULTS ")), None)
    assert line is not None, result.stderr[-2000:]
    errors = [l for l in result.stderr.splitlines() if l.strip()]
    for case, (code, heavy), error in zip(cases, json.loads(line[len("RESULTS "):]), errors):
        assert code == 2 and error.startswith("error:"), (case, error)
        assert heavy == [], f"{' '.join(map(str, case))} imported {heavy} before refusing: {error}"
    assert len(errors) == len(cases), errors
