"""A Ctrl-C or SIGTERM during a stage's steps is held to the end of its step, the training state is saved there,
and the run stops (``errors.holding_interrupts``, ``training_state.SaveClock``): a resume goes on bit for bit, and the
interrupt loses no step, however long ago the last timed save was."""

from __future__ import annotations

import json
import os
import signal

import pytest
import torch

from ladderize.adapt.plan.config import AdaptConfig
from ladderize.adapt.stage_run import adapt
from ladderize.checkpoint.io import load_model
from ladderize.errors import Interrupted, install_interrupt_handlers, restore_handlers


def _interrupt_at(step: int, signum: int):
    def progress(info, _model) -> None:
        if info.step == step:
            os.kill(os.getpid(), signum)  # delivered mid-step: before this step's save point
    return progress


@pytest.mark.parametrize("schedule,objectives,shard,signum", [("joint", "kd", "ddp", signal.SIGINT),
                                                              ("joint", "kd", "fsdp", signal.SIGTERM),
                                                              ("sequential", "local", "auto", signal.SIGTERM)],
                         ids=["replicated", "sharded", "sequential"])
def test_an_interrupt_saves_at_its_step_and_the_resume_goes_on_bit_for_bit(schedule, objectives, shard, signum,
                                                                          ladder_dir, text_file, tmp_path):
    common = dict(checkpoint=str(ladder_dir), data=str(text_file), objectives=objectives, local_schedule=schedule,
                  tokens=32 * 2 * 4, seq_len=32, batch_size=2, lr=1e-3, epochs=2.0, dtype="float32", device="cpu",
                  shard=shard, compile=False)
    whole = adapt(AdaptConfig.from_flat(out=str(tmp_path / "whole"), **common))
    cut = AdaptConfig.from_flat(out=str(tmp_path / "cut"), **common)  # saves by time: a minute in, far past this run's steps
    stopped = _interrupted(lambda: adapt(cut, progress=_interrupt_at(3, signum)))
    assert stopped.signum == signum and not (tmp_path / "cut").exists()
    saved = json.loads((tmp_path / "cut.adapt-run" / "state" / "trainer_state.json").read_text())
    assert saved["step"] == 3  # the interrupted step itself, saved: nothing lost
    resumed = adapt(cut, resume=True)
    assert resumed.resumed_from_step == 3 and resumed.steps == whole.steps
    a, b = load_model(tmp_path / "whole").state_dict(), load_model(tmp_path / "cut").state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_second_interrupt_unwinds_at_once_and_one_outside_the_steps_is_not_held():
    from ladderize.errors import held_interrupt, holding_interrupts

    previous = install_interrupt_handlers()
    try:
        with pytest.raises(Interrupted):
            with holding_interrupts():
                os.kill(os.getpid(), signal.SIGINT)
                assert held_interrupt() == signal.SIGINT  # held, the step goes on
                os.kill(os.getpid(), signal.SIGINT)  # the second one does not wait
                raise AssertionError("not reached")
        install_interrupt_handlers()
        with pytest.raises(Interrupted):
            with holding_interrupts():
                os.kill(os.getpid(), signal.SIGTERM)
        assert held_interrupt() is None  # leaving the steps with one held raised it
        install_interrupt_handlers()
        with pytest.raises(Interrupted):
            os.kill(os.getpid(), signal.SIGINT)  # outside the steps: at once, as before
            raise AssertionError("not reached")
    finally:
        restore_handlers(previous)


def _interrupted(run) -> Interrupted:
    """``run()`` with ladderize's signal handlers installed: the ``Interrupted`` it must raise (handlers restored)."""
    previous = install_interrupt_handlers()
    try:
        with pytest.raises(Interrupted) as stopped:
            run()
    finally:
        restore_handlers(previous)
    return stopped.value


def _signal_in_step(step: int, signum: int, trainer_module, monkeypatch):
    """Send ``signum`` from inside optimizer step ``step`` (at its schedule's update, after the weights moved), with the
    losses logged every 10 steps: between two logged steps."""
    schedule = trainer_module.warmup_cosine

    def wrapped(*args, **kwargs):
        inner = schedule(*args, **kwargs)

        def factor(index: int) -> float:
            if index == step:
                os.kill(os.getpid(), signum)
            return inner(index)
        return factor

    monkeypatch.setattr(trainer_module, "warmup_cosine", wrapped)
    monkeypatch.setattr(trainer_module, "log_interval", lambda _device: 10)


def test_a_signal_between_logged_steps_stops_at_that_step_and_the_resume_goes_on_bit_for_bit(
        ladder_dir, text_file, tmp_path, monkeypatch):
    """The joint training hears a held signal at every step's end, not only at the logged steps (every 10 on CUDA)."""
    from ladderize.adapt.train import trainer

    common = dict(checkpoint=str(ladder_dir), data=str(text_file), objectives="kd", tokens=32 * 2 * 6, seq_len=32,
                  batch_size=2, lr=1e-3, dtype="float32", device="cpu", compile=False)
    monkeypatch.setattr(trainer, "log_interval", lambda _device: 10)
    whole = adapt(AdaptConfig.from_flat(out=str(tmp_path / "whole"), **common))
    cut = AdaptConfig.from_flat(out=str(tmp_path / "cut"), **common)
    with monkeypatch.context() as patched:
        _signal_in_step(3, signal.SIGINT, trainer, patched)
        _interrupted(lambda: adapt(cut))
    saved = json.loads((tmp_path / "cut.adapt-run" / "state" / "trainer_state.json").read_text())
    assert saved["step"] == 3  # that step, not the next logged one (10) or the end (6)
    resumed = adapt(cut, resume=True)
    assert resumed.resumed_from_step == 3 and resumed.steps == whole.steps == 6
    a, b = load_model(tmp_path / "whole").state_dict(), load_model(tmp_path / "cut").state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_the_shutdown_window_warning_repeats_for_every_slower_save(monkeypatch):
    """Under torchrun a save that outlasts the shutdown window warns, and so does each later save slower than the last
    one warned about; a faster one stays quiet."""
    import time

    from ladderize.adapt.train.training_state import SaveClock

    now = [1000.0]
    monkeypatch.setattr(time, "perf_counter", lambda: now[0])
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "test")
    monkeypatch.setenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "30")
    said: list[str] = []
    clock = SaveClock(AdaptConfig.from_flat(checkpoint="", out=""), said.append)
    warned = []
    for step, (step_s, save_s) in enumerate(((5, 40), (5, 20), (5, 60), (5, 50), (10, 80)), 1):
        now[0] += step_s
        clock.due(step, "cpu")  # the step ended
        now[0] += save_s
        clock.saved()
        warned.append(len(said))
    assert warned == [1, 1, 2, 2, 3]
    assert "about 65 s" in said[1] and "about 90 s" in said[2] and "--shutdown_timeout 180" in said[2]


@pytest.mark.parametrize("stage", ["kd", "sequential"])
def test_under_a_launcher_a_signal_one_process_holds_stops_every_process_at_one_step(stage, ladder_dir, text_file,
                                                                                     tmp_path):
    """Two processes (torchrun, gloo), a SIGINT to rank 1 alone inside step 3, in a kd stage whose losses are logged
    every 10 steps and in the sequential stage (8 steps a layer): the processes' vote (no wait on the device) stops
    both at step 4's end, the state saved there, far before the end."""
    import subprocess
    from pathlib import Path

    from tests.adapt.test_multiprocess import launch_failure
    from tests.adapt.test_sharded import _env, _torchrun

    worker = Path(__file__).with_name("interrupt_vote_worker.py")
    env = {**_env(tmp_path), "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run([*_torchrun(2), str(worker), str(ladder_dir), str(text_file), str(tmp_path / "out"),
                           *(["sequential"] if stage == "sequential" else [])],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, launch_failure(done.stderr)
    reports = sorted((r["rank"], r["signum"], r["step"]) for r in map(json.loads, done.stdout.splitlines()[-2:]))
    assert reports == [(0, signal.SIGINT, 4), (1, signal.SIGINT, 4)]
    assert not (tmp_path / "out").exists()


def test_a_signal_while_the_sequential_stage_moves_its_states_stops_at_once_and_the_resume_goes_on(
        ladder_dir, text_file, tmp_path, monkeypatch):
    """The states' advance past a trained layer (a pass over the calibration set, long at a long sequence length) is
    not held for a save point: the layer is saved before it, so a signal there stops the run at once, and the resume
    recomputes the states and ends as an uninterrupted run does, bit for bit."""
    from ladderize.adapt.sequential.layer_training import StateCache

    common = dict(checkpoint=str(ladder_dir), data=str(text_file), objectives="local", local_schedule="sequential",
                  tokens=32 * 2 * 4, seq_len=32, batch_size=2, lr=1e-3, epochs=1.0, dtype="float32", device="cpu",
                  compile=False)
    whole = adapt(AdaptConfig.from_flat(out=str(tmp_path / "whole"), **common))
    advance, moved, sent = StateCache.advance, [], []

    def signalled(self, layer, teacher_out):
        if not sent:
            sent.append(self.layer)
            os.kill(os.getpid(), signal.SIGINT)
        advance(self, layer, teacher_out)
        moved.append(self.layer)

    cut = AdaptConfig.from_flat(out=str(tmp_path / "cut"), **common)
    monkeypatch.setattr(StateCache, "advance", signalled)
    try:
        _interrupted(lambda: adapt(cut))
    finally:
        monkeypatch.undo()
    assert moved == []  # stopped in the advance, not after it
    saved = json.loads((tmp_path / "cut.adapt-run" / "state" / "trainer_state.json").read_text())
    assert saved["layer_done"] == sent[0] and "partial" not in saved
    resumed = adapt(cut, resume=True)
    assert resumed.steps == whole.steps
    a, b = load_model(tmp_path / "whole").state_dict(), load_model(tmp_path / "cut").state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
