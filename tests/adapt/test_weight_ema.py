"""The moving average of the weights (``ema=DECAY`` on a joint stage): its formula, what the stage writes, its resume."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.checkpoint import FileSystemReader

from ladderize.adapt.plan.config import AdaptConfig, validate_config
from ladderize.adapt.stage_run import adapt
from ladderize.adapt.train.training_state import DCP_DIR
from ladderize.adapt.train.weight_ema import WeightEMA
from ladderize.checkpoint.io import load_model, read_provenance
from ladderize.errors import LadderizeError


def test_the_average_starts_at_the_weights_and_follows_them():
    param = torch.nn.Parameter(torch.tensor([0.0, 4.0]))
    ema = WeightEMA([param], decay=0.75)
    with torch.no_grad():
        param.copy_(torch.tensor([8.0, 0.0]))
    ema.update()  # 0.75 * start + 0.25 * now
    assert torch.equal(ema.average[0], torch.tensor([2.0, 3.0]))
    with torch.no_grad():
        param.copy_(torch.tensor([2.0, 7.0]))
    ema.update()
    assert torch.equal(ema.average[0], torch.tensor([2.0, 4.0]))
    ema.write_into()
    assert torch.equal(param.detach(), torch.tensor([2.0, 4.0]))


def test_the_average_survives_a_save_and_refuses_other_parameters(tmp_path):
    """The average is a stateful object of the training state's distributed checkpoint."""
    import torch.distributed.checkpoint as dcp

    params = [torch.nn.Parameter(torch.randn(3, 2)), torch.nn.Parameter(torch.randn(4))]
    ema = WeightEMA(params, decay=0.5)
    ema.average[1].add_(1.0)
    dcp.save({"ema": ema}, checkpoint_id=str(tmp_path / "dcp"), no_dist=True)
    again = WeightEMA(params, decay=0.5)
    dcp.load({"ema": again}, checkpoint_id=str(tmp_path / "dcp"), no_dist=True)
    assert all(torch.equal(a, b) for a, b in zip(ema.average, again.average))
    with pytest.raises(LadderizeError, match="does not match"):
        WeightEMA(params[:1], decay=0.5).load_state_dict(ema.state_dict())


def _common(ladder_dir, text_file, **kw) -> dict:
    return dict(checkpoint=str(ladder_dir), data=str(text_file), objectives="kd", tokens=32 * 2 * 5, seq_len=32,
                batch_size=2, lr=1e-3, save_every=2, **kw)


def test_a_kd_stage_with_ema_writes_the_average_of_its_steps(ladder_dir, text_file, tmp_path):
    """The written weights equal the average computed here, by hand, from the weights after every step."""
    decay = 0.6
    after_steps = []
    adapt(AdaptConfig.from_flat(out=str(tmp_path / "plain"), **_common(ladder_dir, text_file)),
          progress=lambda info, model: after_steps.append({k: v.detach().clone() for k, v in model.state_dict().items()}))
    averaged = tmp_path / "averaged"
    adapt(AdaptConfig.from_flat(out=str(averaged), **_common(ladder_dir, text_file, ema=decay)))
    start, plain, got = (load_model(p, dtype=torch.float32).state_dict() for p in (ladder_dir, tmp_path / "plain", averaged))
    assert len(after_steps) == 5 and all(torch.equal(after_steps[-1][k], plain[k]) for k in plain)
    moved = [k for k in start if not torch.equal(start[k], plain[k])]
    assert moved  # the stage trained something
    for key in start:
        expected = start[key].clone()
        for weights in after_steps:
            expected = decay * expected + (1 - decay) * weights[key]
        assert torch.allclose(got[key], expected, atol=1e-6, rtol=0), key
    assert not torch.allclose(got[moved[0]], plain[moved[0]], atol=1e-4)  # the average is not the last step
    assert read_provenance(averaged)["history"][-1]["ema"] == decay
    assert "ema: 0.6" in (averaged / "README.md").read_text()


def test_a_resumed_stage_with_ema_writes_the_same_bytes(ladder_dir, text_file, tmp_path):
    whole = tmp_path / "whole"
    adapt(AdaptConfig.from_flat(out=str(whole), **_common(ladder_dir, text_file, ema=0.6)))
    interrupted = AdaptConfig.from_flat(out=str(tmp_path / "resumed"), **_common(ladder_dir, text_file, ema=0.6))
    adapt(interrupted, stop_after_steps=3)  # "killed" during step 4; the last state is step 2, with its average
    saved = FileSystemReader(str(tmp_path / "resumed.adapt-run" / "state" / DCP_DIR)).read_metadata()
    assert "ema.0" in saved.state_dict_metadata  # the average, in the state's one checkpoint
    assert adapt(interrupted, resume=True).resumed_from_step == 2
    a, b = load_model(whole).state_dict(), load_model(tmp_path / "resumed").state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("settings, message", [
    (dict(ema=1.0), r"\[0, 1\)"),
    (dict(ema=-0.1), r"\[0, 1\)"),
    (dict(ema=0.9, objectives="local", local_schedule="sequential"), "joint stage"),
    (dict(ema=0.9, objectives="kd", train="lora"), "lora"),
])
def test_ema_refuses_what_it_cannot_honour(settings, message):
    with pytest.raises(LadderizeError, match=message):
        validate_config(AdaptConfig.from_flat(checkpoint="c", out="o", **settings))
