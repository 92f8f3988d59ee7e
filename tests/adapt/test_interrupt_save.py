"""A Ctrl-C or SIGTERM during a stage's steps is held to the end of its step, the training state is saved there,
and the run stops (``errors.holding_interrupts``, ``training_state.SaveClock``): a resume goes on bit for bit, and the
interrupt loses no step, however long ago the last timed save was."""

from __future__ import annotations

import json
import os
import signal

import pytest
import torch

from ladderize.adapt.config import AdaptConfig
from ladderize.adapt.train import adapt
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
    whole = adapt(AdaptConfig(out=str(tmp_path / "whole"), **common))
    cut = AdaptConfig(out=str(tmp_path / "cut"), **common)  # saves by time: a minute in, far past this run's steps
    previous = install_interrupt_handlers()
    try:
        with pytest.raises(Interrupted) as stopped:
            adapt(cut, progress=_interrupt_at(3, signum))
    finally:
        restore_handlers(previous)
    assert stopped.value.signum == signum and not (tmp_path / "cut").exists()
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
