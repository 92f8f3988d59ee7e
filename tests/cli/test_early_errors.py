"""Argument errors answer before the heavy imports (issue 37 item 9, issue 64 item 3: they came after 4-170 s of imports):
each bad command is one line, exit 2, with none of torch, transformers, lm-eval, accelerate, peft or datasets imported.
The order is checked, not the time: a probe runs the commands in one process and reads ``sys.modules`` after each."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

HEAVY = ("torch", "transformers", "lm_eval", "accelerate", "peft", "datasets")
PROBE = """
import json, os, sys
from pathlib import Path
os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core: --tp 2 needs --oversubscribe on any machine
from ladderize import cli
from ladderize.eval import local_tasks
# a machine without evaluation data: only the (empty) cache is looked in, not a data folder beside the checkout
local_tasks.default_data_dirs = lambda: [Path(os.environ["LADDERIZE_HOME"]) / "data"]
""" + f"HEAVY = {HEAVY!r}" + """
results = []
for argv in json.loads(sys.argv[1]):
    sys.argv = ['ladderize', *argv]
    code = 0
    try:
        cli.main()
    except SystemExit as exc:
        code = exc.code
    results.append([code, [m for m in HEAVY if m in sys.modules]])
print('RESULTS', json.dumps(results))
"""


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="pins the probe to one core (Linux)")
def test_argument_errors_come_before_torch(tmp_path: Path) -> None:
    from tests.runtime.runtime_helpers import TINY_TP23, save_char_tokenizer, save_tiny

    LADDER_2_4 = ["dense", "dense", "ladder", "ladder"]

    ckpt, truncated, exists = tmp_path / "ckpt", tmp_path / "trunc", tmp_path / "exists"
    converted, heads3 = tmp_path / "converted", tmp_path / "heads3"
    for path, shape in ((ckpt, TINY_TP23), (truncated, TINY_TP23), (converted, dict(TINY_TP23, layer_modes=LADDER_2_4)),
                        (heads3, {})):  # heads3: TINY's 3 KV heads, which TP 2 cannot split
        save_tiny(path, **shape)
        save_char_tokenizer(path)
    weights = truncated / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    exists.mkdir()
    (tmp_path / "file").write_text("a file where OUT's folder would be")
    cases = [  # (command line, a fragment of its one error line)
        (["convert", ckpt, tmp_path / "o", "--ladder", "abc"], "abc"),
        (["convert", ckpt, tmp_path / "o", "--spd", "0:2", "--spd-tp", "5"], "does not divide"),
        (["convert", ckpt, exists], "already exists"),
        (["convert", ckpt, tmp_path / "file" / "o"], "is not a directory"),
        (["generate", ckpt, "--prompt", "hi", "--schedule", "fast"], "fast"),
        (["generate", ckpt, "--prompt", ""], "the prompt is empty"),
        (["generate", ckpt, "--prompt", "hi", "--tp", "2", "--device", "cpu"], "--oversubscribe"),
        (["generate", truncated, "--prompt", "hi"], "trunc"),
        (["bench", ckpt, "--tp", "1", "--schedules", "native,fast"], "fast"),
        (["bench", "--synthetic", "foo"], "--synthetic 'foo' is neither a preset"),
        (["bench", "--synthetic", "tiny", "--spd", "0:2", "--tp", "5", "--oversubscribe"], "does not divide"),
        (["eval", truncated, "--tasks", "shakespeare"], "trunc"),
        (["eval", ckpt, "--tasks", "shakespeare", "--batch-size", "0"], "--batch-size must be a positive integer"),
        (["eval", ckpt, "--tasks", "lambada_opneai"], "unknown task 'lambada_opneai'; did you mean lambada_openai"),
        (["eval", ckpt, "--tasks", "lambada_openai"], "task lambada_openai needs its data"),  # offline, no data
        (["eval", ckpt, "--tasks", "shakespeare", "--data-dir", tmp_path / "nowhere"], "does not exist"),
        (["adapt", ckpt, tmp_path / "o"], "no converted layers"),
        (["adapt", converted, exists], "already exists"),
        (["adapt", truncated, tmp_path / "o"], "trunc"),
        (["adapt", converted, tmp_path / "o", "--budget", "0"], "--budget '0'"),
        (["adapt", converted, tmp_path / "o", "--data", tmp_path / "nope.txt"], f"data file {tmp_path / 'nope.txt'} does not exist"),
        (["adapt", converted, tmp_path / "o", "--data", "wikitext"], "offline"),
        (["adapt", converted, tmp_path / "o", "--data", "wikitext2-heldout"],  # no data dir: where it goes, the slices
         f"for a quick check: LADDERIZE_DATA_DIR={REPO / 'tests' / 'data'} (a 100-passage LAMBADA slice"),
        (["sensitivity", ckpt, "--spd-tp", "3", "--json", tmp_path / "s.json", "--layers", "abc"], "abc"),
        (["sensitivity", heads3, "--spd-tp", "2", "--json", tmp_path / "s.json"], "SPD TP degree 2 does not divide"),
        (["sensitivity", ckpt, "--spd-tp", "3", "--json", tmp_path / "s.json", "--data", tmp_path / "nope.txt"], "does not exist"),
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "LADDERIZE_HOME": str(tmp_path / "home"),
           "HF_HOME": str(tmp_path / "hf")}  # offline, with no copy of a hub data set
    for name in ("LADDERIZE_DATA_DIR", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_DATASETS_CACHE"):
        env.pop(name, None)
    argvs = [[str(a) for a in argv] for argv, _ in cases]
    result = subprocess.run([sys.executable, "-c", PROBE, json.dumps(argvs)], capture_output=True, text=True, env=env,
                            timeout=300)
    line = next((l for l in result.stdout.splitlines() if l.startswith("RESULTS ")), None)
    assert line is not None, result.stderr[-2000:]
    errors = [l for l in result.stderr.splitlines() if l.strip()]
    for (argv, fragment), (code, heavy), error in zip(cases, json.loads(line[len("RESULTS "):]), errors):
        command = " ".join(map(str, argv))
        assert code == 2 and error.startswith("error:") and fragment in error, (command, error)
        assert heavy == [], f"{command} imported {heavy} before refusing: {error}"
    assert len(errors) == len(cases), errors
    assert not (tmp_path / "missing").exists() and not (tmp_path / "o").exists()
