"""Model shapes for the performance model: public Llama presets, or any Llama-style config.json.

Only the tensor shapes matter to ``ladderize predict``; weights are never read.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping

from ..errors import LadderizeError


@dataclass(frozen=True)
class ModelShape:
    """The shapes of a Llama-family decoder (bf16 weights unless ``dtype_bytes`` says otherwise)."""

    name: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    dtype_bytes: int = 2
    source: str = ""

    def __post_init__(self) -> None:
        for field in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                      "num_key_value_heads", "head_dim", "vocab_size", "dtype_bytes"):
            if int(getattr(self, field)) < 1:
                raise LadderizeError(f"model shape {self.name!r}: {field} must be positive, got {getattr(self, field)}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise LadderizeError(
                f"model shape {self.name!r}: {self.num_key_value_heads} KV heads do not divide "
                f"{self.num_attention_heads} query heads"
            )

    @property
    def num_parameters(self) -> int:
        """Decoder parameters plus embedding and LM head (norms ignored)."""
        d, hd = self.hidden_size, self.head_dim
        attention = d * (self.num_attention_heads + 2 * self.num_key_value_heads) * hd + self.num_attention_heads * hd * d
        mlp = 3 * d * self.intermediate_size
        return self.num_hidden_layers * (attention + mlp) + 2 * self.vocab_size * d

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_config_dict(cls, config: Mapping[str, Any], name: str) -> "ModelShape":
        """Read the shape fields of a Hugging Face Llama-style ``config.json`` dict."""
        try:
            hidden = int(config["hidden_size"])
            heads = int(config["num_attention_heads"])
            shape = cls(
                name=name,
                hidden_size=hidden,
                intermediate_size=int(config["intermediate_size"]),
                num_hidden_layers=int(config["num_hidden_layers"]),
                num_attention_heads=heads,
                num_key_value_heads=int(config.get("num_key_value_heads") or heads),
                head_dim=int(config.get("head_dim") or hidden // heads),
                vocab_size=int(config["vocab_size"]),
                source=f"config: {name}",
            )
        except KeyError as exc:
            raise LadderizeError(f"config {name} lacks the field {exc.args[0]!r} that a Llama-style shape needs") from None
        except (TypeError, ValueError) as exc:
            raise LadderizeError(f"config {name} has a malformed shape field: {exc}") from None
        return shape


_HF = "https://huggingface.co/{}/blob/main/config.json"

#: Public shapes. Each cites the config.json it copies (and the paper that states the same numbers).
PRESETS: dict[str, ModelShape] = {
    shape.name.lower(): shape
    for shape in (
        ModelShape(
            "Llama-3.1-8B", 4096, 14336, 32, 32, 8, 128, 128256,
            source=_HF.format("meta-llama/Llama-3.1-8B") + "; Llama 3 paper (arXiv:2407.21783) Table 3",
        ),
        ModelShape(
            "Llama-3.1-70B", 8192, 28672, 80, 64, 8, 128, 128256,
            source=_HF.format("meta-llama/Llama-3.1-70B") + "; Llama 3 paper (arXiv:2407.21783) Table 3",
        ),
        ModelShape(
            "Llama-3.1-405B", 16384, 53248, 126, 128, 8, 128, 128256,
            source=_HF.format("meta-llama/Llama-3.1-405B") + "; Llama 3 paper (arXiv:2407.21783) Table 3",
        ),
        ModelShape(
            "Llama-2-70B", 8192, 28672, 80, 64, 8, 128, 32000,
            source=_HF.format("meta-llama/Llama-2-70b-hf") + "; Llama 2 paper (arXiv:2307.09288), GQA with 8 KV heads",
        ),
    )
}


def _normalise(name: str) -> str:
    text = name.strip().lower()
    for prefix in ("meta-llama/", "meta-"):
        if text.startswith(prefix):
            text = text[len(prefix):]
    return text.removesuffix("-hf").removesuffix("-instruct")


def load_model_shape(spec: str | Path) -> ModelShape:
    """A preset name (``llama-3.1-70b``, case-insensitive) or a path to a config.json / checkpoint folder."""
    text = str(spec)
    key = _normalise(text)
    if key in PRESETS:
        return PRESETS[key]
    path = Path(text).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        try:
            config = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise LadderizeError(f"cannot read model config {path}: {exc}") from None
        label = path.parent.name if path.name == "config.json" else path.stem
        return ModelShape.from_config_dict(config, label)
    names = ", ".join(s.name for s in PRESETS.values())
    raise LadderizeError(f"unknown model {text!r}: give a preset ({names}) or a config.json / checkpoint folder")
