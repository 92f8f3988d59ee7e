"""adapt under a launcher: a process count that differs from the one asked for is one warning; rank 0 alone prints."""

from __future__ import annotations

import os

import pytest

from ladderize.checkpoint.placement import launch_mismatch
from ladderize.adapt.plan.config import GivenSettings
from tests.cli_helpers import run_cli

WARNING = "warning: accelerate launch was asked for several processes but started one"


def _adapt(ladder_dir, text_file, out, capsys, monkeypatch):
    args = ["adapt", ladder_dir, out, "--data", text_file, "--objective", "local", "--tokens", 64, "--seq-len", 32,
            "--batch-size", 2, "--device", "cpu"]  # fmt: skip
    return run_cli(args, capsys, monkeypatch)


def test_accelerate_simple_launcher_with_two_processes_warns_once(ladder_dir, text_file, tmp_path, capsys, monkeypatch):
    # what `accelerate launch --num_processes 2 --cpu` gives its single process (Accelerate 1.15's simple launcher)
    monkeypatch.setenv("ACCELERATE_USE_CPU", "True")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    code, stdout, stderr = _adapt(ladder_dir, text_file, tmp_path / "out", capsys, monkeypatch)
    assert code == 0, stderr
    assert stderr.count(WARNING) == 1 and "adapted 1 step" in stdout


@pytest.mark.parametrize("env,expected", [
    ({}, None),
    ({"WORLD_SIZE": "2"}, None),  # Accelerate's world read from the same variable
    ({"ACCELERATE_USE_CPU": "True"}, None),  # accelerate launch of one process: no MASTER_ADDR
    ({"ACCELERATE_USE_CPU": "True", "MASTER_ADDR": "127.0.0.1"}, WARNING),
])  # fmt: skip
def test_launch_mismatch(env, expected, monkeypatch):
    for name in ("WORLD_SIZE", "ACCELERATE_USE_CPU", "MASTER_ADDR"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    found = launch_mismatch()
    assert (found is None) if expected is None else found.startswith(expected) and "\n" not in found
    if env.get("WORLD_SIZE"):
        assert launch_mismatch(world=1) == "warning: the launcher started 2 processes (WORLD_SIZE) but the run has 1"


def test_only_rank_zero_prints_the_plan_and_result(ladder_dir, text_file, tmp_path, capsys, monkeypatch):
    code, stdout, stderr = _adapt(ladder_dir, text_file, tmp_path / "zero", capsys, monkeypatch)
    assert code == 0 and "adapted 1 step" in stdout, stderr
    monkeypatch.setenv("RANK", "1")
    code, stdout, stderr = _adapt(ladder_dir, text_file, tmp_path / "one", capsys, monkeypatch)
    assert code == 0, stderr
    assert stdout.strip() == ""


def test_two_process_staged_run_prints_once(ladder_dir, text_file, tmp_path):
    """``accelerate launch --multi_gpu --num_processes 2`` (gloo on CPU) of a two-stage run: the plan, the stage lines
    and the result appear once, and the second rank does not take the plan file rank 0 wrote for an earlier run."""
    import os
    import subprocess
    import sys

    from tests.adapt.test_multiprocess import launch_failure

    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
           "ACCELERATE_CONFIG_FILE": str(tmp_path / "no-config.yaml")}  # fmt: skip
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
              "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "0",
              "-m", "ladderize.cli", "adapt", str(ladder_dir), str(tmp_path / "two"), "--data", str(text_file),
              "--stage", "local:tokens=128", "--stage", "kd:tokens=128", "--seq-len", "32", "--batch-size", "2"]  # fmt: skip
    done = subprocess.run(launch, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, launch_failure(done.stderr)
    lines = done.stdout.splitlines()
    assert sum(line.startswith("plan (") for line in lines) == 1
    assert sum(line.startswith("stage 2/2") for line in lines) == 1
    assert sum(line.startswith("adapted 4 steps") for line in lines) == 1, done.stdout
    assert "warning:" not in done.stderr


def test_torchrun_prints_the_plan_and_the_summary_once(ladder_dir, text_file, tmp_path):
    """``torchrun --nproc_per_node 2`` (gloo) of a two-stage run with a wall budget: every rank times its pace, and the
    main process's plan is the one both run, so its budget lines, its planned wall time, the plan, the stage lines and
    the summary appear once in the combined output."""
    import subprocess
    from collections import Counter

    from tests.adapt.test_multiprocess import launch_failure
    from tests.adapt.test_sharded import _env, _torchrun

    env = _env(tmp_path)
    command = [*_torchrun(2), "-m", "ladderize.cli", "adapt", str(ladder_dir), str(tmp_path / "two"), "--data",
               str(text_file), "--seq-len", "32", "--batch-size", "2", "--device", "cpu", "--dtype", "float32",
               "--no-compile", "--budget", "30s", "--stage", "seq-local:tokens=128,epochs=1", "--stage", "kd:tokens=64"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, launch_failure(done.stderr)
    lines = [line for line in (done.stdout + done.stderr).splitlines()
             if line.strip() and not line.startswith(("adapt ", "[rank", "W1", "I1"))]  # progress; torchrun's own
    repeated = {line: n for line, n in Counter(lines).items() if n > 1}
    assert not repeated, done.stdout + done.stderr
    for start in ("planned wall time:", "plan (recipe", "  tokens trained:", "stage 1/2", "stage 2/2", "adapted "):
        assert sum(line.startswith(start) for line in lines) == 1, (start, done.stdout + done.stderr)
    assert not any(line.startswith("rank 1:") for line in lines)


@pytest.mark.parametrize("parent,before,removed", [
    ({}, {"OMP_NUM_THREADS": "1"}, ["OMP_NUM_THREADS"]),  # Accelerate's default: torch's own count, as without it
    ({}, {"OMP_NUM_THREADS": "1", "KMP_AFFINITY": "granularity=fine,compact,1,0", "KMP_BLOCKTIME": "1"},
     ["OMP_NUM_THREADS", "KMP_AFFINITY", "KMP_BLOCKTIME"]),  # --cpu
    ({"OMP_NUM_THREADS": "1"}, {"OMP_NUM_THREADS": "1"}, []),  # the user's: plain adapt runs on it too
    ({}, {"OMP_NUM_THREADS": "3", "WORLD_SIZE": "2"}, []),  # a multi-process launcher places its processes itself
])  # fmt: skip
def test_a_process_accelerate_launched_alone_drops_the_threads_the_launcher_chose(parent, before, removed, monkeypatch):
    from ladderize.checkpoint.placement import SIMPLE_LAUNCHER_SET, as_plain_process

    for name in (*SIMPLE_LAUNCHER_SET, "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    for name, value in {"ACCELERATE_USE_CPU": "False", **before}.items():
        monkeypatch.setenv(name, value)
    assert as_plain_process((parent, ["/usr/bin/python", "/usr/bin/accelerate", "launch"])) == removed
    assert all(name not in os.environ for name in removed) and all(name in os.environ for name in before if name not in removed)
    # --num_cpu_threads_per_process asks for the count; a parent that is not accelerate launch is left alone
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert as_plain_process(({}, ["python", "-m", "accelerate.commands.launch", "--num_cpu_threads_per_process", "1",
                                  "x.py"])) == []
    assert as_plain_process(({}, ["bash"])) == [] and os.environ["OMP_NUM_THREADS"] == "1"


def test_accelerate_launch_of_one_process_trains_as_plain_adapt(ladder_dir, text_file, tmp_path, capsys, monkeypatch):
    """``accelerate launch --num_processes 2`` without ``--multi_gpu`` starts one process with OMP_NUM_THREADS=1: the
    process runs on the threads plain ``ladderize adapt`` runs on (a CPU's sums depend on them) and its weights equal
    the in-process run's."""
    import subprocess
    import sys

    import torch
    from safetensors.torch import load_file

    script = tmp_path / "entry.py"  # the CLI's entry point, then the thread count it left torch with
    script.write_text("import sys\nfrom ladderize.cli import main\ntry:\n    main()\nexcept SystemExit as done:\n"
                      "    assert not done.code, done.code\nimport torch\nprint('threads', torch.get_num_threads())\n")
    env = {key: value for key, value in os.environ.items() if key not in ("OMP_NUM_THREADS", "WORLD_SIZE", "RANK")}
    env.update(TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1", ACCELERATE_CONFIG_FILE=str(tmp_path / "none.yaml"))
    plain = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"], env=env,
                           capture_output=True, text=True, check=True).stdout.strip()
    args = ["adapt", str(ladder_dir), str(tmp_path / "launched"), "--data", str(text_file), "--objective", "kd",
            "--tokens", "128", "--seq-len", "32", "--batch-size", "2", "--device", "cpu"]
    done = subprocess.run([sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "2",
                           "--mixed_precision", "no", "--dynamo_backend", "no", "--num_machines", "1", str(script),
                           *args], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"threads {plain}" in done.stdout.splitlines(), (plain, done.stdout)
    assert done.stderr.count(WARNING) == 1  # still one process, as the warning says
    code, _, stderr = run_cli([*args[:2], tmp_path / "here", *args[3:]], capsys, monkeypatch)
    assert code == 0, stderr
    launched, here = (load_file(tmp_path / name / "model.safetensors") for name in ("launched", "here"))
    assert all(torch.equal(launched[name], here[name]) for name in here)


def test_a_launch_times_its_pace_on_every_process_and_prices_its_plan_as_the_dry_run_does(ladder_dir, text_file,
                                                                                           tmp_path, monkeypatch):
    """``torchrun --nproc_per_node 3`` (gloo) plans a kd stage with ``pace.measure`` stated (``launch_pace.py``):

    - a wall budget: every process times its share of a step (1 of the batch's 3 rows) at once, the pace is each piece
      as the slowest process timed it, and kd is sized to what 3 processes do in the budget: 3 x the tokens one process
      gets from the same pace;
    - a token budget, the pieces at an H100's assumed rate: the expected time the launch prints is the one
      ``--dry-run 3xH100`` prints for the same plan."""
    import json
    import re
    import subprocess

    from ladderize.adapt.train import pace as pacing
    from ladderize.adapt.plan.budget import parse_budget
    from ladderize.adapt.entrance import with_timed_pace
    from ladderize.adapt.plan.adapt_plan import build_plan
    from tests.adapt.launch_pace import KD, SHARED, TOKEN_BUDGET, stated_pace
    from tests.adapt.test_multiprocess import launch_failure
    from tests.adapt.test_sharded import _env, _torchrun

    command = [*_torchrun(3), "-m", "tests.adapt.launch_pace", str(ladder_dir), str(text_file), str(tmp_path / "home")]
    done = subprocess.run(command, env=_env(tmp_path), capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, launch_failure(done.stderr)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    timings = result["timings"]
    assert sorted(t["rank"] for t in timings) == [0, 0, 1, 1, 2, 2]  # each phase timed on every process
    for phase in range(2):
        together = sorted(timings, key=lambda t: t["start"])[3 * phase: 3 * phase + 3]
        assert max(t["start"] for t in together) < min(t["end"] for t in together), timings  # all at once
    assert {t["rows"] for t in timings} == {1}  # each process's share of a step's 3 rows

    wall = result["wall"]["budget"]
    pace = wall["pace"]
    slowest = stated_pace(str(ladder_dir), 32, 1, slower=1.2)  # rank 2's
    assert pace["processes"] == 3 and pace["layer_train"] == slowest.layer_train and pace["head_step"] == slowest.head_step
    # one process, the same pace per token (its 3 rows a step): the sizing a launch of 3 triples
    monkeypatch.setenv("LADDERIZE_HOME", str(tmp_path / "one"))
    monkeypatch.setattr(pacing, "measure", lambda checkpoint, *, seq_len, batch_size, **_: stated_pace(
        checkpoint, seq_len, batch_size, slower=1.2))
    one = with_timed_pace(lambda pace, heard: build_plan(
        ladder_dir, shared=GivenSettings.of({**SHARED, "data": str(text_file)}), stages=KD, budget=parse_budget("600s"),
        say=heard, pace=pace))
    assert one.budget.pace.processes == 1
    assert wall["tokens"] == pytest.approx(3 * one.budget.tokens, rel=2e-3), (wall["tokens"], one.budget.tokens)

    launched = result["tokens"]
    dry = build_plan(ladder_dir, shared=GivenSettings.of({**SHARED, "data": str(text_file)}), stages=KD, budget=parse_budget(TOKEN_BUDGET),
                     launch="3xH100", priced_only=True)
    assert launched["expected_s"] == pytest.approx(dry.expected_s, rel=1e-9) and dry.expected_s > 60

    def printed(lines: list[str]) -> str:
        return next(re.match(r"  expected: (.+?) \(", line).group(1) for line in lines if line.startswith("  expected: "))

    assert printed(launched["lines"]) == printed(dry.lines()), (launched["lines"], dry.lines())
    assert "timed on each of this launch's 3 processes" in launched["lines"][-1]
