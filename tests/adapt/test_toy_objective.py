"""An objective added at test time as one file (``toy_objective.py``: one ``Objective`` entry and a stage preset),
touching no product file: the entry's traits drive the rest.

The toy ``cos`` (cosine distance of the final residual streams) reads the teacher's final stream and the student's,
and neither LM head. So it must parse, need a teacher, lower its own loss, take the teacher states a sequential stage
stores, be priced as the teacher's and the student's every layer without a head, and train under the default recipe's
shape (``seq-local`` then its own stage) on one process and on 2 FSDP2 processes alike. docs/architecture.md
("Adding an objective") lists what a new objective touches; this test is the check that nothing else needs to.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from ladderize.adapt.plan.config import AdaptConfig, needs_teacher
from ladderize.adapt.plan.cost import FlopCount, JointMemory, head_parameters, layer_parameters
from ladderize.adapt.train.replicated import select_trainable
from ladderize.adapt.train.lora import LoraSpec
from ladderize.adapt.objectives.losses import AdaptLoss
from ladderize.adapt.objectives.registry import TEACHER_LAYERS, Objective, parse_objectives, register
from ladderize.adapt.plan.stages import Recipe, Stage, parse_stage, resolve_stages
from ladderize.adapt.plan.sequential_schedule import reads_stored_teacher
from ladderize.adapt.plan.sequential_schedule import keeps_teacher_states
from ladderize.checkpoint.shapes import ModelShape
from ladderize.errors import LadderizeError
from tests.adapt.conftest import convert
from tests.adapt.test_multiprocess import launch_failure, sharp_dense
from tests.adapt.test_sharded import _common, _env, _losses, _torchrun, _updates_agree
from tests.adapt.test_teacher_states import _teacher_run
from tests.adapt.toy_objective import register_toy
from tests.conftest import TINY, tiny_model
from tests.adapt.conftest import typed

TOY_FILE = Path(__file__).with_name("toy_objective.py")
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch):
    return register_toy(monkeypatch)


def test_it_parses_and_needs_a_teacher(toy):
    assert parse_objectives("kd,cos=0.5") == {"kd": 1.0, "cos": 0.5}
    assert needs_teacher(AdaptConfig.from_flat(checkpoint="ckpt", out="out", objectives="cos"), parse_objectives("cos"))
    student = tiny_model(seed=0, layer_modes=["dense", "dense", "ladder", "ladder"])
    with pytest.raises(LadderizeError, match="objective cos needs a teacher model"):
        AdaptLoss(student, None, {"cos": 1.0})


def test_an_entry_says_what_it_needs(toy):
    with pytest.raises(LadderizeError, match="give block_loss"):
        Objective("logits", head=True, loss=toy.loss)
    with pytest.raises(LadderizeError, match="teacher's head reads its final stream"):
        Objective("layers_head", teacher=TEACHER_LAYERS, teacher_head=True, loss=toy.loss)
    with pytest.raises(LadderizeError, match="registered already"):
        register(Objective("cos", loss=toy.loss))
    assert register(toy) is toy  # the same entry again: nothing to do


def test_it_is_unknown_without_its_file():
    with pytest.raises(LadderizeError, match="unknown objective 'cos'"):
        parse_objectives("cos")


def test_it_lowers_its_loss_and_reads_stored_teacher_states(toy):
    torch.manual_seed(0)
    teacher = tiny_model(seed=0)
    student = tiny_model(seed=0, layer_modes=["dense", "dense", "ladder", "ladder"])
    student.load_state_dict(teacher.state_dict())
    module = AdaptLoss(student, teacher, {"cos": 1.0}, share_prefix=True)
    ids = torch.randint(3, 128, (4, 32), generator=torch.Generator().manual_seed(1))
    passed = module._teacher_states(ids, want_final=True)
    assert sorted(passed.inputs) == [2] and not passed.outputs and passed.final is not None  # no layer's states kept
    (residual, stale), final = _teacher_run(teacher, ids, module.first)
    ran, stored = module(ids), module(ids, (residual, stale, final))
    assert set(ran) == {"cos", "total"} and torch.equal(ran["cos"], stored["cos"])
    optimizer = torch.optim.Adam(select_trainable(student, "converted", LoraSpec()), lr=3e-4)
    first = ran["total"].item()
    for _ in range(15):
        loss = module(ids)["total"]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert module(ids)["total"].item() < 0.7 * first


def test_it_is_priced_from_its_traits(toy):
    """The teacher's layers all run (it reads the final stream) and the student's from the first converted one, the
    gradient through the layers above the converted ones; no head runs in either model."""
    shape = ModelShape("tiny", **{k: v for k, v in TINY.items() if k in ModelShape.__dataclass_fields__})
    layers, layer = shape.num_hidden_layers, layer_parameters(shape)
    count = FlopCount.for_stage(shape, [1, 2], {"cos": 1.0})
    assert count == FlopCount(trained=2 * layer, backward_through=(layers - 3) * layer, forward_only=layers * layer)
    assert FlopCount.for_stage(shape, [1, 2], {"cos": 1.0, "kd": 1.0}).forward_only == layers * layer + head_parameters(shape)
    step = {"objectives": "cos", "tokens": 1024}
    assert JointMemory.for_step(shape, [1, 2], typed(step), 1).teacher > 0


def test_its_stage_reads_the_teacher_states_the_sequential_stage_keeps(toy, ladder_dir):
    steps = resolve_stages(Recipe("toy", [Stage("seq-local"), parse_stage("cos:tokens=4096")]), str(ladder_dir))
    assert steps[1].resolved.objective.objectives == "cos" and steps[1].resolved.training.batch_size == 2  # its preset
    assert keeps_teacher_states(typed(steps), 0) and reads_stored_teacher(typed(steps), 1)
    with_local = resolve_stages(Recipe("toy", [Stage("seq-local"), parse_stage("cos:objective=cos+local*0.1")]),
                                str(ladder_dir))
    assert not keeps_teacher_states(typed(with_local), 0)  # local needs the teacher's states at every converted layer


@pytest.fixture(scope="module")
def sharp_ladder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("toy")
    return convert(sharp_dense(root / "dense"), root / "ladder", ladder="1:4")


def _run(command: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**_env(tmp_path), "PYTHONPATH": str(REPO)}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, launch_failure(done.stderr)
    return done


def test_it_trains_under_the_default_recipe_on_one_and_two_fsdp_processes(sharp_ladder, text_file, tmp_path):
    """``seq-local`` then ``cos`` (the default recipe with the toy in kd's place) as ``python toy_objective.py adapt``
    and under ``torchrun --nproc_per_node 2`` (FSDP2): it reads the teacher states the sequential stage kept, trains
    the converted layers, and the two runs agree as the sharded tests' do (losses within 1e-5, updates within 1e-3).
    Its windows are the calibration set's (192 tokens each): a sharded stage reads stored states only then.
    Its loss falls on one batch in ``test_it_lowers_its_loss_and_reads_stored_teacher_states``; here each step's batch
    is another."""
    stages = ["--stage", "seq-local:tokens=192,epochs=1,batch_size=2", "--stage", "cos:tokens=192,batch_size=2,lr=1e-2"]
    args = ["adapt", str(sharp_ladder), None, *_common(text_file), *stages]
    one = _run([sys.executable, str(TOY_FILE), *[str(tmp_path / "one") if a is None else a for a in args]],
               tmp_path)
    two = _run([*_torchrun(2), str(TOY_FILE), *[str(tmp_path / "two") if a is None else a for a in args]], tmp_path)
    assert "sharded over 2 processes with FSDP2" in two.stderr, two.stderr[-3000:]
    for done in (one, two):
        assert "come from the sequential stage" in done.stderr, done.stderr[-3000:]
    losses = _losses(tmp_path / "one", "loss_cos")
    assert len(losses) == 3 and all(0 < loss < 2 for loss in losses), losses  # 3 steps of 2 x 32 tokens
    for a, b in zip(losses, _losses(tmp_path / "two", "loss_cos"), strict=True):
        assert a == pytest.approx(b, rel=1e-5)
    _updates_agree(tmp_path / "one", tmp_path / "two", sharp_ladder, 1e-3)
    trained, start = load_file(tmp_path / "one" / "model.safetensors"), load_file(sharp_ladder / "model.safetensors")
    changed = {name.split(".")[2] for name in trained if not torch.equal(trained[name], start[name])}
    assert changed == {"1", "2", "3"}  # the converted layers, and only they
