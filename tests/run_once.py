"""A fixture's result computed once per test run, however many xdist workers ask for it.

Module- and session-scoped fixtures are per worker under xdist: with two workers, a fixture that launches TP ranks
or builds a venv runs twice. ``once_per_run`` runs it in the first worker that asks, under a lock in the run's
shared temp folder (the parent of the workers' own), and leaves the pickled result there for the others, which wait
on the lock instead of repeating the work (waiting costs no CPU). The pickles are this run's own test data."""

from __future__ import annotations

import fcntl
import os
import pickle
from pathlib import Path
from typing import Callable, TypeVar

import pytest

T = TypeVar("T")


def shared_temp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The temp folder every worker of this run shares (the base temp itself without xdist)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def once_per_run(tmp_path_factory: pytest.TempPathFactory, name: str, compute: Callable[[], T]) -> T:
    """``compute()``'s result, computed by the first worker of the run that asks for ``name``, read back by the rest."""
    folder = shared_temp(tmp_path_factory)
    result = folder / f"{name}.once.pickle"
    with open(folder / f"{name}.once.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not result.exists():
            value = compute()
            partial = result.with_suffix(".partial")
            partial.write_bytes(pickle.dumps(value))
            partial.rename(result)
            return value
    return pickle.loads(result.read_bytes())
