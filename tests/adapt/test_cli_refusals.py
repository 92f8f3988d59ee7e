"""Issue 26 items 4 and 5: a refused ``adapt`` leaves nothing behind, and ``--mixed-precision`` is checked and honoured.

A refusal (dense checkpoint, missing --data, a bad --mixed-precision) comes before the run dir exists,
so the corrected command runs without --resume or --force.
"""

from __future__ import annotations

import json

import pytest
import torch
from ladderize.adapt.plan.config import GivenSettings

from tests.adapt.conftest import convert
from tests.cli_helpers import error_lines, run_cli

SMALL = ["--seq-len", 32, "--batch-size", 2]


def _one_error(stderr: str) -> str:
    lines = [line for line in error_lines(stderr) if not line.endswith(": started")]
    assert len(lines) == 1 and lines[0].startswith("error:"), stderr
    return lines[0]


def _nothing_beside(tmp_path, name: str) -> None:
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(name)) == []


@pytest.mark.parametrize("recipe", [[], ["--recipe", "seq-local"], ["--stage", "seq-local:tokens=128", "--stage", "kd:tokens=128"]])
def test_refused_adapt_leaves_no_run_dir_and_the_fixed_command_runs(recipe, dense_dir, ladder_dir, text_file, tmp_path,
                                                                     capsys, monkeypatch):
    plain = convert(dense_dir, tmp_path / "plain")  # converted format, every layer dense: nothing to adapt
    out = tmp_path / "o"
    code, _, stderr = run_cli(["adapt", plain, out, "--data", text_file, *SMALL, *recipe], capsys, monkeypatch)
    assert code == 2 and "has no converted layers" in _one_error(stderr)
    _nothing_beside(tmp_path, "o")

    code, _, stderr = run_cli(["adapt", ladder_dir, out, "--data", tmp_path / "typo.txt", *SMALL, *recipe], capsys, monkeypatch)
    assert code == 2 and "does not exist" in _one_error(stderr)
    _nothing_beside(tmp_path, "o")

    if "--stage" in recipe:  # the corrected command (a small recipe): no --resume, no --force needed
        code, _, stderr = run_cli(["adapt", ladder_dir, out, "--data", text_file, *SMALL, *recipe], capsys, monkeypatch)
        assert code == 0, stderr
        assert (out / "adapt_curve.json").is_file()


def test_a_later_stages_bad_setting_is_refused_before_the_first_stage(ladder_dir, text_file, tmp_path, capsys, monkeypatch):
    out = tmp_path / "o"
    code, _, stderr = run_cli(["adapt", ladder_dir, out, "--data", text_file, *SMALL, "--stage", "seq-local:tokens=128",
                               "--stage", f"kd:tokens=128,data={tmp_path / 'missing.jsonl'}"], capsys, monkeypatch)
    assert code == 2 and "does not exist" in _one_error(stderr)
    _nothing_beside(tmp_path, "o")


@pytest.mark.parametrize("value", ["fp8", "int8", "bf17"])
def test_mixed_precision_outside_no_bf16_fp16_is_one_line(value, ladder_dir, text_file, tmp_path, capsys, monkeypatch):
    for extra in (["--objective", "kd", "--tokens", 128], []):  # a single joint stage, the default recipe
        code, _, stderr = run_cli(["adapt", ladder_dir, tmp_path / "o", "--data", text_file, *SMALL, *extra,
                                   "--mixed-precision", value], capsys, monkeypatch)
        line = _one_error(stderr)
        assert code == 2 and f"unknown --mixed-precision '{value}'" in line and "no, bf16, fp16" in line
        _nothing_beside(tmp_path, "o")


def test_sequential_stage_refuses_fp16_and_fp16_needs_cuda(ladder_dir, text_file, tmp_path, capsys, monkeypatch):
    code, _, stderr = run_cli(["adapt", ladder_dir, tmp_path / "o", "--data", text_file, *SMALL, "--recipe", "seq-local",
                               "--mixed-precision", "fp16"], capsys, monkeypatch)
    assert code == 2 and "no fp16 loss scaling" in _one_error(stderr)
    if not torch.cuda.is_available():
        for fp16 in (["--mixed-precision", "fp16"], ["--dtype", "float16"]):
            code, _, stderr = run_cli(["adapt", ladder_dir, tmp_path / "o", "--data", text_file, *SMALL, "--objective",
                                       "kd", "--tokens", 128, *fp16], capsys, monkeypatch)
            assert code == 2 and f"{' '.join(fp16)} needs a CUDA GPU" in _one_error(stderr)
    _nothing_beside(tmp_path, "o")


def test_sequential_stage_honours_bf16(ladder_dir, text_file, tmp_path, capsys, monkeypatch):
    """The same seq-local run in fp32 and under --mixed-precision bf16: the bf16 losses differ (they were identical)."""
    losses = {}
    for value in ("no", "bf16"):
        out = tmp_path / value
        fp32 = ["--dtype", "float32"] if value == "no" else []  # auto is bf16 autocast on a CPU with native bf16
        code, _, stderr = run_cli(["adapt", ladder_dir, out, "--data", text_file, *SMALL, "--tokens", 128,
                                   "--local-schedule", "sequential", "--epochs", 1, "--mixed-precision", value, *fp32],
                                  capsys, monkeypatch)
        assert code == 0, stderr
        losses[value] = [row["loss_local"] for row in json.loads((out / "adapt_curve.json").read_text())]
    assert len(losses["no"]) == len(losses["bf16"]) > 0
    assert losses["no"] != losses["bf16"]
    assert losses["bf16"] == pytest.approx(losses["no"], rel=0.1)  # the same training, in lower precision


@pytest.mark.parametrize("recipe", [["--stage", "seq-local:tokens=128"], ["--local-schedule", "sequential", "--tokens", 128]])
def test_dtype_float16_is_refused_before_the_plan_and_the_fixed_command_runs(recipe, ladder_dir, text_file, tmp_path,
                                                                            capsys, monkeypatch):
    """Issue 37 item 7: ``--dtype float16`` was refused after recipe.json was written, blocking the bfloat16 rerun."""
    out = tmp_path / "o"
    code, stdout, stderr = run_cli(["adapt", ladder_dir, out, "--data", text_file, *SMALL, *recipe, "--dtype", "float16"],
                                   capsys, monkeypatch)
    assert code == 2 and "float32 or bfloat16" in _one_error(stderr)
    assert "plan" not in stdout  # refused before the plan is printed
    _nothing_beside(tmp_path, "o")
    code, _, stderr = run_cli(["adapt", ladder_dir, out, "--data", text_file, *SMALL, *recipe, "--dtype", "bfloat16"],
                              capsys, monkeypatch)
    assert code == 0, stderr


def test_a_refusal_inside_a_stage_removes_the_fresh_run_dir(ladder_dir, text_file, tmp_path, capsys, monkeypatch):
    """A check that only a stage can make (here: a failing model load) leaves no run dir when nothing was saved."""
    from ladderize.errors import LadderizeError

    def refuse(*_args, **_kwargs):
        raise LadderizeError("refused inside the stage")

    monkeypatch.setattr("ladderize.adapt.recipe_run.adapt", refuse)
    code, _, stderr = run_cli(["adapt", ladder_dir, tmp_path / "o", "--data", text_file, *SMALL,
                               "--stage", "seq-local:tokens=128"], capsys, monkeypatch)
    assert code == 2 and "refused inside the stage" in _one_error(stderr)
    _nothing_beside(tmp_path, "o")


def test_a_sequence_past_the_models_positions_is_cut_where_defaulted_and_refused_where_set(tmp_path):
    """The plan (a run's and the dry run's): a default 512 on a model of 64 positions becomes 64, said in a line; a
    length the user set (shared, or a stage's own) is one line naming the limit."""
    from ladderize.adapt.plan.adapt_plan import build_plan
    from ladderize.errors import LadderizeError
    from tests.runtime.runtime_helpers import TINY_TP23, save_tiny

    short = tmp_path / "short"
    save_tiny(short, **dict(TINY_TP23, layer_modes=["dense", "dense", "ladder", "ladder"], max_position_embeddings=64))
    plan = build_plan(short, launch="8xH100", priced_only=True)
    assert [stage.resolved.training.seq_len for stage in plan.stages] == [64, 64]
    assert [f"  stage {n} ({name}): sequences of 64 tokens, the positions the model encodes (max_position_embeddings), "
            "not the default 512" for n, name in ((1, "seq-local"), (2, "kd"))] == plan.lines()[3:5], plan.lines()
    for given in (dict(shared=GivenSettings.of({"seq_len": 65})), dict(stages=["seq-local", "kd:seq_len=100"]),
                  dict(single=GivenSettings.of({"objectives": "kd"}), shared=GivenSettings.of({"seq_len": 65}))):
        with pytest.raises(LadderizeError, match=r"is more than the 64 positions .*give --seq-len 64 or less"):
            build_plan(short, launch="8xH100", priced_only=True, **given)
    assert build_plan(short, launch="8xH100", priced_only=True, shared=GivenSettings.of({"seq_len": 64})).stages[0].resolved.training.seq_len == 64


def test_a_dry_run_says_how_a_bare_budget_number_is_read(ladder_dir, tmp_path, capsys, monkeypatch):
    """``--budget 100`` is 100 token passes, which whole steps make 3 x 1,024 or so: the plan's line says both."""
    code, stdout, stderr = run_cli(["adapt", ladder_dir, tmp_path / "o", "--dry-run", "8xH100", "--budget", 100], capsys,
                                   monkeypatch)
    assert code == 0, stderr
    line = next(line for line in stdout.splitlines() if "token passes" in line)
    assert "budget 100 tokens (--budget 100: a bare number counts token passes; 30m is wall time)" in line, line
    assert "more than 100: each stage trains whole steps, at least one" in line, line
    code, stdout, _ = run_cli(["adapt", ladder_dir, tmp_path / "o", "--dry-run", "8xH100", "--budget", "100M"], capsys,
                              monkeypatch)
    line = next(line for line in stdout.splitlines() if "token passes" in line)
    assert code == 0 and line.strip().startswith("budget 100,000,000 tokens: ") and "bare" not in line, line
    assert not (tmp_path / "o").exists() and not (tmp_path / "o.adapt-run").exists()


def test_a_resume_is_refused_before_the_plan_with_nothing_to_resume_or_another_budget(ladder_dir, text_file, tmp_path):
    """From Python too: ``resume`` with no run in the folder is one line; a recipe's run planned without a budget is
    not resumed with one (refused before the budget times anything)."""
    import json

    from ladderize.adapt.entrance import AdaptRequest, adapt_checkpoint, plan_adapt
    from ladderize.errors import LadderizeError

    request = AdaptRequest.of(str(ladder_dir), str(tmp_path / "o"), data=str(text_file), seq_len=32, batch_size=2, resume=True)
    with pytest.raises(LadderizeError, match="nothing to resume: .*o.adapt-run holds no interrupted run"):
        adapt_checkpoint(request)
    assert not (tmp_path / "o.adapt-run").exists()
    (tmp_path / "o.adapt-run").mkdir()
    (tmp_path / "o.adapt-run" / "recipe.json").write_text(json.dumps({"checkpoint": str(ladder_dir), "plan": []}))
    with pytest.raises(LadderizeError, match="the run was planned without --budget"):
        plan_adapt(request.with_settings(budget="100K"))
    (tmp_path / "o.adapt-run" / "recipe.json").write_text(json.dumps({"checkpoint": str(ladder_dir), "plan": [],
                                                                       "budget": {"text": "2m"}}))
    with pytest.raises(LadderizeError, match="the run was planned with --budget 2m"):
        plan_adapt(request.with_settings(budget="3m"))


def test_a_single_stage_resumed_with_other_settings_is_refused_before_its_plan(ladder_dir, text_file, tmp_path, capsys,
                                                                               monkeypatch):
    common = ["adapt", ladder_dir, tmp_path / "o", "--data", text_file, *SMALL, "--objective", "kd", "--tokens", 256]
    code, _, stderr = run_cli([*common, "--max-steps", 1], capsys, monkeypatch)
    assert code == 0, stderr
    state = tmp_path / "o.adapt-run" / "state" / "trainer_state.json"
    saved = state.read_bytes()
    code, stdout, stderr = run_cli([*common, "--lr", "1e-2", "--resume"], capsys, monkeypatch)
    assert code == 2 and "the run was started with different lr" in _one_error(stderr) and "plan (" not in stdout
    assert state.read_bytes() == saved and not (tmp_path / "o").exists()
