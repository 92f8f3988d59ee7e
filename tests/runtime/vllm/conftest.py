"""The serving tests drive vLLM in .venv-vllm (built by scripts/setup_vllm.sh, which scripts/test.sh runs first)."""

from __future__ import annotations

import subprocess

import pytest

from .serving_helpers import REPO, VLLM_PYTHON


@pytest.fixture(scope="session")
def vllm_venv() -> None:
    """Build .venv-vllm if it is missing or stale (idempotent; about a second when it is ready). Never skipped."""
    subprocess.run(["bash", str(REPO / "scripts" / "setup_vllm.sh")], check=True)
    assert VLLM_PYTHON.is_file()
