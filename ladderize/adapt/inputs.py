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
