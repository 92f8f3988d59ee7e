"""The shape numbers of a checkpoint's config, and whether a TP degree can run it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import LadderizeError
from ..model.layout import LayerMode, Layout, check_tp_divides, format_layer_ranges


@dataclass(frozen=True)
class ModelDims:
    """The shape numbers the runtime needs, read once from a config."""

    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float
    hidden_act: str
    attention_bias: bool
    attention_out_bias: bool
    mlp_bias: bool
    tie_word_embeddings: bool

    @classmethod
    def from_config(cls, config: Any) -> "ModelDims":
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        attention_bias = bool(getattr(config, "attention_bias", False))
        out_bias = getattr(config, "attention_out_bias", None)
        return cls(
            hidden_size=config.hidden_size,
            num_layers=config.num_hidden_layers,
            num_heads=config.num_attention_heads,
            num_kv_heads=config.num_key_value_heads or config.num_attention_heads,
            head_dim=head_dim,
            intermediate_size=config.intermediate_size,
            vocab_size=config.vocab_size,
            rms_norm_eps=float(config.rms_norm_eps),
            hidden_act=config.hidden_act,
            attention_bias=attention_bias,
            attention_out_bias=attention_bias if out_bias is None else bool(out_bias),
            mlp_bias=bool(getattr(config, "mlp_bias", False)),
            tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
        )

    def param_count(self) -> int:
        d, hd = self.hidden_size, self.head_dim
        attn = d * (self.num_heads + 2 * self.num_kv_heads) * hd + self.num_heads * hd * d
        mlp = 3 * d * self.intermediate_size
        head = 0 if self.tie_word_embeddings else self.vocab_size * d
        return self.num_layers * (attn + mlp + 2 * d) + self.vocab_size * d + head + d


def load_config(path: str | Path) -> tuple[Any, Layout]:
    """The config and layout of a checkpoint, through the one config reader (``convert.checkpoint.load_config``).

    Every architecture ``convert`` accepts runs: Llama, Mistral (full attention), Qwen2, the
    Ladder authors' format and converted ``ladder_llama`` checkpoints.
    """
    from ..convert.checkpoint import load_config as read_config

    config = read_config(path)
    return config, config.layout


def validate_tp(dims: ModelDims, layout: Layout, tp: int, allow_spd_mismatch: bool = False) -> None:
    """Check that ``tp`` ranks can run this model; raise ``LayoutError``/``LadderizeError`` with one line.

    SPD layers are a different model at another TP degree: the error names the degree they need.
    """
    if tp < 1:
        raise LadderizeError(f"--tp must be at least 1, got {tp}")
    spd_layers = layout.layers(LayerMode.SPD)
    # Dense and ladder layers replicate KV heads when tp exceeds their count; SPD's head groups cannot.
    check_tp_divides(tp, dims.num_heads, dims.num_kv_heads, dims.intermediate_size, replicate_kv=not spd_layers)
    if spd_layers and tp != layout.spd_tp_size and not allow_spd_mismatch:
        raise LadderizeError(
            f"the model has SPD layers converted for TP={layout.spd_tp_size}: it needs --tp {layout.spd_tp_size}, "
            f"not --tp {tp} (layers {format_layer_ranges(spd_layers)} would compute other head groups, a different "
            "model), or --allow-spd-mismatch to run SPD semantics at this degree anyway"
        )


__all__ = ["ModelDims", "load_config", "validate_tp"]
