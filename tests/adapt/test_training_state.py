"""The run dir's saved training state: a joint stage's distributed checkpoint, and when a save is due."""

from __future__ import annotations

import time

import pytest
import torch

from ladderize.adapt.plan.config import AdaptConfig
from ladderize.adapt.train.training_state import (DCP_DIR, load_joint_state, read_joint_state, save_joint_state,
                                            write_trainer_state)
from ladderize.errors import LadderizeError


def _trained(seed: int):
    """A two-layer model whose first layer is frozen, and AdamW over the second, after one step."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    model[0].requires_grad_(False)
    optimizer = torch.optim.AdamW(model[1].parameters(), lr=1e-2)
    model(torch.randn(3, 4)).square().sum().backward()
    optimizer.step()
    return model, optimizer


def test_a_joint_state_holds_the_trained_parameters_and_their_optimizer_state(tmp_path):
    """The state is a distributed checkpoint of the trained parameters and AdamW beside ``trainer_state.json``,
    replaced whole at each save; loading it into another model gives the trained parameters and the optimizer state
    back, and leaves the frozen ones as they are."""
    state_dir = tmp_path / "run" / "state"
    config = AdaptConfig.from_flat(checkpoint="c", out="o")
    model, optimizer = _trained(0)
    for step in (2, 4):  # the second save replaces the first
        save_joint_state(state_dir, config, model, optimizer, {"step": step, "tokens": 64 * step, "train_s": 1.0,
                                                               "curve": [{"step": step}]})
    assert sorted(p.name for p in state_dir.iterdir()) == [DCP_DIR, "trainer_state.json"]
    assert sorted(p.name for p in state_dir.parent.iterdir()) == ["curve.json", "state"]  # no temp folders left
    assert read_joint_state(state_dir, config)["step"] == 4

    other, other_optimizer = _trained(1)
    frozen = other[0].weight.clone()
    load_joint_state(state_dir, other, other_optimizer)
    assert torch.equal(other[1].weight, model[1].weight) and torch.equal(other[1].bias, model[1].bias)
    assert torch.equal(other[0].weight, frozen) and not torch.equal(frozen, model[0].weight)
    mine, theirs = optimizer.state[model[1].weight], other_optimizer.state[other[1].weight]
    assert torch.equal(mine["exp_avg"], theirs["exp_avg"]) and torch.equal(mine["exp_avg_sq"], theirs["exp_avg_sq"])


def test_a_state_in_another_format_is_refused_in_one_line(tmp_path):
    state_dir = tmp_path / "run" / "state"
    config = AdaptConfig.from_flat(checkpoint="c", out="o")
    write_trainer_state(state_dir, config, {"step": 2, "tokens": 128, "train_s": 1.0, "curve": []})
    (state_dir / "model.safetensors").write_bytes(b"")  # what Accelerate's save_state wrote
    with pytest.raises(LadderizeError, match="not a torch distributed checkpoint.*--force") as raised:
        read_joint_state(state_dir, config)
    assert "\n" not in str(raised.value)


def _clock_run(monkeypatch, save_s: float, env: dict[str, str]) -> list[str]:
    """A SaveClock saving after every step of 2 s, each save taking ``save_s``, under ``env``: what it said."""
    from ladderize.adapt.train.training_state import SaveClock

    for key in ("TORCHELASTIC_RUN_ID", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    now = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: now[0])
    said: list[str] = []
    clock = SaveClock(AdaptConfig.from_flat(checkpoint="c", out="o", save_every=1), said.append)
    for step in range(1, 4):
        now[0] += 2.0  # the step
        assert clock.due(step, "cpu")
        now[0] += save_s  # the save
        clock.saved()
    return said


def test_a_save_that_would_outlast_torchruns_shutdown_window_is_said_once(monkeypatch):
    """torchrun kills its processes 30 s (``TORCH_ELASTIC_SHUTDOWN_TIMEOUT``) after forwarding a signal: where a step and
    a save take longer, the first save says which setting to raise; within the window, or outside torchrun, nothing."""
    said = _clock_run(monkeypatch, 40.0, {"TORCHELASTIC_RUN_ID": "job"})
    assert len(said) == 1 and "about 42 s" in said[0] and "--shutdown_timeout 120" in said[0]
    assert _clock_run(monkeypatch, 40.0, {"TORCHELASTIC_RUN_ID": "job", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "120"}) == []
    assert _clock_run(monkeypatch, 5.0, {"TORCHELASTIC_RUN_ID": "job"}) == []
    assert _clock_run(monkeypatch, 40.0, {}) == []
