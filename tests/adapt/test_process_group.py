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
    device = torch.device("cpu")
    assert process_group.start(device) == device and process_group.start(device) == device
    assert started == [timedelta(minutes=30)]
