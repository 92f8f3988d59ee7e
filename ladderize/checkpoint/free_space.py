"""Free space before work, and a full disk as one line after it.

``check_free_space`` compares the bytes a command's plan knows it will write (convert's output, adapt's OUT, its run
state and one save) with the free space of each filesystem they land on, summed per filesystem, and refuses in one
line naming what is needed and what is available before the work starts. ``disk_full_as_one_line`` turns a write that
still meets a full disk (another process filled it) into one line; the atomic writers around it have removed their
temporary files by then, and what an earlier write left (a previous save, a previous OUT) is untouched.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path

from ..errors import LadderizeError
from ..progress import gib

MARGIN_BYTES = 64 << 20  # configs, tokenizer, card, index and the filesystem's own blocks beside the planned bytes
FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


def size_text(count: float) -> str:
    """Bytes on a disk line: GiB (``gib``), MiB below one GiB."""
    return gib(count) if count >= 2**30 else f"{count / 2**20:,.0f} MiB"


def nearest_existing(path: Path | str) -> Path:
    """``path``, or its nearest ancestor that exists (where a folder to be made will land)."""
    anchor = Path(path).expanduser().absolute()
    while not anchor.exists() and anchor != anchor.parent:
        anchor = anchor.parent
    return anchor


def free_bytes(path: Path | str) -> int:
    """The bytes free to this user on the filesystem ``path`` (or the folder it will be made in) lands on."""
    return shutil.disk_usage(nearest_existing(path)).free


def folder_bytes(path: Path | str) -> float:
    """The bytes of the files under ``path`` (0 where it does not exist)."""
    root = Path(path)
    if not root.is_dir():
        return 0.0
    return float(sum(file.stat().st_size for file in root.rglob("*") if file.is_file() and not file.is_symlink()))


def check_free_space(needs: Mapping[str, tuple[Path | str, float]]) -> None:
    """Refuse in one line, before any work, where what the plan writes does not fit: ``needs`` maps what is written
    (``"OUT"``, ``"the run state"``) to (where, bytes); the bytes bound for one filesystem are summed, with
    ``MARGIN_BYTES`` for the small files beside them."""
    by_disk: dict[int, tuple[Path, list[str], list[float]]] = {}
    for what, (where, count) in needs.items():
        anchor = nearest_existing(where)
        _, names, total = by_disk.setdefault(os.stat(anchor).st_dev, (anchor, [], [0.0]))
        names.append(what)
        total[0] += float(count)
    for anchor, names, (total,) in by_disk.values():
        needed = total + MARGIN_BYTES
        available = free_bytes(anchor)
        if needed > available:
            raise LadderizeError(f"not enough free space for {' and '.join(names)}: {size_text(needed)} needed on the "
                                 f"filesystem of {anchor}, {size_text(available)} available; free space there or "
                                 "write to a larger disk")


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` is a write that met a full disk or quota (an ``OSError``, or safetensors' error that carries
    the system's message)."""
    if isinstance(exc, OSError):
        return exc.errno in FULL_ERRNOS
    text = str(exc)
    return any(os.strerror(code) in text for code in FULL_ERRNOS)


@contextlib.contextmanager
def disk_full_as_one_line(what: str, path: Path | str, kept: str = "") -> Iterator[None]:
    """A write of ``what`` at ``path`` that meets a full disk ends in one line (``kept``: what an earlier write left
    and is still there, said after it); any other error passes."""
    try:
        yield
    except Exception as exc:
        if not is_disk_full(exc):
            raise
        raise LadderizeError(f"disk full while writing {what} {path}: {size_text(free_bytes(path))} free there"
                             + (f"; {kept}" if kept else "") + "; free space, then run the same command again"
                             ) from None


__all__ = ["check_free_space", "disk_full_as_one_line", "folder_bytes", "free_bytes", "is_disk_full", "nearest_existing"]
