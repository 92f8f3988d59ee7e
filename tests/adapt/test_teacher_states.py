"""``teacher_states.py``: a sequential stage keeps the teacher's states, and a later kd stage of the recipe reads them
instead of running the teacher, with the same losses and the same model."""

from __future__ import annotations

import pytest
import torch

import ladderize.adapt.recipe_run as recipe_module
from ladderize.adapt.plan.config import AdaptConfig
from ladderize.adapt.objectives.losses import AdaptLoss
from ladderize.adapt.plan.sequential_schedule import reads_stored_teacher
from ladderize.adapt.plan.stage_clock import stage_seconds
from ladderize.adapt.plan.stages import load_recipe, resolve_stages
from ladderize.convert.residual_states import embed, run_layers
from ladderize.adapt.plan.sequential_schedule import keeps_teacher_states
from ladderize.adapt.layers.teacher_states import ENTRY_FILE, FINAL_FILE, read, teacher_id, write
from ladderize.checkpoint.io import load_model
from tests.adapt.conftest import plan_and_run, steps_of
from tests.adapt.test_pace import PACE
from tests.adapt.test_recipe import TINY_SHARED, tiny_best
from tests.adapt.conftest import typed


def _teacher_run(teacher, ids: torch.Tensor, first: int):
    """The teacher's states entering layer ``first`` and entering its final norm, written plainly."""
    with torch.no_grad():
        state, kwargs = embed(teacher, ids)
        entry = run_layers(teacher, state, kwargs, 0, first)
        final = run_layers(teacher, entry, kwargs, first, teacher.config.num_hidden_layers)[0]
    return entry, final


def test_stored_states_give_the_losses_of_the_teacher_run(ladder_dir, dense_dir):
    student, teacher = load_model(ladder_dir), load_model(dense_dir)
    loss = AdaptLoss(student, teacher, {"kd": 1.0, "lm": 0.5}, share_prefix=True)
    ids = torch.randint(0, student.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(1))
    (residual, stale), final = _teacher_run(teacher, ids, loss.first)
    ran, stored = loss(ids), loss(ids, (residual, stale, final))
    assert set(ran) == set(stored) == {"kd", "lm", "total"}
    for name in ran:
        torch.testing.assert_close(stored[name], ran[name], rtol=0, atol=0)  # the same states: the same numbers
    # other states give another loss: the stored ones are really what the student starts from and kd aims at
    assert not torch.equal(loss(ids, (residual, stale, final + 0.1))["kd"], ran["kd"])
    assert not torch.equal(loss(ids, (residual + 0.1, stale, final))["kd"], ran["kd"])


def test_read_uses_only_the_same_sequences_of_the_same_teacher(tmp_path, dense_dir):
    ids = torch.arange(4 * 8).reshape(4, 8)
    states = {name: torch.randn(4, 8, 3) for name in ("residual", "stale", "final")}
    me = teacher_id(str(dense_dir))
    write(tmp_path, ENTRY_FILE, ids, {"residual": states["residual"], "stale": states["stale"]}, me, 2)
    assert read(tmp_path, 4, lambda n: ids[:n], me, 2) == (None, None)  # half written: nothing to read
    write(tmp_path, FINAL_FILE, ids, {"final": states["final"]}, me, 2)

    kept, said = read(tmp_path, 3, lambda n: ids[:n], me, 2)  # the first rows of the stored ones
    assert kept.num_rows == 3 and "come from the sequential stage" in said
    residual, stale, final = kept.rows([2, 0], "cpu")
    assert torch.equal(residual, states["residual"][[2, 0]]) and torch.equal(final, states["final"][[2, 0]])
    more = torch.cat([ids, ids[:1] + 100])
    kept, said = read(tmp_path, 5, lambda n: more[:n], me, 2)  # one sequence more than is stored
    assert "1 of its 5 sequences are not stored" in said
    assert kept.rows([4, 0], "cpu") is None and kept.rows([3, 0], "cpu") is not None  # that batch runs the teacher
    assert read(tmp_path, 4, lambda n: ids[:n] + 1, me, 2)[0] is None  # other text
    assert read(tmp_path, 4, lambda n: ids[:n], me + "-other", 2)[0] is None  # another teacher
    assert read(tmp_path, 4, lambda n: ids[:n], me, 3)[0] is None  # another layout


def test_plan_times_kd_without_the_teacher_when_it_reads_stored_states(ladder_dir):
    steps = steps_of(resolve_stages(load_recipe("best"), str(ladder_dir)))
    seq, kd = steps
    assert keeps_teacher_states(typed(steps), 0) and not keeps_teacher_states(typed(steps), 1)
    held_out = seq.get("batch_size", AdaptConfig().training.batch_size) * seq.get("seq_len", AdaptConfig().training.seq_len)
    assert reads_stored_teacher(typed(steps), 1) == (kd["tokens"] <= seq["tokens"] + held_out)
    sized = [{**seq, "tokens": 100_000}, {**kd, "tokens": 300_000}]
    assert not reads_stored_teacher(typed(sized), 1)  # kd reads windows past the calibration set
    assert reads_stored_teacher(typed(sized), 1, data_tokens=100_000)  # ... unless the data holds no more
    assert not reads_stored_teacher(typed([{**sized[0], "data": "other.txt"}, sized[1]]), 1, data_tokens=100_000)
    default = AdaptConfig().training  # one stage naming the default text and length, the other leaving them to it
    named = [{**sized[0], "data": default.data, "seq_len": default.seq_len}, {**sized[1]}]
    named[1].pop("data", None), named[1].pop("seq_len", None)
    assert reads_stored_teacher(typed(named), 1, data_tokens=100_000)
    assert not reads_stored_teacher(typed([sized[0], {**sized[1], "objectives": "kd,local"}]), 1, data_tokens=100_000)
    # the teacher's 30 layers are what a stored run does not compute
    saved = stage_seconds(PACE, typed(sized[1])) - stage_seconds(PACE, typed(sized[1]), stored_teacher=True)
    assert saved == pytest.approx(300 * 30 * PACE.layer_forward)


def test_recipe_kd_reads_the_sequential_stage_states_and_trains_the_same_model(ladder_dir, text_file, tmp_path, monkeypatch):
    common = dict(shared={**TINY_SHARED, "data": str(text_file)})
    said: list[str] = []
    stored = plan_and_run(tiny_best(), str(ladder_dir), str(tmp_path / "stored"), on_message=said.append, **common)
    assert any("come from the sequential stage" in line for line in said)
    assert not (tmp_path / "stored.adapt-run").exists()  # the states go with the run dir
    monkeypatch.setattr(recipe_module, "keeps_teacher_states", lambda _steps, _index: False)
    said.clear()
    ran = plan_and_run(tiny_best(), str(ladder_dir), str(tmp_path / "ran"), on_message=said.append, **common)
    assert not any("come from the sequential stage" in line for line in said)
    assert [r["loss_local"] for r in stored.stages[0].curve] == [r["loss_local"] for r in ran.stages[0].curve]
    kd_stored = [r["loss_kd"] for r in stored.stages[1].curve]
    kd_ran = [r["loss_kd"] for r in ran.stages[1].curve]
    assert kd_stored == pytest.approx(kd_ran, rel=1e-5, abs=1e-7)  # the teacher's numbers in another batch shape
    a, b = load_model(tmp_path / "stored").state_dict(), load_model(tmp_path / "ran").state_dict()
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-4, atol=1e-6)


def test_a_sequential_stage_stores_the_teacher_s_own_states_of_its_rows(dense_dir, text_file, tmp_path):
    """Ladder on layers 1-2 of 4: the stored final state runs the teacher's layer 3 past the last converted one, and
    the rows are the calibration set and the held-out batch after it."""
    from ladderize.adapt.plan.config import AdaptConfig
    from ladderize.corpus.windows import pack_tokens
    from ladderize.adapt.stage_run import adapt
    from ladderize.checkpoint.io import load_tokenizer
    from ladderize.checkpoint.tensor_files import open_safetensors
    from tests.adapt.conftest import convert

    ladder = convert(dense_dir, tmp_path / "ladder12", ladder="1:3")
    states = tmp_path / "states"
    adapt(AdaptConfig.from_flat(checkpoint=str(ladder), out=str(tmp_path / "out"), data=str(text_file), objectives="local",
                      local_schedule="sequential", tokens=32 * 4, seq_len=32, batch_size=2, epochs=1,
                      teacher_states=str(states), dtype="float32"))  # the fp32 teacher run below (bf16 CPUs too)
    ids = pack_tokens(str(text_file), load_tokenizer(str(ladder), "test"), 32, max_tokens=32 * 6)  # 4 + 2 held out
    with open_safetensors(states / ENTRY_FILE) as entry, open_safetensors(states / FINAL_FILE) as final:
        assert torch.equal(entry.get_tensor("input_ids"), ids) and torch.equal(final.get_tensor("input_ids"), ids)
        assert entry.metadata()["first_converted"] == "1" and entry.metadata()["teacher"] == teacher_id(str(dense_dir))
        stored = (entry.get_tensor("residual"), entry.get_tensor("stale"), final.get_tensor("final"))
    (residual, stale), final_state = _teacher_run(load_model(dense_dir), ids, 1)
    torch.testing.assert_close(stored[0], residual)
    torch.testing.assert_close(stored[1], stale)
    torch.testing.assert_close(stored[2], final_state)


@pytest.mark.parametrize("kd_rows,written", [(4, 4), (16, 0)])
def test_a_two_process_sharded_kd_reads_every_stored_state_or_none_is_written(ladder_dir, text_file, tmp_path, kd_rows,
                                                                              written):
    """A sequential stage of 8 calibration rows, then kd sharded over 2 processes (its teacher gathers across the
    ranks): on 4 rows every state written is read; on 16 (not all stored) none is written."""
    import re

    from tests.adapt.test_sharded import _common, _launch

    out = tmp_path / "out"
    done = _launch(2, ["adapt", str(ladder_dir), str(out), *_common(text_file), "--batch-size", "2", "--keep-state",
                       "--stage", "seq-local:tokens=256,epochs=1", "--stage", f"kd:tokens={32 * kd_rows}"], tmp_path)
    files = list((tmp_path / "out.adapt-run" / "teacher-states").glob("*.safetensors"))
    if written:
        assert f"the teacher's states of {written} sequences are kept" in done.stderr
        assert len(files) == 4  # entry and final, one of each per process
        found = re.search(r"stored teacher states: (\d+) of the (\d+) sequences written were read", done.stderr)
        assert found and found.groups() == (str(written), str(written)), done.stderr[-3000:]
    else:
        assert files == [] and "are kept for a later stage" not in done.stderr
        assert "stored teacher states:" not in done.stderr
