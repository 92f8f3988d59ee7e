"""Atomic output directories: write into a temp dir beside the target, then rename."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from ..errors import LadderizeError


def check_output_free(out: Path, force: bool) -> None:
    """Raise unless ``out`` may be written: absent, or present and ``force`` given."""
    if out.exists() and not force:
        raise LadderizeError(f"output {out} already exists; pass --force to replace it")
    if out.exists() and not out.is_dir():
        raise LadderizeError(f"output {out} exists and is not a directory")


@contextlib.contextmanager
def atomic_directory(out: Path | str, force: bool = False) -> Iterator[Path]:
    """Yield a temp dir that becomes ``out`` only if the block finishes without an exception.

    Nothing is left behind on failure; an existing ``out`` is replaced only with ``force``
    and only after the new content is complete.
    """
    out = Path(out).expanduser().absolute()
    check_output_free(out, force)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes 0700; the result should look like any new directory
    try:
        yield tmp
        check_output_free(out, force)  # someone may have created it meanwhile
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
            os.replace(out, old / "replaced")
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
