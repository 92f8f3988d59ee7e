"""The teacher's states of the calibration set, kept by a sequential stage for the stages after it.

A sequential stage computes, over its calibration set, the teacher's states entering the first converted
layer (the frozen prefix, shared with the student) and, one layer after another, the teacher's states up to
its last layer. A kd or lm stage of the same recipe on the same text would compute both again at every step:
the teacher's forward through every layer, about a third of a kd step on SmolLM2 with ladder on 15-29. So the
sequential stage writes them (``write``: ``entry.safetensors`` when the states entering the first converted
layer exist, ``final.safetensors`` once the teacher's last layer has run), and a later stage whose windows are
calibration rows reads them (``read``) instead of running the teacher: its student starts from the stored entry
state and its kd target is the teacher's head over the stored final state. The numbers are the teacher's own,
up to the rounding of another batch shape (the sequential stage runs ``CHUNK`` sequences at a time).

Each file holds the rows' token ids (the calibration set and the held-out batch after it), and a stage uses the
states only where its own windows are those rows, token for token, of the same teacher and first converted layer
(``read`` says why otherwise, and the stage runs the teacher as before); a batch with a row past the stored ones runs
the teacher. The stage reads a batch's rows from the files at each step, so the states take disk, not memory: three
``[N, S, D]`` float32 tensors (1.6 GB for SmolLM2's 237,056 held-out WikiText tokens). The files live in the recipe's
run dir and go with it.

The sequential stage writes the first ``rows_read`` rows only, as many as the later stages' plans read (all its rows
under a wall budget, whose re-plan may grow them), and none for a stage sharded over several processes that would not
find all its windows stored (its ranks run the teacher together: ``gathers_teacher``), so that every state written is
read. Under N processes each writes the rows it holds, those whose index
modulo N is its rank (``layer_training.owned_rows``), to files of its own (``part_name``); ``read`` puts them together.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from ...checkpoint.atomic import atomic_file
from ...checkpoint.tensor_files import open_safetensors, save_safetensors

ENTRY_FILE = "entry.safetensors"  # input_ids, residual, stale: the states entering the first converted layer
FINAL_FILE = "final.safetensors"  # input_ids, final: the teacher's residual stream entering its final norm


def teacher_id(teacher_path: str) -> str:
    """What names the teacher in the files: its resolved path (a hub id stays as given)."""
    path = Path(teacher_path).expanduser()
    return str(path.resolve()) if path.exists() else str(teacher_path)


def part_name(name: str, part: int, parts: int) -> str:
    """The file of ``name`` that process ``part`` of ``parts`` writes (``name`` itself for one process)."""
    if parts == 1:
        return name
    stem, suffix = name.split(".", 1)
    return f"{stem}-{part:05d}-of-{parts:05d}.{suffix}"


def _parts(directory: Path, name: str) -> int | None:
    """How many processes wrote ``name`` in ``directory`` (1: the one file), ``None`` where it is not all there."""
    if (directory / name).is_file():
        return 1
    stem, suffix = name.split(".", 1)
    counts = {int(file.name.rsplit("-of-", 1)[1].split(".")[0]) for file in directory.glob(f"{stem}-*-of-*.{suffix}")}
    for parts in sorted(counts, reverse=True):
        if all((directory / part_name(name, part, parts)).is_file() for part in range(parts)):
            return parts
    return None


def write(directory: Path, name: str, input_ids: torch.Tensor, tensors: dict[str, torch.Tensor], teacher: str,
          first: int, part: int = 0, parts: int = 1) -> None:
    """Write ``tensors`` (``[N, S, D]`` each, N the rows of ``input_ids``) to ``directory / name``, atomically.

    Under ``parts`` processes each writes the rows it holds, those whose index modulo ``parts`` is ``part``, in order,
    to a file of its own (``part_name``), and removes ``name``'s files of another process count."""
    directory = Path(directory)
    rows = input_ids.shape[0]
    payload = {"input_ids": input_ids.cpu().contiguous(),
               **{key: value[:rows].detach().to("cpu", torch.float32).contiguous() for key, value in tensors.items()}}
    directory.mkdir(parents=True, exist_ok=True)
    stem, suffix = name.split(".", 1)
    for other in [directory / name, *directory.glob(f"{stem}-*-of-*.{suffix}")]:
        if other.name not in {part_name(name, p, parts) for p in range(parts)}:
            other.unlink(missing_ok=True)
    with atomic_file(directory / part_name(name, part, parts)) as tmp:
        save_safetensors(payload, tmp, metadata={"teacher": teacher, "first_converted": str(first)})


class TeacherStates:
    """The stored states of rows ``0..num_rows-1`` in ``directory``: ``rows(index, device)`` gives a batch's
    ``(residual, stale, final)``, read from the files then (each file open for that read only: pages read through an
    open map count in the process's RSS, as ``layer_source.py`` found), so nothing of them stays in memory."""

    def __init__(self, directory: Path, num_rows: int, parts: int = 1, written: int | None = None):
        self.directory, self.num_rows, self.parts = Path(directory), num_rows, parts
        self.written = num_rows if written is None else written  # the rows the files hold
        self.seen = torch.zeros(num_rows, dtype=torch.int32)  # 1 where this process has read the row's states

    def rows_read(self, device: torch.device | str) -> int:
        """How many distinct stored rows were read, by any process (one all-reduce under a launcher)."""
        import torch.distributed as dist

        from ...checkpoint.placement import this_launch

        seen = self.seen.to(device)
        if this_launch().several:
            dist.all_reduce(seen, op=dist.ReduceOp.MAX)
        return int(seen.sum())

    def rows(self, index: list[int], device: torch.device | str) -> tuple[torch.Tensor, ...] | None:
        """The states of rows ``index`` on ``device``; ``None`` when one of them is not stored (the teacher runs).
        Row ``r`` is row ``r // parts`` of part ``r % parts``'s files."""
        if max(index) >= self.num_rows:
            return None
        self.seen[index] = 1
        found: list[list[torch.Tensor | None]] = [[None] * len(index) for _ in range(3)]
        for part in sorted({row % self.parts for row in index}):
            positions = [at for at, row in enumerate(index) if row % self.parts == part]
            slices = [slice(index[at] // self.parts, index[at] // self.parts + 1) for at in positions]
            with open_safetensors(self.directory / part_name(ENTRY_FILE, part, self.parts)) as entry, \
                    open_safetensors(self.directory / part_name(FINAL_FILE, part, self.parts)) as final:
                for kind, (handle, key) in enumerate(((entry, "residual"), (entry, "stale"), (final, "final"))):
                    read = handle.read(key, rows=slices)
                    for offset, at in enumerate(positions):
                        found[kind][at] = read[offset:offset + 1]
        return tuple(torch.cat(kind).to(device) for kind in found)


def read(directory: Path | None, count: int, windows: Callable[[int], torch.Tensor], teacher: str,
         first: int) -> tuple[TeacherStates | None, str | None]:
    """The stored states if a stage's ``count`` windows (``windows(n)``: the first ``n`` as ``[n, S]``) begin with the
    stored rows, or are their first rows, for the same ``teacher`` and first converted layer; else ``None``. The
    second value says what was found, for the log (``None``: nothing is stored)."""
    if directory is None:
        return None, None
    directory = Path(directory)
    parts = [_parts(directory, name) for name in (ENTRY_FILE, FINAL_FILE)]
    if parts[0] is None or parts[0] != parts[1]:
        return None, None
    parts = parts[0]
    shared, written = count, 0
    for name in (ENTRY_FILE, FINAL_FILE):
        pieces = []
        for part in range(parts):
            with open_safetensors(directory / part_name(name, part, parts)) as handle:
                meta = handle.metadata() or {}
                if meta.get("teacher") != teacher or meta.get("first_converted") != str(first):
                    return None, f"the teacher states in {directory} are of another teacher or layout: the teacher runs"
                pieces.append(handle.get_tensor("input_ids"))
        stored = sum(piece.shape[0] for piece in pieces)
        if any(piece.shape[0] != len(range(part, stored, parts)) for part, piece in enumerate(pieces)):
            return None, f"the teacher states in {directory} are not whole: the teacher runs"
        ids = torch.empty((stored, *pieces[0].shape[1:]), dtype=pieces[0].dtype)
        for part, piece in enumerate(pieces):
            ids[part::parts] = piece
        shared, written = min(shared, stored), stored
        if not torch.equal(ids[:shared], windows(shared).to(ids.dtype)):
            return None, "this stage's sequences are not those whose teacher states are stored: the teacher runs"
    if shared == 0:
        return None, None
    states = TeacherStates(directory, shared, parts, written)
    outside = "" if count <= shared else \
        f"; {count - shared:,} of its {count:,} sequences are not stored: the batches with one of them run the teacher"
    return states, (f"the teacher's states of {shared:,} sequences come from the sequential stage ({directory}): "
                    f"the teacher's layers do not run for them{outside}")
