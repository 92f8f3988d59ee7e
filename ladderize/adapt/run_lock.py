"""OUT's lock: one live run (adapt, or convert) writes an OUT and its run folder at a time.

``OUT.adapt-run.lock`` (beside the run folder, ``RUN.lock`` for ``--run-dir RUN``) is taken before the run writes
anything and removed when it ends, finished, refused, failed or interrupted. It holds the holder's process id, host
and start time, and the run holds an exclusive ``flock`` on it while it lives: the kernel drops that lock when the
process ends, however it ends, so a file left by a killed run is stale by construction and the next run takes it
over (and says so). A second run into the same OUT is refused in one line naming the holder. On a file system
without ``flock`` the recorded process id decides: a live process of this host holds the folder.

Under a launcher (torchrun, ``accelerate launch``) the ranks of one run share the lock: the main process takes it
and tells every rank its verdict (one broadcast when the run starts), so a refused launch is refused on every rank.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from ..errors import LadderizeError

LOCK_SUFFIX = ".lock"


def lock_path(run_dir: Path) -> Path:
    """The lock file of ``run_dir``: beside it, named after it."""
    run_dir = Path(run_dir)
    return run_dir.parent / f"{run_dir.name}{LOCK_SUFFIX}"


def describe_holder(record: dict) -> str:
    """``process PID on HOST since HH:MM:SS`` from a lock's record (what is known of it)."""
    started = record.get("started")
    since = f" since {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(started))}" if isinstance(started, (int, float)) else ""
    return f"process {record.get('pid', '?')} on {record.get('host', '?')}{since}"


def _record() -> dict:
    record = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}
    launch = {key: os.environ[key] for key in ("TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT") if key in os.environ}
    if launch:
        record["launch"] = launch  # the ranks of this launch share the lock
    return record


def _read(fd: int) -> dict:
    """The record in the open lock file (empty where there is none or it does not parse)."""
    os.lseek(fd, 0, os.SEEK_SET)
    raw = b""
    while chunk := os.read(fd, 65536):
        raw += chunk
    try:
        record = json.loads(raw.decode("utf-8", "replace") or "{}")
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}


def _alive_here(record: dict) -> bool:
    """Whether ``record`` names a live process of this host other than this one (the check without ``flock``)."""
    pid = record.get("pid")
    if record.get("host") != socket.gethostname() or not isinstance(pid, int) or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _take(path: Path) -> tuple[int | None, dict]:
    """Take the lock at ``path``: ``(fd, record left there)`` (a stale holder's, or empty), or ``(None, holder)``."""
    import fcntl

    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read(fd)
            os.close(fd)
            return None, holder
        except OSError as exc:
            if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                os.close(fd)
                raise
            left = _read(fd)  # no flock here: the recorded process decides
            if _alive_here(left):
                os.close(fd)
                return None, left
            return fd, left
        try:
            current = os.stat(path).st_ino == os.fstat(fd).st_ino  # not a file its holder removed as we opened it
        except FileNotFoundError:
            current = False
        if current:
            return fd, _read(fd)
        os.close(fd)


def _write(fd: int, record: dict) -> None:
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, (json.dumps(record) + "\n").encode())
    os.fsync(fd)


def _release(fd: int, path: Path) -> None:
    """Remove the lock file (while still holding it) and close it."""
    with contextlib.suppress(OSError):
        if os.stat(path).st_ino == os.fstat(fd).st_ino:
            path.unlink()
    os.close(fd)


@contextlib.contextmanager
def holding_run(run_dir: Path, out: Path, say: Callable[[str], None] = lambda _m: None) -> Iterator[None]:
    """Hold ``run_dir``'s lock for the block (``out``: the OUT named in a refusal); under a launcher, the ranks agree
    on the main process's verdict (in the launch's running process group). A live holder's lock refuses the run in one line naming it; a stale one
    is taken over, with a line. Released on leaving the block, however it is left."""
    from ..checkpoint.placement import this_launch

    path = lock_path(run_dir)
    launch = this_launch()
    launched, main = launch.several, launch.main
    fd, refusal, stale = None, None, {}
    made = [folder for folder in [path.parent, *path.parent.parents] if not folder.exists()]  # removed if left empty
    if main:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, left = _take(path)
        if fd is None:
            refusal = (f"{out} is in use: a ladderize run holds {path} ({describe_holder(left)}); wait for it to end, "
                       "or stop it")
        else:
            stale = left
            _write(fd, _record())
    if launched:
        from .process_group import agreed

        refusal = agreed(refusal)  # every rank of this launch: the main process's verdict
    try:
        if refusal is not None:
            raise LadderizeError(refusal)
        if stale.get("pid") is not None:
            say(f"taking over {path} from {describe_holder(stale)}, which ended without releasing it")
        yield
    finally:
        if fd is not None:
            _release(fd, path)
            for folder in made:  # the folders the lock needed, where the run left nothing in them
                with contextlib.suppress(OSError):
                    folder.rmdir()
