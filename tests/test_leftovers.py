"""The suite cleans up what it starts (issue 37 item 14): vLLM's shared-memory segments, temp folders of passing tests."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="needs /dev/shm")
def test_new_cpushm_segments_are_removed_and_others_kept() -> None:
    from tests.runtime.vllm.serving_helpers import removing_new_shm

    tag = uuid.uuid4().hex[:8]
    kept, other = Path(f"/dev/shm/ladderize-test-{tag}-cpushm-old"), Path(f"/dev/shm/ladderize-test-{tag}-other")
    kept.write_bytes(b"x")
    try:
        with removing_new_shm():
            new = Path(f"/dev/shm/vllm_dist_{tag}-[0-1]-cpushm")
            new.write_bytes(b"x")
            other.write_bytes(b"x")
        assert not new.exists() and kept.exists() and other.exists()
    finally:
        for path in (kept, other):
            path.unlink(missing_ok=True)


def test_temp_folders_of_passing_tests_are_not_kept(request: pytest.FixtureRequest) -> None:
    assert request.config.getini("tmp_path_retention_policy") == "failed"
    assert int(request.config.getini("tmp_path_retention_count")) <= 1
