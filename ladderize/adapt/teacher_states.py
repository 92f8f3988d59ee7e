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
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..checkpoint.atomic import atomic_file
from ..checkpoint.tensor_files import open_safetensors, save_safetensors

ENTRY_FILE = "entry.safetensors"  # input_ids, residual, stale: the states entering the first converted layer
FINAL_FILE = "final.safetensors"  # input_ids, final: the teacher's residual stream entering its final norm


def teacher_id(teacher_path: str) -> str:
    """What names the teacher in the files: its resolved path (a hub id stays as given)."""
    path = Path(teacher_path).expanduser()
    return str(path.resolve()) if path.exists() else str(teacher_path)


def write(directory: Path, name: str, input_ids: torch.Tensor, tensors: dict[str, torch.Tensor], teacher: str,
          first: int) -> None:
    """Write ``tensors`` (``[N, S, D]`` each, N the rows of ``input_ids``) to ``directory / name``, atomically."""
    rows = input_ids.shape[0]
    payload = {"input_ids": input_ids.cpu().contiguous(),
               **{key: value[:rows].detach().to("cpu", torch.float32).contiguous() for key, value in tensors.items()}}
    with atomic_file(Path(directory) / name) as tmp:
        save_safetensors(payload, tmp, metadata={"teacher": teacher, "first_converted": str(first)})


class TeacherStates:
    """The stored states of rows ``0..num_rows-1`` in ``directory``: ``rows(index, device)`` gives a batch's
    ``(residual, stale, final)``, read from the files then (each file open for that read only: pages read through an
    open map count in the process's RSS, as ``layer_source.py`` found), so nothing of them stays in memory."""

    def __init__(self, directory: Path, num_rows: int):
        self.directory, self.num_rows = Path(directory), num_rows

    def rows(self, index: list[int], device: torch.device | str) -> tuple[torch.Tensor, ...] | None:
        """The states of rows ``index`` on ``device``; ``None`` when one of them is not stored (the teacher runs)."""
        if max(index) >= self.num_rows:
            return None
        parts = [slice(row, row + 1) for row in index]
        with open_safetensors(self.directory / ENTRY_FILE) as entry, open_safetensors(self.directory / FINAL_FILE) as final:
            return tuple(handle.read(key, rows=parts).to(device)
                         for handle, key in ((entry, "residual"), (entry, "stale"), (final, "final")))


def read(directory: Path | None, count: int, windows: Callable[[int], torch.Tensor], teacher: str,
         first: int) -> tuple[TeacherStates | None, str | None]:
    """The stored states if a stage's ``count`` windows (``windows(n)``: the first ``n`` as ``[n, S]``) begin with the
    stored rows, or are their first rows, for the same ``teacher`` and first converted layer; else ``None``. The
    second value says what was found, for the log (``None``: nothing is stored)."""
    files = [] if directory is None else [Path(directory) / ENTRY_FILE, Path(directory) / FINAL_FILE]
    if not files or not all(file.is_file() for file in files):
        return None, None
    shared = count
    for file in files:
        with open_safetensors(file) as handle:
            meta = handle.metadata() or {}
            if meta.get("teacher") != teacher or meta.get("first_converted") != str(first):
                return None, f"the teacher states in {directory} are of another teacher or layout: the teacher runs"
            ids = handle.get_tensor("input_ids")
            shared = min(shared, ids.shape[0])
            if not torch.equal(ids[:shared], windows(shared).to(ids.dtype)):
                return None, "this stage's sequences are not those whose teacher states are stored: the teacher runs"
    states = TeacherStates(Path(directory), shared)
    outside = "" if count <= shared else \
        f"; {count - shared:,} of its {count:,} sequences are not stored: the batches with one of them run the teacher"
    return states, (f"the teacher's states of {shared:,} sequences come from the sequential stage ({directory}): "
                    f"the teacher's layers do not run for them{outside}")


def _reads_kept_states(step: dict[str, Any], before: dict[str, Any]) -> bool:
    """Whether joint stage ``step`` can read the teacher's states sequential stage ``before`` keeps: it trains the
    converted layers with ``kd`` and/or ``lm`` only, on the same data and sequence length."""
    from .objectives import STORED_TEACHER_OBJECTIVES, parse_objectives

    objectives = set(parse_objectives(str(step.get("objectives", "local"))))
    return (before.get("local_schedule") == "sequential" and step.get("local_schedule") != "sequential"
            and step.get("train") != "all" and objectives <= STORED_TEACHER_OBJECTIVES
            and before.get("data") == step.get("data") and before.get("seq_len") == step.get("seq_len"))


def keeps_teacher_states(steps: list[dict[str, Any]], index: int) -> bool:
    """Whether stage ``index`` is a sequential stage whose teacher states a later stage can read."""
    return any(_reads_kept_states(step, steps[index]) for step in steps[index + 1:])


def reads_stored_teacher(steps: list[dict[str, Any]], index: int, data_tokens: int | None = None) -> bool:
    """Whether stage ``index`` will read the teacher's states a sequential stage before it stores
    (``_reads_kept_states``), for windows (its tokens, at most the ``data_tokens`` the data
    holds) within the rows that stage stores: its calibration set and the batch of held-out rows after it. The stage
    itself checks its windows token for token (a batch with a row outside runs the teacher); this is the plan's guess."""
    from .config import AdaptConfig

    step = steps[index]
    reads = step["tokens"] if data_tokens is None else min(step["tokens"], data_tokens)
    return any(_reads_kept_states(step, before) and reads <= before["tokens"] + before.get("batch_size", AdaptConfig.batch_size)
               * before.get("seq_len", AdaptConfig.seq_len) for before in steps[:index])
