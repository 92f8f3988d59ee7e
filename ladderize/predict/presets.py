"""Model shapes for the performance model: public Llama presets, or any Llama-style config.json.

The shape type and the one preset table live in ``model.shapes``; this module picks the public presets.

Only the tensor shapes matter to ``ladderize predict``; weights are never read.
"""

from __future__ import annotations

from pathlib import Path

from ..model.architectures import read_config_file
from ..errors import LadderizeError
from ..model.shapes import ModelShape, preset, public_presets

__all__ = ["PRESETS", "ModelShape", "load_model_shape"]


#: ``predict``'s presets: the shapes of the one table (``model.shapes.PRESETS``) that copy a published config.
PRESETS: dict[str, ModelShape] = public_presets()


def load_model_shape(spec: str | Path) -> ModelShape:
    """A preset name (``llama-3.1-70b``, case-insensitive) or a path to a config.json / checkpoint folder."""
    text = str(spec)
    found = preset(text)
    if found is not None:
        return found
    path = Path(text).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        label = path.parent.name if path.name == "config.json" else path.stem
        try:
            config = read_config_file(path)
        except LadderizeError as exc:
            raise LadderizeError(f"cannot read model config {path}: {str(exc).split(': ', 1)[-1]}") from None
        return ModelShape.from_config(config, label)
    names = ", ".join(s.name for s in PRESETS.values())
    raise LadderizeError(f"unknown model {text!r}: give a preset ({names}) or a config.json / checkpoint folder")
