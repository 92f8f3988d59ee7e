"""The shared-memory all-reduce (``--comm shm``): gloo's results, unique segments, no leftovers, one-host check.

Reduction order: every rank sums the ranks' partials in rank order, ((x_0 + x_1) + x_2) + ...,
in float32 (bfloat16 partials are summed in float32 and rounded once). At TP=2 that is gloo's
result bit for bit (adding two floats is commutative, and gloo also rounds a bfloat16 sum
once); at TP=3 it is the fixed-order sum bit for bit, and gloo's (whose ring order differs
per chunk) within the rounding of two additions.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from ladderize.errors import LadderizeError
from ladderize.runtime.launch import LaunchSpec, check_machine, run_ranks
from ladderize.runtime.shm import PREFIX, choose_comm

ROOT = Path(__file__).resolve().parents[2]
CHUNK_ELEMENTS = 512 * 1024 // 4
SIZES = (1, 7, 2048, CHUNK_ELEMENTS + 3)  # the last crosses the 512 KiB chunk of a slot
DTYPES = (torch.float32, torch.bfloat16)


def partial_of(rank: int, size: int, dtype: torch.dtype, salt: int = 0) -> torch.Tensor:
    """Rank ``rank``'s partial: random values over several magnitudes, so that rounding matters."""
    g = torch.Generator().manual_seed(1000 * rank + size + salt)
    return (torch.randn(size, generator=g) * torch.exp(torch.randn(size, generator=g) * 3)).to(dtype)


def fixed_order_sum(world: int, size: int, dtype: torch.dtype, salt: int = 0) -> torch.Tensor:
    acc = partial_of(0, size, dtype, salt).float()
    for rank in range(1, world):
        acc = acc + partial_of(rank, size, dtype, salt).float()
    return acc.to(dtype)


def _plain(tensor: torch.Tensor):
    """A tensor as a numpy array (float32 holds every bfloat16 exactly): tensors do not outlive a rank's exit."""
    return tensor.float().numpy()


def _tensor(array, dtype: torch.dtype) -> torch.Tensor:
    return torch.from_numpy(array).to(dtype)


def _equality_job(context) -> dict:
    """shm (blocking, async, many in flight) against gloo on the same partials; rank 0's results."""
    comm = context.comm
    out = {"transport": context.transport, "results": {}}
    for dtype in DTYPES:
        for size in SIZES:
            x = partial_of(context.rank, size, dtype)
            blocking = x.clone()
            comm.all_reduce(blocking, async_op=False).wait()
            issued = x.clone()
            inflight = comm.all_reduce(issued, async_op=True)
            gloo = x.clone()
            dist.all_reduce(gloo)  # the process group gloo carries, beside shm
            inflight.wait()
            out["results"][(str(dtype), size)] = (_plain(blocking), _plain(issued), _plain(gloo))
    # ladder and domino keep several all-reduces in flight: more than the segment's slots
    works = [(comm.all_reduce(t, async_op=True), t) for t in (partial_of(context.rank, 300, torch.float32, s) for s in range(7))]
    out["many"] = [_plain(work.wait()) for work, _ in works]
    digest = [float(v[0].sum()) for v in out["results"].values()]
    everyone = [None] * context.world_size
    dist.all_gather_object(everyone, digest)
    out["ranks_agree"] = all(everyone[0] == d for d in everyone)
    out["count"] = comm.stats.allreduce_count
    return out


@pytest.fixture(scope="module", params=[2, 3])
def equality(request):
    tp = request.param
    return tp, run_ranks(_equality_job, LaunchSpec(tp=tp, comm="shm", oversubscribe=True))


def test_shm_sum_equals_gloo_and_the_fixed_order(equality):
    tp, out = equality
    assert out["transport"] == "shm" and out["ranks_agree"]
    for (name, size), arrays in out["results"].items():
        dtype = getattr(torch, name.removeprefix("torch."))
        blocking, issued, gloo = (_tensor(a, dtype) for a in arrays)
        reference = fixed_order_sum(tp, size, dtype)
        assert torch.equal(blocking, reference), (dtype, size)  # bit for bit, rank order 0..N-1
        assert torch.equal(issued, reference), (dtype, size)  # issue-now-wait-later: the same bits
        if tp == 2:
            assert torch.equal(blocking, gloo), (dtype, size)  # gloo's sum of two, bit for bit
        else:  # gloo's ring adds in another order: each of the 2 additions rounds by <= eps/2 of |sum| bound
            eps = torch.finfo(dtype).eps
            bound = sum(partial_of(r, size, dtype).float().abs() for r in range(tp))
            assert ((blocking.float() - gloo.float()).abs() <= 2 * eps * bound).all(), (dtype, size)
    for salt, result in enumerate(out["many"]):
        assert torch.equal(_tensor(result, torch.float32), fixed_order_sum(tp, 300, torch.float32, salt))
    assert out["count"] == 2 * len(DTYPES) * len(SIZES) + 7  # gloo's own calls are not counted


def _tagged_job(context, salt: int) -> dict:
    """A run that checks its own sums many times; a concurrent run with another salt must not disturb it."""
    ok = True
    for step in range(200):
        x = partial_of(context.rank, 512, torch.float32, salt + step)
        context.comm.all_reduce(x, async_op=step % 2 == 1).wait()
        ok &= torch.equal(x, fixed_order_sum(context.world_size, 512, torch.float32, salt + step))
    return {"ok": ok, "segment": context.comm.segment.name}


def test_two_concurrent_runs_do_not_collide():
    results: dict[int, object] = {}

    def run(salt: int) -> None:
        try:
            results[salt] = run_ranks(functools.partial(_tagged_job, salt=salt), LaunchSpec(tp=2, comm="shm"))
        except BaseException as exc:  # reported below
            results[salt] = exc

    threads = [threading.Thread(target=run, args=(salt,)) for salt in (0, 5000)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(isinstance(r, dict) and r["ok"] for r in results.values()), results
    names = {r["segment"] for r in results.values()}
    assert len(names) == 2 and all(name.startswith("/" + PREFIX) for name in names)
    assert not any(Path("/dev/shm", name.lstrip("/")).exists() for name in names)


def _killed_job(context, marker: str) -> None:
    """Rank 0 (the segment's creator) kills itself mid-run; rank 1 is inside an all-reduce by then."""
    name = context.comm.segment.name
    maps = Path("/proc/self/maps").read_text()
    if context.rank == 0:
        # the mapping is live but its name is already gone: unlinked right after every rank mapped it
        Path(marker).write_text(f"{name}\n{'(deleted)' in next(l for l in maps.splitlines() if name in l)}\n")
    for step in range(1000):
        if context.rank == 0 and step == 50:
            os.kill(os.getpid(), signal.SIGKILL)
        x = torch.ones(1024)
        context.comm.all_reduce(x, async_op=False).wait()


def test_killed_rank_leaves_no_segment(tmp_path):
    marker = tmp_path / "segment"
    start = time.monotonic()
    with pytest.raises(RuntimeError):
        run_ranks(functools.partial(_killed_job, marker=str(marker)), LaunchSpec(tp=2, comm="shm"))
    assert time.monotonic() - start < 300  # the survivor did not hang
    name, unlinked = marker.read_text().split()
    assert unlinked == "True"
    assert not Path("/dev/shm", name.lstrip("/")).exists()


CTRL_C_SCRIPT = """
import functools, sys, time
import ladderize
from ladderize.runtime.launch import LaunchSpec, run_ranks

def job(context, marker):
    if context.rank == 0:
        open(marker, "w").write(context.comm.segment.name)
    import torch
    for step in range(int(sys.argv[2])):
        x = torch.ones(256)
        context.comm.all_reduce(x, async_op=False).wait()
        time.sleep(0.001)
    return float(x[0])

if __name__ == "__main__":
    print(run_ranks(functools.partial(job, marker=sys.argv[1]), LaunchSpec(tp=2, comm="shm")), flush=True)
"""


def _start(tmp_path, steps: int) -> tuple[subprocess.Popen, Path]:
    script, marker = tmp_path / "train.py", tmp_path / f"segment{steps}"
    script.write_text(CTRL_C_SCRIPT)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    # SIGINT as a terminal leaves it: a job started in the background by a non-interactive shell
    # (nohup ... &) inherits SIGINT ignored, and Python then never raises KeyboardInterrupt
    process = subprocess.Popen([sys.executable, str(script), str(marker), str(steps)], cwd=ROOT, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    return process, marker


def test_normal_exit_and_ctrl_c_leave_no_segment(tmp_path):
    finished, finished_marker = _start(tmp_path, 20)
    interrupted, marker = _start(tmp_path, 10**7)
    out, err = finished.communicate(timeout=600)
    assert finished.returncode == 0 and out.strip().splitlines()[-1] == "2.0", err
    deadline = time.monotonic() + 600
    while not marker.exists() and interrupted.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert marker.exists(), interrupted.communicate()[1]
    time.sleep(1.0)  # in the all-reduce loop
    os.killpg(interrupted.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole process group
    interrupted.communicate(timeout=120)
    assert interrupted.returncode != 0
    for path in (finished_marker, marker):
        name = path.read_text().strip()
        assert name.startswith("/" + PREFIX) and not Path("/dev/shm", name.lstrip("/")).exists()


def test_shm_across_hosts_is_refused_in_one_line(tmp_path):
    """Two ranks started torchrun-style, each told a different host name: ``--comm shm`` refuses."""
    from ladderize.runtime.launch import free_port

    port = str(free_port())
    processes = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=port, LADDERIZE_HOSTNAME=f"node{rank}", PYTHONPATH=str(ROOT))
        command = [sys.executable, "-m", "ladderize.cli", "bench", "--synthetic", "tiny", "--tp", "2", "--batch", "1",
                   "--prompt", "4", "--gen", "2", "--warmup", "0", "--repeats", "1", "--comm", "shm"]
        processes.append(subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True))
    for process in processes:
        out, err = process.communicate(timeout=600)
        lines = [line for line in err.strip().splitlines() if not line.startswith("benchmarking ")]  # the start line off a terminal
        assert process.returncode == 2 and len(lines) == 1, err
        assert "--comm shm needs every rank on one host" in lines[0] and "node0, node1" in lines[0]


def test_choose_comm():
    assert choose_comm("auto", "cpu", ["a", "a"]) == "shm"
    assert choose_comm("auto", "cpu", ["a", "b"]) == "gloo"  # across hosts gloo stays the path
    assert choose_comm("auto", "cuda", ["a", "a"]) == "nccl"  # the GPU path is unchanged
    assert choose_comm("gloo", "cpu", ["a", "a"]) == "gloo"
    with pytest.raises(LadderizeError, match="one host"):
        choose_comm("shm", "cpu", ["a", "b"])


def test_bad_comm_choices_are_one_line():
    with pytest.raises(LadderizeError, match="unknown --comm"):
        check_machine(LaunchSpec(tp=1, comm="mpi"))
    with pytest.raises(LadderizeError, match="does not go with"):
        check_machine(LaunchSpec(tp=1, comm="shm", backend="nccl", device="cpu"))
    assert LaunchSpec(comm="shm", device="cpu").backend_name == "gloo"  # gloo still sets up the group


def test_bench_cli_reports_the_comm_path(tmp_path, monkeypatch, capsys):
    from tests.runtime.test_cli_runtime import run_cli

    out_file = tmp_path / "bench.json"
    code, out, err = run_cli(
        monkeypatch, capsys, "bench", "--synthetic", "tiny", "--ladder", "all", "--tp", "2", "--batch", "1",
        "--prompt", "4", "--gen", "3", "--warmup", "0", "--repeats", "1", "--schedules", "native,dense",
        "--comm", "shm", "--json", out_file,
    )
    assert code == 0, err
    import json

    data = json.loads(out_file.read_text())
    assert data["meta"]["comm"] == "shm" and {r["comm"] for r in data["rows"]} == {"shm"}
    ladder = next(r for r in data["rows"] if r["schedule"] == "native")
    dense = next(r for r in data["rows"] if r["schedule"] == "dense")
    assert dense["decode_wait_s_per_token"] == 0.0 and dense["decode_issue_s_per_token"] > 0  # dense blocks inside the call
    assert ladder["decode_wait_s_per_token"] > 0  # ladder's all-reduces are waited on one module later
