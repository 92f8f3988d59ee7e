"""What an adaptation reads, checked before anything loads (no torch): the command line calls these before its heavy
imports, and ``train.preflight`` again for every run started from Python."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ...errors import LadderizeError

PLAN_FILE = "recipe.json"  # in a recipe's run folder: its plan (``recipe_run.py``)
STATE_DIR = "state"  # in a stage's run folder: its training state (``training_state.py``)
TRAINER_STATE = "trainer_state.json"  # in the state: step, times and the settings' fingerprint


def check_input_checkpoint(source: str | Path):
    """The checkpoint to adapt: it exists, is a checkpoint folder, and has converted layers (a dense one has nothing
    to adapt). One line otherwise; returns its ``checkpoint.architectures.ConfigHeader``."""
    from ...checkpoint.architectures import read_config_header

    path = Path(source).expanduser()
    if not path.exists():
        raise LadderizeError(f"checkpoint {path} not found")
    if not path.is_dir():
        raise LadderizeError(f"{path} is not a checkpoint: a checkpoint is a directory with config.json and safetensors weights")
    header = read_config_header(path)
    modes = header.layout.modes
    if not header.layout.converted_layers:
        raise LadderizeError(
            f"{path} has no converted layers (all {len(modes)} are dense), so there is nothing to "
            f"adapt; convert some first, e.g. ladderize convert SRC OUT --ladder {len(modes) // 2}:{len(modes)}"
        )
    return header


def adapt_inputs(checkpoint: str | Path, data: str | None = None, teacher: str | None = None) -> list[Path]:
    """The local paths an adaptation reads: the checkpoint, the data where it is a file or folder (each part of a
    mixture), and the teacher (``--teacher`` or the source in the checkpoint's provenance). ``--force`` and a
    finished run must never remove one of them (``checkpoint.atomic.check_apart``)."""
    from ...checkpoint.architectures import read_provenance
    from ...corpus.documents import mixture_parts

    paths = [Path(checkpoint).expanduser()]
    if data is not None:
        parts = mixture_parts(data) or [data]
        paths += [Path(part[0] if isinstance(part, tuple) else part).expanduser() for part in parts]
    if teacher is None and paths[0].is_dir():
        try:
            teacher = (read_provenance(paths[0]).get("source") or {}).get("path")
        except (OSError, ValueError, LadderizeError):
            teacher = None
    if teacher is not None:
        paths.append(Path(teacher).expanduser())
    return [path for path in paths if path.exists()]


def resolve_teacher(checkpoint: str, teacher: str | None) -> str:
    """The dense teacher: ``--teacher`` or the source recorded in the checkpoint's provenance (read without torch),
    a folder that exists, else one line."""
    from ...checkpoint.architectures import read_provenance

    if teacher is None:
        source = (read_provenance(checkpoint).get("source") or {}).get("path")
        if not source:
            raise LadderizeError(f"{checkpoint} records no dense source in its provenance; pass --teacher SRC")
        teacher = source
    path = Path(teacher).expanduser()
    if path.is_file():
        raise LadderizeError(
            f"teacher {teacher} is a file, not a checkpoint directory; convert it with 'ladderize convert' "
            "or pass --teacher with a dense checkpoint directory"
        )
    if not path.is_dir():
        raise LadderizeError(f"teacher checkpoint {teacher} not found; pass --teacher with a dense checkpoint directory")
    return teacher


def run_folder(out: str | Path, run_dir: str | Path | None = None) -> Path:
    """Where a run keeps its training state: ``run_dir``, or ``OUT.adapt-run`` beside OUT (absolute)."""
    out = Path(out).expanduser().absolute()
    return Path(run_dir).expanduser().absolute() if run_dir else out.parent / f"{out.name}.adapt-run"


def check_seq_len(seq_len: int, positions: int | None = None, name: str = "") -> None:
    """A sequence length a model trains on: at least 2 tokens (each predicts the next), and no more than the
    ``positions`` it encodes (``max_position_embeddings`` of checkpoint ``name``; None: not checked). One line
    otherwise."""
    if seq_len < 2:
        raise LadderizeError(f"--seq-len must be at least 2 (a sequence trains each token on the next), got {seq_len}")
    if positions is not None and seq_len > positions:
        raise LadderizeError(f"sequence length {seq_len:,} (--seq-len) is more than the {positions:,} positions "
                             f"{name or 'the model'} encodes (max_position_embeddings in its config.json); give "
                             f"--seq-len {positions} or less")


def model_positions(header: Any) -> int | None:
    """The positions a checkpoint encodes (``max_position_embeddings``) from its ``ConfigHeader``; None where its
    config does not say."""
    positions = header.values.get("max_position_embeddings")
    return int(positions) if isinstance(positions, (int, float)) and positions > 0 else None


def check_resumable(checkpoint: str | Path, out: str | Path, run_dir: str | Path | None, single: bool) -> None:
    """``--resume``: the run folder holds an interrupted run of the same kind (a recipe's ``recipe.json``, or a single
    stage's saved state) of this checkpoint (by resolved path). One line otherwise: nothing to resume, another
    checkpoint's run, or the other kind of run. The recipe's stages are compared once its plan is built."""
    top = run_folder(out, run_dir)
    plan, state = top / PLAN_FILE, top / STATE_DIR / TRAINER_STATE
    fix = f"check OUT{' and --run-dir' if run_dir else ''}, or run without --resume to start a new run"
    if not (plan if not single else state).is_file():
        if (state if not single else plan).is_file():
            held, asked = ("a single stage's run", "a recipe") if not single else ("a recipe's run", "a single stage")
            raise LadderizeError(f"cannot resume {top}: it holds {held}, and this command runs {asked}; "
                                 "give the flags it was started with")
        raise LadderizeError(f"nothing to resume: {top} holds no interrupted run; {fix}")
    try:
        record = json.loads((plan if not single else state).read_text())
        started = record["checkpoint"] if not single else record["fingerprint"]["checkpoint"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise LadderizeError(f"cannot resume {top}: {plan if not single else state} is unreadable ({exc}); "
                             "run without --resume, with --force, to start over") from None
    if Path(started).expanduser().resolve() != Path(checkpoint).expanduser().resolve():
        raise LadderizeError(f"cannot resume {top}: it is a run of checkpoint {started}, not {checkpoint}; resume it with "
                             f"that checkpoint, or run without --resume, with --force, to start over from {checkpoint}")
