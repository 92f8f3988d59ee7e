"""Issue 26 item 12: convert and adapt shard the same model by one rule, and --max-shard-bytes must be positive."""

from __future__ import annotations

import pytest

from tests.cli_helpers import error_lines, run_cli


def test_convert_and_adapt_shard_by_one_rule(dense_dir, ladder_dir, text_file, tmp_path, capsys, monkeypatch):
    from ladderize.checkpoint import tensor_files

    limits: list[tuple[str, int]] = []
    init = tensor_files.ShardWriter.__init__

    def recording(self, out_dir, max_shard_bytes=2_000_000_000):
        limits.append((stage, max_shard_bytes))
        init(self, out_dir, max_shard_bytes)

    monkeypatch.setattr(tensor_files.ShardWriter, "__init__", recording)
    stage = "convert"
    code, _, stderr = run_cli(["convert", dense_dir, tmp_path / "c", "--ladder", "2:4"], capsys, monkeypatch)
    assert code == 0, stderr
    for stage, schedule in (("adapt-sequential", "sequential"), ("adapt-joint", "joint")):
        code, _, stderr = run_cli(["adapt", ladder_dir, tmp_path / stage, "--data", text_file, "--tokens", 128, "--seq-len", 32,
                                   "--batch-size", 2, "--objective", "local", "--local-schedule", schedule], capsys, monkeypatch)
        assert code == 0, stderr
    assert [name for name, _ in limits] == ["convert", "adapt-sequential", "adapt-joint"]
    assert len({limit for _, limit in limits}) == 1, limits  # adapt's streamed writer used 500 MB against convert's 1 GB


@pytest.mark.parametrize("value", ["0", "-5"])
def test_max_shard_bytes_must_be_positive(value, dense_dir, tmp_path, capsys, monkeypatch):
    out = tmp_path / "c"
    code, _, stderr = run_cli(["convert", dense_dir, out, "--ladder", "2:4", "--max-shard-bytes", value], capsys, monkeypatch)
    lines = error_lines(stderr)
    assert code == 2 and len(lines) == 1 and "--max-shard-bytes must be at least 1" in lines[0], stderr
    assert not out.exists()
