"""Weight interpolation (``interpolate=ALPHA`` on a joint stage): the output is the line between start and trained."""

from __future__ import annotations

import pytest
import torch

from ladderize.adapt.plan.config import AdaptConfig, validate_config
from ladderize.adapt.train.interpolation import interpolate_weights
from ladderize.adapt.plan.stages import Recipe, parse_stage
from ladderize.checkpoint.io import load_model, read_provenance
from ladderize.errors import LadderizeError
from tests.adapt.conftest import plan_and_run

TINY = dict(seq_len=32, batch_size=2, save_every=1)


def test_interpolate_weights_is_the_line_between_the_two():
    start = {"w": torch.zeros(2, 3), "n": torch.tensor([1, 2])}
    end = {"w": torch.full((2, 3), 4.0, dtype=torch.bfloat16), "n": torch.tensor([3, 4])}
    mid = interpolate_weights(start, end, 0.25)
    assert mid["w"].dtype == torch.bfloat16 and torch.equal(mid["w"], torch.full((2, 3), 1.0, dtype=torch.bfloat16))
    assert torch.equal(mid["n"], end["n"])  # integer buffers are not interpolated
    assert torch.equal(interpolate_weights(start, end, 1.0)["w"], end["w"])
    with pytest.raises(LadderizeError, match="different parameters"):
        interpolate_weights({"w": torch.zeros(3, 2), "n": start["n"]}, end, 0.5)


def test_a_kd_stage_with_interpolate_writes_start_plus_alpha_of_its_update(ladder_dir, text_file, tmp_path):
    shared = {**TINY, "data": str(text_file)}
    trained, quarter = tmp_path / "trained", tmp_path / "quarter"
    plan_and_run(Recipe("kd", [parse_stage("kd:tokens=128")]), str(ladder_dir), str(trained), shared=shared)
    plan_and_run(Recipe("kd", [parse_stage("kd:tokens=128,interpolate=0.25")]), str(ladder_dir), str(quarter), shared=shared)
    start, end, got = (load_model(p, dtype=torch.float32).state_dict() for p in (ladder_dir, trained, quarter))
    moved = [k for k in start if not torch.equal(start[k], end[k])]
    assert moved  # the stage trained something, so the test can tell the ends apart
    for key in start:
        assert torch.allclose(got[key], start[key] + 0.25 * (end[key] - start[key]), atol=1e-6, rtol=0), key
    assert read_provenance(quarter)["history"][-1]["interpolate"] == 0.25
    assert "interpolate: 0.25" in (quarter / "README.md").read_text()  # the card says the weights are not the trained ones
    assert "interpolate" not in (trained / "README.md").read_text()


@pytest.mark.parametrize("settings, message", [
    (dict(interpolate=0.0), "must be in"),
    (dict(interpolate=1.5), "must be in"),
    (dict(interpolate=0.5, objectives="local", local_schedule="sequential"), "joint stage"),
    (dict(interpolate=0.5, objectives="kd", head_grouping=True), "head grouping"),
])
def test_interpolate_refuses_what_it_cannot_honour(settings, message):
    with pytest.raises(LadderizeError, match=message):
        validate_config(AdaptConfig.from_flat(checkpoint="c", out="o", **settings))
