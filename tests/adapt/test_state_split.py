"""The sequential stage under N processes: each holds the states of its own sequences only, and the teacher's
states kept for a later stage are those of the sequences it reads, each process writing its own."""

from __future__ import annotations

import math

import torch
from safetensors import safe_open

from ladderize.adapt.layers.layer_source import ResidentLayers
from ladderize.adapt.sequential.layer_training import StateCache
from ladderize.checkpoint.placement import LaunchRank
from ladderize.adapt.recipe_run import TEACHER_STATES_DIR
from ladderize.adapt.plan.stages import load_recipe
from ladderize.adapt.plan.sequential_schedule import rows_read
from ladderize.adapt.layers.teacher_states import ENTRY_FILE, FINAL_FILE, part_name
from ladderize.checkpoint.io import load_model
from tests.adapt.conftest import plan_and_run
from tests.adapt.test_recipe import TINY_SHARED
from tests.adapt.test_sharded import _launch, _common
from tests.adapt.conftest import typed


def test_state_bytes_per_rank_fall_as_one_over_the_processes(ladder_dir, dense_dir):
    """12 sequences (2 held out) through the cache's first states and one layer: at 3 processes each rank's store
    hands out a third of one process's bytes, and its states are one process's rows ``rank::3``."""
    teacher, student = load_model(dense_dir), load_model(ladder_dir)
    data = torch.randint(3, 120, (12, 16), generator=torch.Generator().manual_seed(5))

    def run(launch: LaunchRank) -> StateCache:
        cache = StateCache(ResidentLayers(teacher), data, 2, held_out=2, launch=launch)
        with cache.teacher.layer(2) as layer:
            out = cache.teacher_output(layer)
        cache.advance(student.model.layers[2], out)
        return cache

    one = run(LaunchRank())
    split = [run(LaunchRank(rank, 3)) for rank in range(3)]
    held = [cache.store.allocated_bytes for cache in split]
    print("state bytes per rank: 1 process", one.store.allocated_bytes, "3 processes", held)
    assert sum(held) == one.store.allocated_bytes
    assert max(held) <= math.ceil(12 / 3) / 12 * one.store.allocated_bytes
    for rank, cache in enumerate(split):
        assert cache.rows.tolist() == list(range(rank, 12, 3))
        for mine, whole in zip((*cache.teacher_state, *cache.student_state), (*one.teacher_state, *one.student_state)):
            torch.testing.assert_close(mine, whole[rank::3], rtol=1e-5, atol=1e-6)  # other chunks: fp32 rounding


def _recipe(kd: dict):
    return load_recipe("best").with_stage(0, tokens=128, epochs=1.0).with_stage(1, **kd)  # 4 sequences, 2 held out: 6 rows


def _rows(directory, name: str, parts: int = 1) -> list[int]:
    counts = []
    for part in range(parts):
        with safe_open(directory / part_name(name, part, parts), "pt") as handle:
            counts.append(handle.get_tensor("input_ids").shape[0])
    return counts


def test_the_sequential_stage_writes_the_teacher_states_of_the_sequences_kd_reads(ladder_dir, text_file, tmp_path):
    common = dict(shared={**TINY_SHARED, "data": str(text_file)}, keep_state=True)
    said: list[str] = []
    plan_and_run(_recipe({"tokens": 64}), str(ladder_dir), str(tmp_path / "reads"), on_message=said.append, **common)
    states = tmp_path / "reads.adapt-run" / TEACHER_STATES_DIR
    assert _rows(states, ENTRY_FILE) == _rows(states, FINAL_FILE) == [2]  # kd's 64 tokens: 2 of the 6 rows
    assert any("teacher's states of 2 sequences come from the sequential stage" in line for line in said), said
    plan_and_run(_recipe({"tokens": 64, "objectives": "kd,local"}), str(ladder_dir), str(tmp_path / "none"), **common)
    assert not (tmp_path / "none.adapt-run" / TEACHER_STATES_DIR).exists()  # kd runs the teacher at every layer
    steps = [{"local_schedule": "sequential", "tokens": 128, "seq_len": 32}, {"objectives": "kd", "tokens": 200, "seq_len": 32,
                                                                               "batch_size": 1}]
    assert rows_read(typed(steps), 0) == 7 and rows_read(typed(steps), 1) == 0  # kd's 7 steps of 1 sequence, on any process count


def test_each_process_writes_the_teacher_states_of_its_own_sequences(ladder_dir, text_file, tmp_path):
    """2 processes, kd reading 4 sequences at a batch of 2 (1 per process): each writes its 2, which kd reads."""
    done = _launch(2, ["adapt", str(ladder_dir), str(tmp_path / "two"), *_common(text_file), "--keep-state", "--stage",
                       "seq-local:tokens=128,epochs=1,batch_size=2", "--stage", "kd:tokens=128,batch_size=2"], tmp_path)
    states = tmp_path / "two.adapt-run" / TEACHER_STATES_DIR
    assert sorted(file.name for file in states.iterdir()) == sorted(part_name(name, part, 2) for name in (ENTRY_FILE, FINAL_FILE)
                                                                   for part in range(2))
    assert _rows(states, ENTRY_FILE, 2) == _rows(states, FINAL_FILE, 2) == [2, 2]
    assert "teacher's states of 4 sequences come from the sequential stage" in done.stdout + done.stderr
