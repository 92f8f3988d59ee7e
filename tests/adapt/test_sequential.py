"""The sequential local schedule: layer by layer on cached states, exact resume, clear refusals."""

from __future__ import annotations

import pytest
import torch

from ladderize.convert.residual_states import embed, run_layers
from ladderize.adapt.plan.config import AdaptConfig
from ladderize.adapt.stage_run import adapt
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
    return AdaptConfig.from_flat(**{**settings, **kw})


def test_sequential_trains_each_layer_in_order_and_lowers_the_output_error(hybrid_dir, dense_dir, text_file, tmp_path):
    result = adapt(_config(hybrid_dir, tmp_path / "seq", text_file))
    layers = [record["layer"] for record in result.curve]
    assert layers == sorted(layers) and set(layers) == {1, 3}  # the dense layer 2 is not trained
    assert result.steps == 2 * 12  # 8 sequences x 3 epochs / batch 2, per converted layer
    for index in (1, 3):
        losses = [r["loss_local"] for r in result.curve if r["layer"] == index]
        assert sum(losses[-3:]) / 3 < 0.8 * losses[0], (index, losses)
    from ladderize.corpus.windows import pack_tokens
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


@pytest.mark.parametrize("closed_form", [False, True])
def test_sequential_saves_partway_through_a_layer_and_resumes_there_bit_identical(closed_form, hybrid_dir, text_file, tmp_path):
    """A layer's training is saved partway (by the save clock: here every 5 steps), so an interrupt loses at most the
    steps since; the resume continues the layer's AdamW state, schedule and losses exactly (a refit layer is not
    refit again). The resume reads the states the interrupted attempt kept entering layer 3; with those states gone
    (the closed-form case here) it recomputes them through the finished layers, to the same result."""
    whole = adapt(_config(hybrid_dir, tmp_path / "whole", text_file, closed_form=closed_form))
    interrupted = _config(hybrid_dir, tmp_path / "resumed", text_file, save_every=5, closed_form=closed_form)
    partial = adapt(interrupted, stop_after_steps=17)  # killed inside layer 3 (steps 13-24); saved at step 15
    assert partial.steps == 17
    state = tmp_path / "resumed.adapt-run" / "state"
    assert sorted(f.name for f in state.glob("partial-*")) == [
        "partial-00000015-layer-00003.safetensors", "partial-00000015-optimizer.safetensors"]
    assert sorted(f.name for f in state.glob("states-*")) == ["states-rank00000.safetensors"]
    if closed_form:
        (state / "states-rank00000.safetensors").unlink()
    seen = []
    resumed = adapt(interrupted, resume=True, progress=lambda info, _model: seen.append(("step", info.step, info.total_steps)),
                    on_phase=lambda what, done, total: seen.append((what, done, total)))
    assert resumed.resumed_from_step == 15 and resumed.steps == whole.steps
    label = "recomputing the states through the finished layers 1:3"  # layers 1 and 2: 2 passes of 3 chunks each
    recomputed = [(done, total) for what, done, total in seen if what == label]
    caching = [what for what, *_ in seen if what.startswith("caching the teacher's states")]
    if closed_form:
        assert recomputed == [(i, 12) for i in range(13)] and caching
        assert seen.index((label, 12, 12)) < seen.index(("step", 16, 24))
    else:
        assert recomputed == [] and caching == []  # the kept states are read: nothing below layer 3 runs
    assert [r["loss_local"] for r in resumed.curve] == [r["loss_local"] for r in whole.curve]
    assert [r.get("eval_before") for r in resumed.curve] == [r.get("eval_before") for r in whole.curve]
    assert resumed.curve[14]["train_s"] <= resumed.curve[15]["train_s"]  # the saved attempt's time carries on
    a, b = load_model(tmp_path / "whole").state_dict(), load_model(tmp_path / "resumed").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_the_training_time_an_interrupted_attempt_spent_past_its_save_counts_on_the_resume(hybrid_dir, text_file, tmp_path):
    """A stage's train_s is the time of all its attempts: Ctrl-C at step 8 of an attempt saved at step 5 keeps the
    time of steps 6-8 (here a second slept in step 7's report) for the resume, which redoes them on top of it."""
    import time

    config = _config(hybrid_dir, tmp_path / "out", text_file, save_every=5)
    reported = {}

    def interrupt(info, _model) -> None:
        reported[info.step] = info.train_s
        if info.step == 7:
            time.sleep(1.0)
        if info.step == 8:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        adapt(config, progress=interrupt)
    resumed = adapt(config, resume=True)
    assert resumed.resumed_from_step == 5
    assert resumed.curve[4]["train_s"] < reported[8] - 0.9  # step 5, saved
    assert resumed.curve[5]["train_s"] >= reported[8]  # step 6, redone after the interrupted attempt's time
    assert resumed.train_s >= reported[8] + (resumed.curve[-1]["train_s"] - resumed.curve[5]["train_s"])
    assert not (tmp_path / "out.adapt-run").exists()


def test_sequential_saves_a_layer_partway_a_minute_in_by_default(hybrid_dir, text_file, tmp_path, monkeypatch):
    """Without --save-every the save clock's first save (a minute in; here at once) comes partway through a layer."""
    from ladderize.adapt.train import training_state

    monkeypatch.setattr(training_state, "FIRST_SAVE_S", 0.0)
    partial = adapt(_config(hybrid_dir, tmp_path / "out", text_file), stop_after_steps=5)  # inside layer 1 (steps 1-12)
    assert partial.steps == 5
    state = tmp_path / "out.adapt-run" / "state"
    assert {f.name for f in state.glob("partial-*")} == {"partial-00000001-layer-00001.safetensors", "partial-00000001-optimizer.safetensors"}
    resumed = adapt(_config(hybrid_dir, tmp_path / "out", text_file), resume=True, stop_after_steps=1)
    assert resumed.resumed_from_step == 1


@pytest.mark.parametrize(
    "change,message",
    [({"objectives": "local,kd"}, "local objective alone"), ({"train": "all"}, "converted layers"), ({"epochs": 0}, "epochs")],
)
def test_sequential_refuses_what_it_cannot_do(change, message, hybrid_dir, text_file, tmp_path):
    with pytest.raises(LadderizeError, match=message):
        adapt(_config(hybrid_dir, tmp_path / "x", text_file, **change))


def test_a_one_step_layer_reports_its_loss_before_and_after_on_the_same_held_out_batch(hybrid_dir, text_file, tmp_path):
    """Issue 26 item 8: with one step per layer, 'before' and 'after' were the same step's loss (+0.0%)."""
    from ladderize.adapt.sequential.layer_training import layer_summary

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
    from ladderize.adapt.plan.sequential_schedule import layer_epochs

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
    ({"window": 0}, "window must be at least 1"),
    ({"window": 2, "local_schedule": "joint"}, "use it in a seq-local stage"),
    ({"window": 2, "closed_form": True}, "does not combine with window > 1"),
])
def test_an_impossible_epochs_ramp_is_refused(change, message, hybrid_dir, text_file, tmp_path):
    with pytest.raises(LadderizeError, match=message):
        adapt(_config(hybrid_dir, tmp_path / "x", text_file, **change))


def test_a_window_s_loss_is_the_mean_of_its_layers_errors_along_the_student_s_own_chain(ladder_dir, dense_dir):
    """``window``: layer 3 is fed layer 2's output of the same step, and the loss is the mean of both layers' errors,
    here against the plain model run of the teacher and the (zero-shot) student."""
    from ladderize.adapt.layers.layer_source import ResidentLayers
    from ladderize.adapt.sequential.layer_training import StateCache, train_layer
    from ladderize.adapt.objectives.losses import layer_error

    teacher_model, student_model = load_model(dense_dir), load_model(ladder_dir)
    data = torch.randint(3, 120, (6, 16), generator=torch.Generator().manual_seed(4))
    cache = StateCache(ResidentLayers(teacher_model), data, 2, held_out=2)
    with torch.no_grad():
        state, kwargs = embed(teacher_model, data[4:6])  # the held-out rows: the window's evaluation batch
        x = run_layers(teacher_model, state, kwargs, 0, 2)
        t2 = run_layers(teacher_model, x, kwargs, 2, 3)
        t3 = run_layers(teacher_model, t2, kwargs, 3, 4)
        s2 = run_layers(student_model, x, kwargs, 2, 3)
        s3 = run_layers(student_model, s2, kwargs, 3, 4)
        modes = student_model.layout.modes
        expected = (layer_error(modes[2], x, s2, t2, "student") + layer_error(modes[3], t2, s3, t3, "student")) / 2
    with cache.teacher.layer(2) as teacher2, cache.teacher.layer(3) as teacher3:
        outs = cache.teacher_outputs([teacher2, teacher3])
    torch.testing.assert_close(outs[1][0][4:6], t3[0])
    settings = dict(local_inputs="student", epochs=2, batch_size=2, lr=1e-4, min_lr_ratio=0.1, warmup_steps=1,
                    max_grad_norm=1.0, seed=0)
    layers = student_model.model.layers
    fit = train_layer(cache, [layers[2], layers[3]], outs, **settings)
    assert fit.before == pytest.approx(expected.item(), rel=1e-5)
    assert fit.held_out and len(fit.losses) == 4 and fit.losses[-1] < 0.7 * fit.losses[0], fit.losses
    # layer 3's error reaches layer 2 through the window: with another layer 3 (and no clipping, which would couple
    # them by the norm; AdamW is per element), layer 2 trains otherwise; were it cut off, its steps would be the same
    trained = []
    for scale in (1.0, 1.1):
        other = load_model(ladder_dir).model.layers
        with torch.no_grad():
            other[3].mlp.up_proj.weight.mul_(scale)
        train_layer(cache, [other[2], other[3]], outs, **{**settings, "max_grad_norm": 0.0})
        trained.append(other[2].mlp.down_proj.weight.clone())
    assert not torch.equal(*trained)


def test_windows_train_consecutive_layers_together_and_resume_exactly(ladder_dir, hybrid_dir, text_file, tmp_path):
    """Ladder on layers 2-3: one window of two (half the flat stage's steps, each step trains both layers); on the
    hybrid (converted layers 1 and 3, dense 2 between) windows of one, so ``window=2`` is the flat stage bit for bit."""
    from ladderize.adapt.plan.sequential_schedule import layer_windows

    assert layer_windows([6, 7, 8, 9, 12, 18, 20, 21, 22], 2) == [[6, 7], [8, 9], [12], [18], [20, 21], [22]]
    messages: list[str] = []
    result = adapt(_config(ladder_dir, tmp_path / "window", text_file, window=2), on_message=messages.append)
    assert result.steps == 12 and {r["layer"] for r in result.curve} == {2}  # 8 sequences x 3 epochs / batch 2
    assert "12 steps per window of 2 layers (one window at a time from safetensors" in "\n".join(messages)
    from ladderize.adapt.plan.cost import layer_parameters
    from ladderize.checkpoint.io import load_config

    pace = result.throughput  # a step trains both layers of the window: 6 x their parameters per token
    assert pace["model_flops_per_token"] == 6 * 2 * layer_parameters(load_config(ladder_dir))
    assert pace["tokens_per_s"] == round(result.tokens / result.train_s, 1) and pace["processes"] == 1
    start = load_model(ladder_dir).state_dict()
    changed = {n.split(".")[2] for n, p in load_model(tmp_path / "window").state_dict().items() if not torch.equal(p, start[n])}
    assert changed == {"2", "3"}
    partial = adapt(_config(ladder_dir, tmp_path / "resumed", text_file, window=2), stop_after_steps=5)
    assert partial.steps == 5
    resumed = adapt(_config(ladder_dir, tmp_path / "resumed", text_file, window=2), resume=True)
    assert resumed.resumed_from_step == 0 and resumed.steps == 12  # nothing was saved inside the window
    a, b = load_model(tmp_path / "window").state_dict(), load_model(tmp_path / "resumed").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    adapt(_config(hybrid_dir, tmp_path / "flat", text_file))
    adapt(_config(hybrid_dir, tmp_path / "pairs", text_file, window=2))
    a, b = load_model(tmp_path / "flat").state_dict(), load_model(tmp_path / "pairs").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
