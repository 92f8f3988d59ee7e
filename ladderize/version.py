"""The installed ladderize version, read with ``importlib.metadata`` (ground floor: imports nothing of ladderize).

A source tree that is not installed reads ``0.0.0+unknown``. The package root hands ``__version__`` on;
modules below it import it from here, never from the root.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("ladderize")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
