"""The frozen teacher sharded with torch FSDP2 on CPU (gloo, 2 processes under torchrun) computes the same logits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def test_sharded_teacher_matches_the_whole_one(dense_dir):
    worker = Path(__file__).with_name("fsdp_teacher_worker.py")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(worker), str(dense_dir)], env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["kinds"] == ["DTensor"] and report["world"] == 2
    assert report["local"] * 2 <= report["full"] + 2 * 128  # each rank holds half (dim-0 shards, rounded up)
    assert report["diff"] <= 1e-5
    assert report["kd_diff"] <= 1e-6
    # the final norm and the LM head (or the embedding it is tied to) gathered once each, not once per block
    assert 1 <= report["kd_gathers"] <= 2
