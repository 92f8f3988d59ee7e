"""The sequential local schedule: layer by layer on cached states, exact resume, clear refusals."""

from __future__ import annotations

import pytest
import torch

from ladderize.adapt.residual_states import embed, run_layers
from ladderize.adapt.config import AdaptConfig
from ladderize.adapt.train import adapt
from ladderize.checkpoint.io import load_model
from ladderize.errors import LadderizeError
from tests.adapt.conftest import convert


@pytest.fixture(scope="module")
def hybrid_dir(dense_dir, tmp_path_factory):
    """SPD at TP=3 on layer 1, dense layer 2 in between, ladder on layer 3."""
    return convert(dense_dir, tmp_path_factory.mktemp("hybrid") / "tiny-hybrid", ladder="3:4", spd="1:2", spd_tp_size=3)


def _final_state_error(student_dir, dense_dir, text_ids) -> float:
    """Mean squared difference of the final residual stream, student vs dense teacher."""
    student, teacher = load_model(student_dir), load_model(dense_dir)
    with torch.no_grad():
        s = run_layers(student, *embed(student, text_ids), 0, student.config.num_hidden_layers)[0]
        t = run_layers(teacher, *embed(teacher, text_ids), 0, teacher.config.num_hidden_layers)[0]
    return (s - t).pow(2).mean().item()


def _config(checkpoint, out, text_file, **kw):
    settings = dict(checkpoint=str(checkpoint), out=str(out), data=str(text_file), objectives="local",
                    local_schedule="sequential", tokens=32 * 8, seq_len=32, batch_size=2, epochs=3, lr=3e-4, warmup_steps=1)
    return AdaptConfig(**{**settings, **kw})


def test_sequential_trains_each_layer_in_order_and_lowers_the_output_error(hybrid_dir, dense_dir, text_file, tmp_path):
    result = adapt(_config(hybrid_dir, tmp_path / "seq", text_file))
    layers = [record["layer"] for record in result.curve]
    assert layers == sorted(layers) and set(layers) == {1, 3}  # the dense layer 2 is not trained
    assert result.steps == 2 * 12  # 8 sequences x 3 epochs / batch 2, per converted layer
    for index in (1, 3):
        losses = [r["loss_local"] for r in result.curve if r["layer"] == index]
        assert sum(losses[-3:]) / 3 < 0.8 * losses[0], (index, losses)
    from ladderize.adapt.data import pack_tokens
    from transformers import AutoTokenizer

    ids = pack_tokens(str(text_file), AutoTokenizer.from_pretrained(dense_dir), 32, max_tokens=32 * 8)
    before = _final_state_error(hybrid_dir, dense_dir, ids)
    after = _final_state_error(tmp_path / "seq", dense_dir, ids)
    assert after < 0.5 * before, (before, after)
    changed = {n for n, p in load_model(tmp_path / "seq").state_dict().items() if not torch.equal(p, load_model(hybrid_dir).state_dict()[n])}
    assert changed and all(n.startswith(("model.layers.1.", "model.layers.3.")) for n in changed)


def test_sequential_resume_after_interruption_is_bit_identical(hybrid_dir, text_file, tmp_path):
    whole = adapt(_config(hybrid_dir, tmp_path / "whole", text_file))
    interrupted = _config(hybrid_dir, tmp_path / "resumed", text_file)
    partial = adapt(interrupted, stop_after_steps=17)  # killed inside layer 3; layer 1 was saved
    assert partial.steps == 17 and not (tmp_path / "resumed").exists()
    resumed = adapt(interrupted, resume=True)
    assert resumed.resumed_from_step == 12 and resumed.steps == whole.steps
    assert [r["loss_local"] for r in resumed.curve] == [r["loss_local"] for r in whole.curve]
    a, b = load_model(tmp_path / "whole").state_dict(), load_model(tmp_path / "resumed").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize(
    "change,message",
    [({"objectives": "local,kd"}, "local objective alone"), ({"train": "all"}, "converted layers"), ({"epochs": 0}, "epochs")],
)
def test_sequential_refuses_what_it_cannot_do(change, message, hybrid_dir, text_file, tmp_path):
    with pytest.raises(LadderizeError, match=message):
        adapt(_config(hybrid_dir, tmp_path / "x", text_file, **change))


def test_a_one_step_layer_reports_its_loss_before_and_after_on_the_same_held_out_batch(hybrid_dir, text_file, tmp_path):
    """Issue 26 item 8: with one step per layer, 'before' and 'after' were the same step's loss (+0.0%)."""
    from ladderize.adapt.layer_training import layer_summary

    result = adapt(_config(hybrid_dir, tmp_path / "one", text_file, tokens=32 * 2, epochs=1, lr=1e-3))
    summary = layer_summary(result.curve)
    assert [(e["layer"], e["steps"]) for e in summary] == [(1, 1), (3, 1)]
    for entry in summary:
        assert entry["held_out"] is True  # the text file goes on past the 2 calibration sequences
        assert abs(entry["after"] - entry["before"]) > 1e-3 * entry["before"], entry  # the step moved the layer


def test_a_calibration_set_smaller_than_a_batch_counts_true_tokens_and_steps(hybrid_dir, text_file, tmp_path):
    """Issue 26 item 9: one sequence with --batch-size 4 reported 4 x seq_len tokens per step (copies of one sequence)."""
    messages: list[str] = []
    result = adapt(_config(hybrid_dir, tmp_path / "small", text_file, tokens=32, batch_size=4, epochs=2), on_message=messages.append)
    assert result.calibration_tokens == 32
    assert result.steps == 2 * 2  # 2 epochs of the one sequence, one sequence a step, 2 converted layers
    assert result.tokens == result.steps * 32  # each step trains the one sequence once
    text = "\n".join(messages)
    assert "data: 1 sequence of 32 tokens" in text and "1 sequences" not in text
    assert "smaller than --batch-size 4: a step trains 1 sequence" in text
    assert "sequential: 2 layers (" in text and "2 steps per layer" in text  # was "layers 2, 3, 2 steps each"


@pytest.mark.parametrize("ramp,steps", [(0.5, {1: 6, 3: 18}), (-0.5, {1: 18, 3: 6})])
def test_an_epochs_ramp_shares_the_stage_s_steps_by_depth(ramp, steps, hybrid_dir, text_file, tmp_path):
    """``epochs_ramp``: the lowest of n converted layers trains (1 - ramp) x epochs, the highest (1 + ramp) x epochs,
    so the stage's steps (and token passes) stay those of the flat stage; resume stays bit-identical."""
    from ladderize.adapt.layer_training import layer_epochs

    assert [layer_epochs(2.0, 0.5, i, 3) for i in range(3)] == [1.0, 2.0, 3.0]
    assert layer_epochs(2.0, 0.5, 0, 1) == 2.0  # one layer: nothing to share
    messages: list[str] = []
    config = _config(hybrid_dir, tmp_path / "ramp", text_file, epochs_ramp=ramp)
    result = adapt(config, on_message=messages.append)
    assert {layer: sum(r["layer"] == layer for r in result.curve) for layer in (1, 3)} == steps
    assert result.steps == 2 * 12  # the flat stage's 8 sequences x 3 epochs / batch 2, per converted layer
    assert f"{steps[1]} steps at layer 1 to {steps[3]} at layer 3" in "\n".join(messages)
    partial = adapt(_config(hybrid_dir, tmp_path / "resumed", text_file, epochs_ramp=ramp), stop_after_steps=steps[1] + 2)
    assert partial.steps == steps[1] + 2
    resumed = adapt(_config(hybrid_dir, tmp_path / "resumed", text_file, epochs_ramp=ramp), resume=True)
    assert resumed.resumed_from_step == steps[1]
    a, b = load_model(tmp_path / "ramp").state_dict(), load_model(tmp_path / "resumed").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("change,message", [
    ({"epochs_ramp": 1.0}, r"epochs_ramp must be in \(-1, 1\)"),
    ({"epochs_ramp": 0.5, "local_schedule": "joint"}, "use it in a seq-local stage"),
])
def test_an_impossible_epochs_ramp_is_refused(change, message, hybrid_dir, text_file, tmp_path):
    with pytest.raises(LadderizeError, match=message):
        adapt(_config(hybrid_dir, tmp_path / "x", text_file, **change))
