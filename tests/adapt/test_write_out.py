"""No process waits in a collective while another writes: under 3 processes (gloo) a recipe's sequential stage output
and its sharded OUT are written with a writer made slow, and each rank's longest collective stays short."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.adapt.test_multiprocess import launch_failure
from tests.adapt.test_sharded import _common, _env, _torchrun

SLOW_S = 6.0


def test_no_rank_waits_in_a_collective_while_another_writes(ladder_dir, text_file, tmp_path):
    logs = tmp_path / "waits"
    logs.mkdir()
    env = {**_env(tmp_path), "SLOW_WRITE_S": str(SLOW_S), "WAIT_LOG": str(logs)}
    command = [*_torchrun(3), "tests/adapt/slow_write_worker.py", "adapt", str(ladder_dir), str(tmp_path / "out"),
               *_common(text_file), "--batch-size", "3", "--stage", "seq-local:tokens=192,epochs=1",
               "--stage", "kd:tokens=96"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, launch_failure(done.stderr)
    assert (tmp_path / "out" / "config.json").is_file()
    waits = {file.name: json.loads(file.read_text()) for file in sorted(logs.glob("rank-*.json"))}
    assert len(waits) == 3, waits
    for rank, longest in waits.items():  # two slow writes of SLOW_S each: none is waited for in a collective
        assert longest["s"] < SLOW_S / 2, (rank, longest)
