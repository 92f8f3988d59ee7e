"""Atomic output directories: write into a temp dir beside the target, then rename.

Temp dirs are named ``.OUT.tmp-<pid>-<random>`` (and ``.OUT.old-<pid>-<random>`` while an
existing OUT is being replaced). The ``finally`` of ``atomic_directory`` removes them on any
exception, ``Interrupted`` (SIGINT/SIGTERM, see ``ladderize.errors``) included; a process killed
outright (SIGKILL, power loss) leaves them behind, and the next write of the same OUT removes
those whose pid no longer runs (``sweep_stale``).
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from ..errors import LadderizeError

TEMP_KINDS = ("tmp", "old")


def check_apart(out: Path | str | None, inputs: Iterable[Path | str | None], what: str = "OUT") -> None:
    """Raise one line if writing or replacing ``out`` could remove or overwrite one of ``inputs``.

    Compared by path identity (absolute, symlinks followed): ``out`` may not be an input, hold one (an ancestor,
    which ``--force`` would delete) or lie inside one's folder. Inputs that are not local paths (a hub id, a
    corpus name) are skipped.
    """
    if out is None:
        return
    target = Path(out).expanduser().resolve()
    for given in inputs:
        if given is None or not Path(given).expanduser().exists():
            continue
        source = Path(given).expanduser().resolve()
        if target == source:
            raise LadderizeError(f"{what} {out} is the input {given}: give {what} a folder of its own")
        if target in source.parents:
            raise LadderizeError(f"{what} {out} holds the input {given} (replacing it would delete the input): "
                                 f"give {what} a folder outside it")
        if source in target.parents:
            raise LadderizeError(f"{what} {out} is inside the input {given}: give {what} a folder outside it")


def check_output_free(out: Path, force: bool, inputs: Iterable[Path | str | None] = ()) -> None:
    """Raise unless ``out`` may be written: apart from every input (``check_apart``), and absent or ``force`` given."""
    check_apart(out, inputs)
    if out.exists() and not force:
        raise LadderizeError(f"output {out} already exists; pass --force to replace it")
    if out.exists() and not out.is_dir():
        raise LadderizeError(f"output {out} exists and is not a directory")


def check_writable(path: Path | str, what: str = "output") -> Path:
    """Raise one line unless ``path`` (a file or a directory, written atomically beside itself) can be created.

    Probes the nearest existing ancestor of its parent with a real temp file (so a read-only mount, a
    full quota or a parent that is a file are caught too, also for root) before any work starts.
    Returns the absolute path.
    """
    target = Path(path).expanduser().absolute()
    if target.is_dir() and what.endswith("file"):
        raise LadderizeError(f"cannot write {what} {target}: it is a directory")
    anchor = target.parent
    while not anchor.exists() and anchor != anchor.parent:
        anchor = anchor.parent
    if not anchor.is_dir():
        raise LadderizeError(f"cannot write {what} {target}: {anchor} is not a directory")
    try:
        fd, probe = tempfile.mkstemp(dir=anchor, prefix=".ladderize-write-check-")
    except OSError as exc:
        raise LadderizeError(f"cannot write {what} {target}: {exc.strerror or exc} in {anchor}") from None
    os.close(fd)
    os.unlink(probe)
    return target


def check_file_target(path: Path | str | None, what: str = "output file") -> Path | None:
    """``check_writable`` for a file a command writes when it ends (``--json FILE``): its folder must exist, so that
    a mistyped folder is one line before the work, not a folder created after it. Returns the absolute path
    (``None`` for no file)."""
    if path is None:
        return None
    target = Path(path).expanduser().absolute()
    if not target.parent.exists():
        raise LadderizeError(f"cannot write {what} {target}: folder {target.parent} does not exist")
    return check_writable(target, what)


def current_umask() -> int:
    """The process umask (read without changing it where /proc allows)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


def apply_umask(path: Path | str, umask: int | None = None) -> None:
    """Give ``path`` (a file, or a directory and everything under it) the modes a new file gets.

    Files become ``0o666 & ~umask`` (``0o777 & ~umask`` if executable), directories ``0o777 & ~umask``:
    safetensors (and ``tempfile``) create files readable by their owner only (0600), unlike every
    other file of a checkpoint.
    """
    umask = current_umask() if umask is None else umask
    path = Path(path)
    entries = [path] + (sorted(path.rglob("*")) if path.is_dir() else [])
    for entry in entries:
        if entry.is_symlink():
            continue
        if entry.is_dir():
            os.chmod(entry, 0o777 & ~umask)
        elif entry.is_file():
            executable = os.stat(entry).st_mode & 0o111
            os.chmod(entry, (0o777 if executable else 0o666) & ~umask)


def _temp_prefix(out: Path, kind: str) -> str:
    return f".{out.name}.{kind}-"


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    except OSError:
        return True  # unknown: keep the folder
    return True


def sweep_stale(out: Path | str) -> list[Path]:
    """Remove ``.OUT.tmp-<pid>-*`` / ``.OUT.old-<pid>-*`` folders beside OUT whose process is gone; return them."""
    out = Path(out).expanduser().absolute()
    removed = []
    for kind in TEMP_KINDS:
        prefix = _temp_prefix(out, kind)
        for entry in out.parent.glob(glob.escape(prefix) + "*"):
            pid_text = entry.name[len(prefix):].split("-", 1)[0]
            if not pid_text.isdigit() or _pid_alive(int(pid_text)):
                continue  # no pid recorded (older ladderize), or its writer still runs
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed


def _make_temp(out: Path, kind: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=f"{_temp_prefix(out, kind)}{os.getpid()}-", dir=out.parent))


@contextlib.contextmanager
def atomic_directory(out: Path | str, force: bool = False) -> Iterator[Path]:
    """Yield a temp dir that becomes ``out`` only if the block finishes without an exception.

    Nothing is left behind on failure or interruption; an existing ``out`` is replaced only
    with ``force`` and only after the new content is complete. Stale temp dirs of dead
    earlier writers of ``out`` are removed first. The result's files get the modes the
    umask gives new files (safetensors writes 0600).
    """
    out = Path(out).expanduser().absolute()
    check_output_free(out, force)
    out.parent.mkdir(parents=True, exist_ok=True)
    sweep_stale(out)
    umask = current_umask()
    tmp = _make_temp(out, "tmp")
    try:
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes 0700; the result should look like any new directory
        yield tmp
        apply_umask(tmp, umask)
        check_output_free(out, force)  # someone may have created it meanwhile
        replace_directory(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def replace_directory(done: Path | str, out: Path | str) -> Path:
    """Rename the finished directory ``done`` (beside ``out``) to ``out``, replacing an existing ``out``.

    The old ``out`` is moved aside first and removed after; interrupted between the two renames, it is
    put back. For writers that cannot use ``atomic_directory``'s block (several processes filling one
    temp dir of a name they agree on: ``adapt``'s training state).
    """
    done, out = Path(done), Path(out)
    if not out.exists():
        os.replace(done, out)
        return out
    old = _make_temp(out, "old")
    try:
        os.replace(out, old / "replaced")
        os.replace(done, out)
    finally:
        if not out.exists() and (old / "replaced").exists():  # interrupted between the renames
            os.replace(old / "replaced", out)
        shutil.rmtree(old, ignore_errors=True)
    return out


@contextlib.contextmanager
def atomic_file(path: Path | str) -> Iterator[Path]:
    """Yield a temp file's path beside ``path`` that becomes ``path`` only if the block finishes (mode from the umask).

    Readers see the old file or the new one, never a half-written one; concurrent writers each rename
    a whole file; on any exception the temp file is removed. The single-file sibling of ``atomic_directory``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.tmp-{os.getpid()}-")
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        apply_umask(tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_file_atomic(path: Path | str, data: str | bytes) -> Path:
    """Write ``data`` (text as UTF-8) to ``path`` through ``atomic_file``."""
    with atomic_file(path) as tmp:
        tmp.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    return Path(path)


def write_json(path: Path | str, record: Any) -> Path:
    """Write ``record`` as indented JSON (one trailing newline) to ``path`` through ``atomic_file``; returns the path.

    Every JSON record ladderize writes goes through here (``--json FILE``, eval, bench and the demo's records).
    A value JSON has no form for is written as its ``str``; a NaN metric is written as NaN, as lm-eval does.
    """
    return write_file_atomic(Path(path).expanduser(), json.dumps(record, indent=2, default=str) + "\n")


def move_file_atomic(source: Path | str, path: Path | str) -> Path:
    """Move the finished file ``source`` to ``path`` (mode from the umask); readers never see part of it.

    From the same folder it is one rename (``source`` is never lost half-way: a resumable partial file
    stays put if this fails); from elsewhere (another file system) it is copied through ``atomic_file``.
    """
    source, path = Path(source), Path(path)
    if source.parent.absolute() == path.parent.absolute():
        apply_umask(source)
        os.replace(source, path)
        return path
    with atomic_file(path) as tmp:
        shutil.move(str(source), str(tmp))
    return path
