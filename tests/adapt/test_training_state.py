"""The run dir's saved training state: every process's part is in it when the main process renames it."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from ladderize.adapt.config import AdaptConfig
from ladderize.adapt.training_state import save_accelerate_state


class TwoRanks:
    """Two processes' Accelerators as threads: ``save_state`` writes each rank's own file, as Accelerate's does
    (every process makes the folder, the main process writes the model, every process ``random_states_{rank}.pkl``,
    with no wait at the end)."""

    def __init__(self, rank: int, barrier: threading.Barrier, slow_rank: int):
        self.process_index, self.barrier, self.slow_rank = rank, barrier, slow_rank
        self.is_main_process = rank == 0

    def wait_for_everyone(self) -> None:
        self.barrier.wait(timeout=30)

    def save_state(self, output_dir: str, safe_serialization: bool) -> None:
        out = Path(output_dir)
        out.mkdir(parents=True, exist_ok=True)
        if self.is_main_process:
            (out / "model.bin").write_bytes(b"weights")
        if self.process_index == self.slow_rank:
            time.sleep(0.5)  # a process that is slower to reach its write
        (out / f"random_states_{self.process_index}.pkl").write_bytes(b"rng")


def test_every_process_state_file_is_saved_before_the_rename(tmp_path):
    state_dir = tmp_path / "run" / "state"
    config = AdaptConfig(checkpoint="c", out="o")
    barrier, errors = threading.Barrier(2), []

    def rank(r: int) -> None:
        try:
            for step in (2, 4):  # the second save replaces the first
                save_accelerate_state(TwoRanks(r, barrier, slow_rank=1), state_dir, config, step, 64 * step, 1.0, 1.0,
                                      [{"step": step}])
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(f"rank {r}: {type(exc).__name__}: {exc}")
            barrier.abort()

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    assert sorted(p.name for p in state_dir.iterdir()) == ["model.bin", "random_states_0.pkl", "random_states_1.pkl",
                                                           "trainer_state.json"]
    assert sorted(p.name for p in state_dir.parent.iterdir()) == ["curve.json", "state"]  # no temp folders left


def test_saving_a_tied_model_does_not_warn_about_the_shared_tensor(caplog, monkeypatch) -> None:
    """Issue 37 item 13: "[RANK 0] Removed shared tensor {'student.lm_head.weight'} while saving" at every kd save."""
    import logging

    import torch
    from accelerate import PartialState
    from accelerate.utils.other import clean_state_dict_for_safetensors

    from ladderize.adapt.training_state import _quiet_tied_weights

    PartialState()  # accelerate's logger needs its state
    log = logging.getLogger("accelerate.utils.other")
    monkeypatch.setattr(log, "level", logging.WARNING)
    weight = torch.zeros(4, 4)
    with caplog.at_level(logging.WARNING, logger="accelerate.utils.other"):
        clean_state_dict_for_safetensors({"embed.weight": weight, "lm_head.weight": weight})  # accelerate's own line
        assert "Removed shared tensor" in caplog.text
        caplog.clear()
        with _quiet_tied_weights():
            clean_state_dict_for_safetensors({"embed.weight": weight, "lm_head.weight": weight})
        assert "Removed shared tensor" not in caplog.text
        assert log.level == logging.WARNING  # put back


def _clock_run(monkeypatch, save_s: float, env: dict[str, str]) -> list[str]:
    """A SaveClock saving after every step of 2 s, each save taking ``save_s``, under ``env``: what it said."""
    import pytest

    from ladderize.adapt.training_state import SaveClock
    from ladderize.errors import Interrupted

    for key in ("TORCHELASTIC_RUN_ID", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    now = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: now[0])
    said: list[str] = []
    clock = SaveClock(AdaptConfig(checkpoint="c", out="o", save_every=1), said.append)
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
