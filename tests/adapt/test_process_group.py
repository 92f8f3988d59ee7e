"""The one process group of adapt (``adapt/process_group.py``): ladderize's collective timeout, and one group per job."""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch

from ladderize.adapt import process_group
from ladderize.errors import LadderizeError


def test_the_collective_timeout_is_ladderizes_and_a_bad_one_is_one_line(monkeypatch):
    monkeypatch.delenv(process_group.ENV_TIMEOUT, raising=False)
    assert process_group.collective_timeout() == timedelta(minutes=120)
    monkeypatch.setenv(process_group.ENV_TIMEOUT, "45")
    assert process_group.collective_timeout() == timedelta(minutes=45)
    for bad in ("0", "-3", "soon"):
        monkeypatch.setenv(process_group.ENV_TIMEOUT, bad)
        with pytest.raises(LadderizeError, match="collective timeout in minutes"):
            process_group.collective_timeout()


def test_a_started_group_is_joined_not_started_again(monkeypatch):
    import torch.distributed as dist

    started = []
    monkeypatch.setattr(dist, "is_initialized", lambda: bool(started))
    monkeypatch.setattr(dist, "init_process_group", lambda *args, **kwargs: started.append(kwargs["timeout"]))
    monkeypatch.setenv(process_group.ENV_TIMEOUT, "30")
    monkeypatch.setenv("RANK", "0")  # as under a launcher: no group of one made with its port
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("LOCAL_RANK", "0")
    device = torch.device("cpu")
    assert process_group.start(device) == device and process_group.start(device) == device
    assert started == [timedelta(minutes=30)]


def test_the_launch_is_read_from_the_launchers_environment(monkeypatch):
    from ladderize.checkpoint.placement import LaunchRank, this_launch

    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    alone = this_launch()
    assert alone == LaunchRank() and alone.main and not alone.several and not alone.by_launcher
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_RANK", "1")
    launched = this_launch()
    assert launched == LaunchRank(5, 8, 1, True, 8) and launched.several and not launched.main
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert this_launch().local_world == 4
    monkeypatch.delenv("LOCAL_RANK")  # a launcher that names no local place: the node holds every process
    assert this_launch().local_rank == 5
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")  # torchrun --nproc_per_node 1: launched, one process
    assert this_launch().by_launcher and not this_launch().several and this_launch().main
    monkeypatch.delenv("WORLD_SIZE")  # a rank with no world is no launch: a group is not started from it
    assert not this_launch().by_launcher


def test_one_process_agrees_with_itself_and_sums_nothing(monkeypatch):
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    plan = {"stages": 2}
    assert process_group.agreed(plan) is plan
    tensor = torch.ones(3)
    process_group.sum_over_processes([tensor])
    assert torch.equal(tensor, torch.ones(3))


def _calls(file, names: set[str]) -> list[str]:
    import ast

    found = []
    for node in ast.walk(ast.parse(file.read_text(), str(file))):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            if name in names:
                found.append(f"{file.name}:{node.lineno} {name}")
    return found


def test_one_answer_to_am_i_launched_and_no_planning_module_starts_the_group():
    """Where a process stands in a launch is read in one place (``placement.this_launch``): no other module of adapt,
    cli or eval reads the launcher's variables or asks torch.distributed for the world's size to decide it, adapt asks
    torch.distributed for no rank or world size, and the runtime and the command line ask ``this_launch`` whether a
    launcher started them (``by_launcher``: one meaning of launched, ``RANK`` and ``WORLD_SIZE`` given); the group
    is started by the entrance and the training (``entrance``, ``sequential_run``, ``replicated``, ``sharded``), never by a
    module that plans or prices a run."""
    from pathlib import Path

    package = Path(__file__).resolve().parents[2] / "ladderize"
    readers = [f"{file.relative_to(package)}:{number}"
               for folder in ("adapt", "cli", "eval") for file in sorted((package / folder).rglob("*.py"))
               for number, line in enumerate(file.read_text().splitlines(), 1)
               if any(f'"{key}"' in line for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK")) and "environ" in line
               and file.name != "process_group.py"]  # the group of one sets the variables it starts from
    assert not readers, readers
    asks = [f"{file.relative_to(package)}:{number}" for file in sorted((package / "adapt").rglob("*.py"))
            for number, line in enumerate(file.read_text().splitlines(), 1)
            if "get_world_size() > 1" in line or "get_world_size() <= 1" in line]
    assert not asks, asks
    # the rank and the world's size: this_launch's, never the group's own count, in adapt and wherever a launch is asked
    ranks = [f"{file.relative_to(package)}:{number}" for folder in ("adapt", "cli", "runtime", "eval")
             for file in sorted((package / folder).rglob("*.py"))
             for number, line in enumerate(file.read_text().splitlines(), 1)
             if ("get_rank()" in line or "get_world_size()" in line or "in_torchrun" in line)
             and (folder == "adapt" or "in_torchrun" in line)]
    assert not ranks, ranks
    planning = [*(package / "adapt" / "plan").glob("*.py"), package / "adapt" / "train" / "pace.py",
                package / "adapt" / "run_lock.py"]
    starts = [call for file in planning for call in _calls(file, {"start", "init_process_group"})]
    assert not starts, starts
    starters = {file.stem for file in (package / "adapt").rglob("*.py")
                if _calls(file, {"start"}) and "process_group" in file.read_text()}
    assert starters == {"entrance", "sequential_run", "replicated", "sharded"}, starters
