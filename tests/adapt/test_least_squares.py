"""The closed-form start of the sequential stage: the ridge solve, the refit's loss, the pull to the old weights, exact resume."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ladderize.adapt.plan.config import AdaptConfig, validate_config
from ladderize.adapt.layers.layer_source import ResidentLayers
from ladderize.adapt.sequential.layer_training import StateCache
from ladderize.adapt.sequential.least_squares import NormalEquations, _batches, refit_output_projections
from ladderize.adapt.objectives.losses import layer_error
from ladderize.adapt.plan.stages import describe, parse_stage
from ladderize.adapt.stage_run import adapt
from ladderize.checkpoint.io import load_model
from ladderize.errors import LadderizeError
from tests.adapt.test_streaming import _config, assert_same_checkpoint, hybrid_dir  # noqa: F401  (a fixture)
from ladderize.adapt.plan.planned_stage import PlannedStage

BATCH = 2


def test_the_solve_is_the_ridge_closed_form_towards_the_current_weights():
    generator = np.random.default_rng(0)
    z1, z2 = generator.normal(size=(40, 6)), generator.normal(size=(25, 6))
    r1, r2 = generator.normal(size=(40, 3)), generator.normal(size=(25, 3))
    w0 = generator.normal(size=(3, 6))
    equations = NormalEquations.zeros(6, 3)
    equations.add(torch.tensor(z1, dtype=torch.float32), torch.tensor(r1, dtype=torch.float32), 0.5)
    equations.add(torch.tensor(z2, dtype=torch.float32).reshape(5, 5, 6), torch.tensor(r2, dtype=torch.float32).reshape(5, 5, 3),
                  2.0)
    z1, z2, r1, r2 = (torch.tensor(a, dtype=torch.float32).double().numpy() for a in (z1, z2, r1, r2))  # the float32 data
    for ridge in (1e-2, 1.0):
        weight, change = equations.solve(torch.tensor(w0), ridge)
        gram, cross = 0.5 * z1.T @ z1 + 2.0 * z2.T @ z2, 0.5 * z1.T @ r1 + 2.0 * z2.T @ r2
        lam = ridge * np.trace(gram) / 6
        reference = np.linalg.solve(gram + lam * np.eye(6), cross + lam * w0.T).T
        np.testing.assert_allclose(weight.numpy(), reference, rtol=1e-10, atol=1e-12)

        def objective(w):
            return 0.5 * ((z1 @ w.T - r1) ** 2).sum() + 2.0 * ((z2 @ w.T - r2) ** 2).sum()

        assert change == pytest.approx(objective(reference) - objective(w0), rel=1e-9) and change < 0


@torch.no_grad()
def calibration_loss(cache: StateCache, layer: torch.nn.Module, teacher_out, *, local_inputs: str, batch_size: int,
                     launch=None) -> float:
    """The reference: the layer's local loss on the calibration set, ``layer_error`` of each batch of ``batch_size``
    rows (in order), weighted by its share of the rows, which the refit's predicted losses are held to."""
    from ladderize.adapt.process_group import sum_over_processes
    from ladderize.checkpoint.placement import LaunchRank

    launch = launch or LaunchRank()
    inputs = cache.student_state if local_inputs == "student" else cache.teacher_state
    total = torch.zeros((), dtype=torch.float64, device=cache.device)
    for count, t_in, s_in, t_out, shared in _batches(cache, layer.mode, teacher_out, inputs, batch_size, launch):
        with cache.autocast():
            s_out = layer(s_in[0], s_in[1], **cache.kwargs(len(s_in[0])))
        total += layer_error(layer.mode, t_in, s_out, t_out, local_inputs, shared=shared).double() * (count / cache.num_train)
    sum_over_processes([total])
    return total.item()


def _refit_each_layer(checkpoint, dense_dir, text_file, local_inputs="student", **refit) -> list[tuple]:
    """Every converted layer refit in turn on ``local_inputs``' states, as the sequential stage does (without its training):
    per layer, the refit's record, the loss measured before and after, and the weights before and after."""
    from ladderize.corpus.windows import pack_tokens
    from transformers import AutoTokenizer

    data = pack_tokens(str(text_file), AutoTokenizer.from_pretrained(dense_dir), 32, max_tokens=32 * 9)  # ragged batches
    student, teacher = ResidentLayers(load_model(checkpoint)), ResidentLayers(load_model(dense_dir))
    converted = student.model.layout.converted_layers
    cache = StateCache(teacher, data, min(converted))
    fits = []
    for index in range(min(converted), max(converted) + 1):
        with teacher.layer(index) as teacher_layer:
            teacher_out = cache.teacher_output(teacher_layer)
        with student.layer(index) as layer:
            if index in converted:
                def loss() -> float:
                    return calibration_loss(cache, layer, teacher_out, local_inputs=local_inputs, batch_size=BATCH)

                measured, old = loss(), _weights(layer)
                fit = refit_output_projections(cache, layer, teacher_out, local_inputs=local_inputs, batch_size=BATCH, **refit)
                fits.append((fit, measured, loss(), old, _weights(layer)))
            cache.advance(layer, teacher_out)
    return fits


def _weights(layer) -> dict[str, torch.Tensor]:
    return {name: tensor.clone() for name, tensor in layer.state_dict().items()}


@pytest.mark.parametrize("layout,inputs", [("ladder", "student"), ("hybrid", "student"), ("ladder", "teacher")])
def test_the_refit_never_raises_a_layers_local_loss(layout, inputs, ladder_dir, hybrid_dir, dense_dir, text_file):
    fits = _refit_each_layer({"ladder": ladder_dir, "hybrid": hybrid_dir}[layout], dense_dir, text_file, inputs)
    assert [fit.layer for fit, *_ in fits] == ([2, 3] if layout == "ladder" else [1, 3])
    for fit, before, after, old, new in fits:
        print(fit.describe(), f"(measured {before:.6g} -> {after:.6g})")
        assert fit.before == pytest.approx(before, rel=1e-5)
        assert fit.after == pytest.approx(after, rel=1e-4)  # down_proj's refit is exact: the loss it predicts is measured
        assert after <= before
        changed = {k for k in old if not torch.equal(old[k], new[k])}
        assert changed <= {"self_attn.o_proj.weight", "mlp.down_proj.weight"} and "mlp.down_proj.weight" in changed
        if fit.layer == 3 or layout == "ladder":  # ladder: linear in o_proj, so its refit is always kept
            assert fit.fitted == ("o_proj", "down_proj") and changed == {"self_attn.o_proj.weight", "mlp.down_proj.weight"}
    assert any(after < 0.9 * before for _, before, after, *_ in fits)


def test_an_o_proj_refit_that_raises_the_loss_is_undone(ladder_dir, dense_dir, text_file, monkeypatch):
    solve = NormalEquations.solve

    def overshooting(self, weight, ridge):  # o_proj's solve (the first of each layer) lands far off
        new, change = solve(self, weight, ridge)
        return (-3 * new, change) if self.gram.shape[0] == 48 else (new, change)

    monkeypatch.setattr(NormalEquations, "solve", overshooting)
    for fit, before, after, old, new in _refit_each_layer(ladder_dir, dense_dir, text_file):
        assert fit.fitted == ("down_proj",) and fit.kept == ("o_proj",) and "o_proj kept: its refit raised" in fit.describe()
        assert torch.equal(new["self_attn.o_proj.weight"], old["self_attn.o_proj.weight"])
        assert after <= before and fit.after == pytest.approx(after, rel=1e-4)


def test_a_huge_ridge_keeps_the_weights(ladder_dir, dense_dir, text_file):
    for fit, before, after, old, new in _refit_each_layer(ladder_dir, dense_dir, text_file, ridge=1e12):
        for name in ("self_attn.o_proj.weight", "mlp.down_proj.weight"):
            assert (new[name] - old[name]).abs().max() <= 1e-6 * old[name].abs().max(), name
        assert after == pytest.approx(before, rel=1e-5)


def test_closed_form_runs_resume_bit_for_bit_and_differ_from_plain_runs(hybrid_dir, text_file, tmp_path):
    messages = []
    whole = adapt(_config(hybrid_dir, tmp_path / "whole", text_file, closed_form=True), on_message=messages.append)
    refits = [m for m in messages if "closed-form" in m]
    assert [m.split(":")[0] for m in refits] == ["layer 1", "layer 3"], messages
    assert "layer 3: closed-form o_proj, down_proj (ridge 28.4): local loss " in refits[1]  # 8,192 / (9 x 32 tokens)
    per_layer = whole.steps // 2
    interrupted = _config(hybrid_dir, tmp_path / "resumed", text_file, closed_form=True)
    partial = adapt(interrupted, stop_after_steps=per_layer + 3)  # killed inside layer 3; layer 1 was written
    assert partial.steps == per_layer + 3 and not (tmp_path / "resumed").exists()
    messages.clear()
    resumed = adapt(interrupted, resume=True, on_message=messages.append)
    assert [m.split(":")[0] for m in messages if "closed-form" in m] == ["layer 3"]  # layer 1 is read from its file
    assert resumed.resumed_from_step == per_layer and resumed.steps == whole.steps
    assert [r["loss_local"] for r in resumed.curve] == [r["loss_local"] for r in whole.curve]
    assert_same_checkpoint(tmp_path / "whole", tmp_path / "resumed")
    plain = adapt(_config(hybrid_dir, tmp_path / "plain", text_file))
    assert plain.curve[0]["loss_local"] > whole.curve[0]["loss_local"]  # the training starts from the refit
    assert interrupted.fingerprint()["closed_form"] is True  # a resume must share it


def test_a_stage_sets_it_and_only_the_sequential_stage_takes_it(hybrid_dir, tmp_path):
    stage = parse_stage("seq-local:closed_form=true")
    assert stage.settings.record() == {"closed_form": True}
    assert "closed_form True" in describe(PlannedStage.from_step({"stage": 1, "name": "seq-local", "objectives": "local", "local_schedule": "sequential",
                                          "tokens": 8192, "epochs": 1.0, "lr": 1e-3, "closed_form": True}))
    with pytest.raises(LadderizeError, match="seq-local stage"):
        validate_config(AdaptConfig.from_flat(checkpoint=str(hybrid_dir), out=str(tmp_path / "x"), objectives="local", closed_form=True))
