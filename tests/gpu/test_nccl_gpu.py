"""TP=2 over NCCL on one GPU: two torchrun "nodes" (``--nnodes 2 --nproc_per_node 1``) whose ``NCCL_HOSTID`` differ
(fakehost0 / fakehost1), so NCCL accepts two ranks on one device. Logits equal TP=1's within fp32 tolerance, and the
greedy tokens equal, on a dense and a hybrid (ladder + SPD) model whose greedy output varies. Skipped without CUDA."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from ladderize.checkpoint.io import load_model
from ladderize.runtime.generate import Request, RuntimeOptions, run_requests
from ladderize.runtime.launch import LaunchSpec
from tests.runtime.runtime_helpers import save_tiny, shape_for

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

ROOT = Path(__file__).resolve().parents[2]
LOGITS_ATOL = 1e-3
CASES = {
    "dense": dict(layer_modes=["dense"] * 4),
    "hybrid": dict(layer_modes=["dense", "ladder", "spd", "ladder"], spd_tp_size=2, attention_bias=True, mlp_bias=True),
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def two_nodes(program: list[str], logs: Path, timeout_s: float = 300.0) -> list[str]:
    """Run ``program`` (what follows torchrun's options: a script and its arguments, or ``-m MODULE ...``) as two torchrun
    "nodes" on this one GPU, each logging to ``logs/node{R}.log`` (a full pipe cannot stall a rank) in its own session;
    when one fails or the time is up, the other's whole process tree is ended too (no rank left holding the GPU).
    Returns both logs."""
    port = _free_port()
    procs, files = [], []
    logs.mkdir(parents=True, exist_ok=True)
    for rank in range(2):
        env = {**os.environ, "NCCL_HOSTID": f"fakehost{rank}", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1", "--node_rank", str(rank),
               "--master_addr", "127.0.0.1", "--master_port", str(port), *program]
        files.append(logs / f"node{rank}.log")
        with files[-1].open("w") as log:
            procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
    deadline = time.monotonic() + timeout_s
    try:
        while any(p.poll() is None for p in procs):
            if any(p.returncode not in (None, 0) for p in procs) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    texts = [log.read_text() for log in files]
    assert all(p.returncode == 0 for p in procs), "\n".join(f"--- node {rank}:\n" + text[-3000:] for rank, text in enumerate(texts))
    return texts


@pytest.mark.parametrize("mode", ["eager", "graphs"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_tp2_nccl_two_nodes_equals_tp1(case, mode, tmp_path):
    torch.backends.cuda.matmul.allow_tf32 = False
    shape = shape_for(2)
    path = tmp_path / case
    save_tiny(path, seed=7, **shape, **CASES[case])
    ids = torch.randint(3, shape["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(1))
    ids_file = tmp_path / "ids.json"
    ids_file.write_text(json.dumps(ids.tolist()))
    two_nodes([str(ROOT / "tests" / "gpu" / "nccl_worker.py"), str(path), str(ids_file), str(tmp_path / "tp2"), mode], tmp_path)
    rows = tuple(tuple(r) for r in ids.tolist())
    one = run_requests([Request(str(path), rows, score_pieces=(7,) + (1,) * 5),
                        Request(str(path), tuple(r[:7] for r in rows), max_new_tokens=10)],
                       LaunchSpec(tp=1, device="cuda"), RuntimeOptions(dtype="float32", allow_spd_mismatch=True))
    two_logits = np.load(tmp_path / "tp2.npy")
    two = json.loads((tmp_path / "tp2.json").read_text())
    assert len({t for row in one[1].tokens for t in row}) > 1  # the greedy output varies
    # the HF model computes an SPD@2 block's per-head-group shares at any TP: the TP-2 reference of both cases
    model = load_model(path, dtype="float32", device="cuda")
    with torch.no_grad():
        reference = model(ids.cuda()).logits.float().cpu().numpy()
    assert abs(two_logits - reference).max() <= LOGITS_ATOL, case
    if case == "dense":  # exact at any TP: TP 2 equals the runtime's own TP 1
        assert abs(two_logits - one[0].logits).max() <= LOGITS_ATOL
        assert two["tokens"] == one[1].tokens
