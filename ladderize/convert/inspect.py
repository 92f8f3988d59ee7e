"""What a checkpoint is: its per-layer layout, size and the communication its layout needs under TP."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..checkpoint.architectures import read_config_header, read_provenance
from ..checkpoint.tensor_files import HEADER, CheckpointTensors


def count_parameters(path: Path) -> int:
    """Number of stored parameters, read from safetensors headers (nothing is loaded, no torch; a corrupt file is one line)."""
    with CheckpointTensors(path, framework=HEADER) as tensors:
        return tensors.num_parameters()


def inspect_checkpoint(path: Path | str) -> dict[str, Any]:
    """A JSON-ready description of a converted (or plain Llama-family) checkpoint: headers only, no torch."""
    path = Path(path).expanduser()
    header = read_config_header(path)
    config, layout = header.shape, header.layout
    provenance = read_provenance(path)
    return {
        "path": str(path.absolute()),
        "layout": layout.describe(),
        "layers": [{"layer": i, "mode": m.value} for i, m in enumerate(layout.modes)],
        "ranges": layout.ranges(),
        "spd_tp_size": layout.spd_tp_size,
        "head_grouping": bool(layout.spd_head_order),
        "num_layers": layout.num_layers,
        "parameters": count_parameters(path),
        "dtype": str(header.values.get("dtype") or "unknown").removeprefix("torch."),
        "shape": {
            "hidden_size": config.hidden_size,
            "num_attention_heads": config.num_attention_heads,
            "num_key_value_heads": config.num_key_value_heads,
            "intermediate_size": config.intermediate_size,
            "vocab_size": config.vocab_size,
        },
        "allreduces_per_token": layout.allreduces_per_token(),
        "source": provenance.get("source", {}).get("spec"),
        "history": [h.get("step") for h in provenance.get("history", [])],
    }
