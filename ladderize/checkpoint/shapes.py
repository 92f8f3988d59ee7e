"""The shape of a Llama-family decoder: one type, one head-dim rule, one parameter count, one preset table.

``ModelShape`` is what the runtime, the performance model
(``predict``) and ``ladderize inspect`` read from a checkpoint's config; ``PRESETS`` names the
public and synthetic shapes (``ladderize predict --model``, ``ladderize bench --synthetic``);
``ladderize.synthetic.write_synthetic_checkpoint`` writes a shape with random weights (benchmarks, tests).

Ground floor: imports only ``ladderize.errors``; no torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, Mapping

from ..errors import LadderizeError

_POSITIVE = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
             "num_key_value_heads", "head_dim", "vocab_size", "dtype_bytes")


def head_dim_of(config: Any) -> int:
    """The attention head size: the config's ``head_dim``, else ``hidden_size // num_attention_heads`` (the one rule)."""
    get = config.get if isinstance(config, Mapping) else lambda key, default=None: getattr(config, key, default)
    return int(get("head_dim", None) or int(get("hidden_size")) // int(get("num_attention_heads")))


@dataclass(frozen=True)
class ModelShape:
    """The shapes of a Llama-family decoder (bf16 weights unless ``dtype_bytes`` says otherwise).

    The first eight fields are the tensor shapes; the rest are the numbers a runtime or a
    synthetic checkpoint also needs, with Llama's defaults.
    """

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
    rms_norm_eps: float = 1e-5
    hidden_act: str = "silu"
    attention_bias: bool = False
    attention_out_bias: bool = False
    mlp_bias: bool = False
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 8192
    rope_theta: float | None = None  # for a synthetic config; None leaves the config's default

    def __post_init__(self) -> None:
        for field in _POSITIVE:
            if int(getattr(self, field)) < 1:
                raise LadderizeError(f"model shape {self.name!r}: {field} must be positive, got {getattr(self, field)}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise LadderizeError(
                f"model shape {self.name!r}: {self.num_key_value_heads} KV heads do not divide "
                f"{self.num_attention_heads} query heads"
            )

    # the runtime's names for the same numbers
    @property
    def num_layers(self) -> int:
        return self.num_hidden_layers

    @property
    def num_heads(self) -> int:
        return self.num_attention_heads

    @property
    def num_kv_heads(self) -> int:
        return self.num_key_value_heads

    @property
    def num_parameters(self) -> int:
        """Every parameter of the model (``sum(p.numel() for p in model.parameters())``): layers, norms, embedding, head."""
        d, hd, heads, kv = self.hidden_size, self.head_dim, self.num_attention_heads, self.num_key_value_heads
        attention = d * (heads + 2 * kv) * hd + heads * hd * d
        attention += (heads + 2 * kv) * hd if self.attention_bias else 0
        attention += d if self.attention_out_bias else 0
        mlp = 3 * d * self.intermediate_size + ((2 * self.intermediate_size + d) if self.mlp_bias else 0)
        embedding = self.vocab_size * d
        head = 0 if self.tie_word_embeddings else self.vocab_size * d
        return self.num_hidden_layers * (attention + mlp + 2 * d) + embedding + head + d

    def param_count(self) -> int:
        """``num_parameters`` (the runtime's name)."""
        return self.num_parameters

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def config_dict(self) -> dict[str, Any]:
        """The Llama ``config.json`` fields of this shape (a synthetic model's config)."""
        values = {
            "hidden_act": self.hidden_act,
            "rms_norm_eps": self.rms_norm_eps,
            "tie_word_embeddings": self.tie_word_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab_size,
        }
        for flag in ("attention_bias", "mlp_bias"):
            if getattr(self, flag):
                values[flag] = True
        if self.attention_out_bias != self.attention_bias:
            values["attention_out_bias"] = self.attention_out_bias
        if self.rope_theta is not None:
            values["rope_theta"] = self.rope_theta
        return values

    def with_(self, **changes: Any) -> "ModelShape":
        return replace(self, **changes)

    @classmethod
    def from_config(cls, config: Any, name: str = "") -> "ModelShape":
        """The shape of a config object or ``config.json`` dict (a ``LadderLlamaConfig``, ``LlamaConfig``, ...).

        Missing fields are a one-line ``LadderizeError``; biases follow ``ladder_config_kwargs``'s
        names (``attention_out_bias`` follows ``attention_bias`` when absent).
        """
        get = config.get if isinstance(config, Mapping) else lambda key, default=None: getattr(config, key, default)
        label = name or str(get("_name_or_path", "") or "config")
        try:
            heads = int(get("num_attention_heads"))
            attention_bias = bool(get("attention_bias", False))
            out_bias = get("attention_out_bias", None)
            values = dict(
                name=name,
                hidden_size=int(get("hidden_size")),
                intermediate_size=int(get("intermediate_size")),
                num_hidden_layers=int(get("num_hidden_layers")),
                num_attention_heads=heads,
                num_key_value_heads=int(get("num_key_value_heads", None) or heads),
                head_dim=head_dim_of(config),
                vocab_size=int(get("vocab_size")),
                rms_norm_eps=float(get("rms_norm_eps", 1e-5)),
                hidden_act=get("hidden_act", "silu"),
                attention_bias=attention_bias,
                attention_out_bias=attention_bias if out_bias is None else bool(out_bias),
                mlp_bias=bool(get("mlp_bias", False)),
                tie_word_embeddings=bool(get("tie_word_embeddings", False)),
                max_position_embeddings=int(get("max_position_embeddings", 8192) or 8192),
            )
        except TypeError as exc:
            missing = next((k for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                                        "vocab_size") if get(k, None) is None), None)
            if missing:
                raise LadderizeError(f"config {label} lacks the field {missing!r} that a Llama-style shape needs") from None
            raise LadderizeError(f"config {label} has a malformed shape field: {exc}") from None
        except ValueError as exc:
            raise LadderizeError(f"config {label} has a malformed shape field: {exc}") from None
        if name:
            values["source"] = f"config: {name}"
        return cls(**values)


_HF = "https://huggingface.co/{}/blob/main/config.json"
_LLAMA3 = dict(rope_theta=500000.0)

#: The one table of named shapes: public models (each cites the config.json it copies) and
#: synthetic ones for ``bench --synthetic`` (head counts split for the TP degrees noted).
SHAPES: tuple[ModelShape, ...] = (
    ModelShape(
        "Llama-3.1-8B", 4096, 14336, 32, 32, 8, 128, 128256, **_LLAMA3,
        source=_HF.format("meta-llama/Llama-3.1-8B") + "; Llama 3 paper (arXiv:2407.21783) Table 3",
    ),
    ModelShape(
        "Llama-3.1-70B", 8192, 28672, 80, 64, 8, 128, 128256, **_LLAMA3,
        source=_HF.format("meta-llama/Llama-3.1-70B") + "; Llama 3 paper (arXiv:2407.21783) Table 3",
    ),
    ModelShape(
        "Llama-3.1-405B", 16384, 53248, 126, 128, 8, 128, 128256, **_LLAMA3,
        source=_HF.format("meta-llama/Llama-3.1-405B") + "; Llama 3 paper (arXiv:2407.21783) Table 3",
    ),
    ModelShape(
        "Llama-2-70B", 8192, 28672, 80, 64, 8, 128, 32000,
        source=_HF.format("meta-llama/Llama-2-70b-hf") + "; Llama 2 paper (arXiv:2307.09288), GQA with 8 KV heads",
    ),
    # TP 1, 2, 4: a toy for smoke tests.
    ModelShape("tiny", 64, 128, 4, 8, 4, 8, 128, source="synthetic"),
    # TP 1, 2, 4: on a 2-core CPU at TP=2, communication is a third to a half of decode time (like TP on GPUs).
    ModelShape("cpu-512", 512, 1536, 8, 8, 4, 64, 4096, source="synthetic"),
    # TP 1, 2, 4, 8: memory-bound on a 2-core CPU; communication is a smaller share.
    ModelShape("cpu-1024", 1024, 2816, 8, 16, 8, 64, 8192, source="synthetic"),
    # SmolLM2-135M's shape (TP 1, 3).
    ModelShape("smollm2-135m", 576, 1536, 30, 9, 3, 64, 49152, tie_word_embeddings=True, rope_theta=100000.0,
               source="synthetic: SmolLM2-135M's shape"),
    # Llama-3.2-1B's shape (untied head) for GPUs, TP 1, 2, 4, 8.
    ModelShape("llama-1b", 2048, 8192, 16, 32, 8, 64, 128256, **_LLAMA3, source="synthetic: Llama-3.2-1B's shape"),
    # Llama-3.2-3B's shape (untied head), for adapt's throughput on one GPU.
    ModelShape("llama-3b", 3072, 8192, 28, 24, 8, 128, 128256, **_LLAMA3, source="synthetic: Llama-3.2-3B's shape"),
)
PRESETS: dict[str, ModelShape] = {shape.name.lower(): shape for shape in SHAPES}
#: Other names of the same shapes (``bench --synthetic llama-8b``).
ALIASES = {"llama-8b": "llama-3.1-8b", "llama-70b": "llama-3.1-70b"}


def _normalise(name: str) -> str:
    text = name.strip().lower()
    for prefix in ("meta-llama/", "meta-"):
        if text.startswith(prefix):
            text = text[len(prefix):]
    text = text.removesuffix("-hf").removesuffix("-instruct")
    return ALIASES.get(text, text)


def preset(name: str) -> ModelShape | None:
    """The preset called ``name`` (case-insensitive, ``meta-llama/`` and ``-Instruct``/``-hf`` ignored), or None."""
    return PRESETS.get(_normalise(name))


def public_presets() -> dict[str, ModelShape]:
    """The presets that copy a published config.json (``ladderize predict``'s table)."""
    return {key: shape for key, shape in PRESETS.items() if shape.source.startswith("https://")}


def synthetic_presets() -> dict[str, dict[str, Any]]:
    """Every preset (and alias) as a config dict, for ``bench --synthetic``."""
    table = {key: shape.config_dict() for key, shape in PRESETS.items()}
    table.update({alias: dict(table[key]) for alias, key in ALIASES.items()})
    return table


__all__ = [
    "ALIASES",
    "PRESETS",
    "SHAPES",
    "ModelShape",
    "head_dim_of",
    "preset",
    "public_presets",
    "synthetic_presets",
]
