"""A resume costs the remaining work: what the interrupted run made and kept is read, never computed again."""

from __future__ import annotations

from collections import Counter

from ladderize.adapt.layers.layer_source import StreamedLayers
from tests.cli_helpers import run_cli


def _args(ladder_dir, text_file, out, *extra):
    return ["adapt", ladder_dir, out, "--data", text_file, "--seq-len", "32", "--batch-size", "2", "--device", "cpu",
            "--dtype", "float32", "--no-compile", "--stage", "seq-local:tokens=256,epochs=1", "--stage", "kd:tokens=256",
            *extra]


def _stopped_beside_a_whole_run(ladder_dir, text_file, tmp_path, capsys, monkeypatch, max_steps: int) -> None:
    """An uninterrupted run into ``whole``, and the same stopped at ``max_steps`` into ``cut``."""
    for out, extra in (("whole", ()), ("cut", ("--max-steps", str(max_steps)))):
        code, _, err = run_cli(_args(ladder_dir, text_file, tmp_path / out, *extra), capsys, monkeypatch)
        assert code == 0, err


def _counting_reads(monkeypatch) -> Counter:
    """Count the teacher's layers and embedding read by the sequential stage (streamed layer sources), by index."""
    reads: Counter = Counter()
    layer, embedding = StreamedLayers.layer, StreamedLayers.embedding

    def counted_layer(self, index):
        reads[(self.path.name, index)] += 1
        return layer(self, index)

    def counted_embedding(self):
        reads[(self.path.name, "embedding")] += 1
        return embedding(self)

    monkeypatch.setattr(StreamedLayers, "layer", counted_layer)
    monkeypatch.setattr(StreamedLayers, "embedding", counted_embedding)
    return reads


def test_a_resume_in_the_sequential_stage_reads_the_states_it_kept(ladder_dir, dense_dir, text_file, tmp_path, capsys,
                                                                     monkeypatch):
    """Stopped in layer 3 (of ladder 2:4) after layer 2 finished: the resume runs no teacher layer below 3 and not
    the embedding (the states entering layer 3 are read), and OUT equals an uninterrupted run's byte for byte."""
    _stopped_beside_a_whole_run(ladder_dir, text_file, tmp_path, capsys, monkeypatch, 6)
    reads = _counting_reads(monkeypatch)
    code, out, err = run_cli(_args(ladder_dir, text_file, tmp_path / "cut", "--resume"), capsys, monkeypatch)
    assert code == 0, err
    teacher = dense_dir.name
    assert "the states entering layer 3 are read from" in out + err, out + err
    assert not [key for key in reads if key[0] == teacher and key[1] in ("embedding", 0, 1, 2)], reads
    assert reads[(teacher, 3)] >= 1  # the layer left is trained against the teacher's
    assert (tmp_path / "cut" / "model.safetensors").read_bytes() == (tmp_path / "whole" / "model.safetensors").read_bytes()


def test_a_resume_in_the_second_stage_runs_no_teacher_for_stored_states(ladder_dir, text_file, tmp_path, capsys,
                                                                         monkeypatch):
    """Stopped in the kd stage: the resume reuses the finished sequential stage (no layer of it read) and reads the
    teacher's states it stored, and ends byte-identical to an uninterrupted run."""
    _stopped_beside_a_whole_run(ladder_dir, text_file, tmp_path, capsys, monkeypatch, 10)
    reads = _counting_reads(monkeypatch)
    code, out, err = run_cli(_args(ladder_dir, text_file, tmp_path / "cut", "--resume"), capsys, monkeypatch)
    assert code == 0, err
    said = out + err
    assert "stage 1/2 seq-local: finished earlier, reusing" in said
    assert "the teacher's layers do not run for them" in said and "4 of the 8 sequences written were read" in said
    assert not reads, reads
    assert (tmp_path / "cut" / "model.safetensors").read_bytes() == (tmp_path / "whole" / "model.safetensors").read_bytes()
