"""What an adaptation reads, checked before anything loads (no torch): the command line calls these before its heavy
imports, and ``train.preflight`` again for every run started from Python."""

from __future__ import annotations

from pathlib import Path

from ..errors import LadderizeError


def check_input_checkpoint(source: str | Path):
    """The checkpoint to adapt: it exists, is a checkpoint folder, and has converted layers (a dense one has nothing
    to adapt). One line otherwise; returns its ``checkpoint.architectures.ConfigHeader``."""
    from ..checkpoint.architectures import read_config_header

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
    from ..checkpoint.architectures import read_provenance
    from ..corpus.documents import mixture_parts

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
