"""Model shapes for the performance model: public Llama presets, or any Llama-style config.json.

The shape type and the one preset table live in ``checkpoint.shapes``; this module picks the public presets.

Only the tensor shapes matter to ``ladderize predict``; weights are never read.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import LadderizeError
from ..checkpoint.shapes import ModelShape, preset, public_presets

__all__ = ["PUBLIC_PRESETS", "ModelShape", "load_model_shape"]


#: ``predict``'s presets: the shapes of the one table (``checkpoint.shapes.PRESETS``) that copy a published config.
PUBLIC_PRESETS: dict[str, ModelShape] = public_presets()


def load_model_shape(spec: str | Path) -> ModelShape:
    """A preset name (``llama-3.1-70b``, case-insensitive) or a path to a config.json / checkpoint folder."""
    text = str(spec)
    found = preset(text)
    if found is not None:
        return found
    path = Path(text).expanduser()
    if path.is_dir() or path.is_file():
        # The one config reader (load_config is config_from_dict of the folder's config.json), on the dict read once.
        from ..checkpoint.architectures import read_config_file, read_config_json
        from ..checkpoint.io import config_from_dict, model_shape

        label = path.name if path.is_dir() else (path.parent.name if path.name == "config.json" else path.stem)
        try:
            raw = read_config_json(path) if path.is_dir() else read_config_file(path)
            ModelShape.from_config(raw, label)  # a shape field missing is an error, not a transformers default
            config = config_from_dict(raw)
        except LadderizeError as exc:
            raise LadderizeError(f"cannot read model config {path}: {str(exc).split(': ', 1)[-1]}") from None
        except (TypeError, ValueError) as exc:
            raise LadderizeError(f"cannot read model config {path}: {type(exc).__name__}: {exc}") from None
        return model_shape(config, label)
    names = ", ".join(s.name for s in PUBLIC_PRESETS.values())
    raise LadderizeError(f"unknown model {text!r}: give a preset ({names}) or a config.json / checkpoint folder")
