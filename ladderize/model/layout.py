"""Layer modes and layouts: the one place that knows what dense, ladder and spd mean.

This file depends only on the standard library, because it travels inside every
converted checkpoint (``auto_map`` remote code) next to the modeling file.

Every consumer (the converter, the trainer's choice of trainable parameters, the runtime's
communication plan) asks the ``LayerMode`` for its properties instead of re-deriving them; the
layer loops of the HF model, the TP runtime and vLLM run ``module_program`` through one
interpreter, ``residual.ResidualStream``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Mapping, Sequence


class LayoutError(ValueError):
    """A layout or layer range that cannot be applied to the model."""


@dataclass(frozen=True)
class ModeTraits:
    """What a layer mode means, as data: the one table every consumer reads (see ``MODE_TRAITS``)."""

    reads_stale: bool  # both modules read the residual one module late, r_{k-2}
    attention_allreduce: bool  # the attention module ends in its own all-reduce (SPD drops it)
    converted: bool  # the layer's function differs from the dense source layer
    tp_dependent: bool  # the function depends on the TP degree it was converted for (``spd_tp_size``)
    needs_head_split: bool  # its modules are split into that degree's head groups (no KV-head replication)
    card_tag: str = ""  # the model card's tag for a layout with such layers ("" for none)
    card_meaning: str = ""  # the model card's one-line meaning; ``{tp}`` stands for ``spd_tp_size``
    option_help: str = ""  # the CLI's ``--<mode> RANGES`` help: which layers it names ("" : "Layers converted to <mode>")
    budget_help: str = ""  # convert's ``--<mode>-budget`` help after "With --<mode> auto: " ("" : generic words)
    what_if: str = ""  # predict's whole-model what-if of the mode ("" : "every layer <mode>")
    # measured peak learning rates per adapt stage kind (sequential, kd, joint; docs/adapt.md); a mode
    # without them takes those of the first mode of the table that has them (``learning_rates_fallback``)
    learning_rates: Mapping[str, float] = field(default_factory=dict, hash=False)


class LayerMode(str, enum.Enum):
    """How one decoder layer reads the residual stream and where it communicates."""

    DENSE = "dense"
    LADDER = "ladder"
    SPD = "spd"

    @property
    def traits(self) -> ModeTraits:
        return MODE_TRAITS[self.value]

    @property
    def reads_stale_residual(self) -> bool:
        """Both modules of the layer read the residual one module late (r_{k-2})."""
        return self.traits.reads_stale

    @property
    def allreduces_per_layer(self) -> int:
        """All-reduces per token this layer needs under tensor parallelism."""
        return 1 + int(self.traits.attention_allreduce)

    @property
    def syncs_attention(self) -> bool:
        """Whether the attention output is all-reduced before the MLP."""
        return self.traits.attention_allreduce

    @property
    def is_converted(self) -> bool:
        """The layer's function differs from the dense source layer."""
        return self.traits.converted

    @classmethod
    def converted_modes(cls) -> tuple["LayerMode", ...]:
        """The converted modes in table order: the keys of ``Layout.ranges`` and the parts of ``describe``."""
        return tuple(mode for mode in cls if mode.is_converted)

    @classmethod
    def with_traits(cls, **wanted: Any) -> "LayerMode":
        """The first mode of the table whose traits have the ``wanted`` values (``with_traits(converted=False)``:
        the dense layer); ``LookupError`` when none has."""
        for mode in cls:
            if all(getattr(mode.traits, name) == value for name, value in wanted.items()):
                return mode
        raise LookupError(f"no layer mode has {wanted}")

    @property
    def option_help(self) -> str:
        """What the CLI's ``--<mode> RANGES`` names (the help text's start)."""
        return self.traits.option_help or f"Layers converted to {self.value}"

    @property
    def budget_help(self) -> str:
        """What convert's ``--<mode>-budget`` takes (after "With --<mode> auto: ")."""
        return self.traits.budget_help or "relative perplexity increase or layer count"

    @property
    def what_if(self) -> str:
        """Predict's whole-model what-if of this mode, in words."""
        return self.traits.what_if or f"every layer {self.value}"


def learning_rates_fallback() -> Mapping[str, float]:
    """The learning rates of a layout none of whose converted modes has measured rates (or with no converted
    layer): those of the first row of the table that has any (ladder's, measured first, on the gentler conversion)."""
    return next((mode.traits.learning_rates for mode in LayerMode if mode.traits.learning_rates), {})


# The mode table. Its learning rates are the measured peaks per adapt stage kind (docs/adapt.md);
# a layout with several converted modes takes the smallest. Sequential ladder, default recipe on
# ladder 15-29: 1e-3 gives 96.0% of the WikiText gap and LAMBADA -2.2 points; 2e-3 96.3% and -3.7;
# 6e-3 95.4% and -7.6: above 1e-3 the gap barely closes while LAMBADA falls.
# Adding a mode: one row here; ``module_program`` below turns the rows into ModuleOps,
# and ``residual.ResidualStream`` (the one interpreter the HF model, the TP runtime and vLLM share)
# runs them. A mode whose modules read or reduce in a way ModuleOp cannot say yet needs a field on
# ModuleOp and its handling in ``residual.py``, not branches in the three loops; a new kernel (a
# module computing something else) is a method of the callers' kernels. Inspect, the plan and
# predict follow from the program.
MODE_TRAITS: dict[str, ModeTraits] = {
    "dense": ModeTraits(reads_stale=False, attention_allreduce=True, converted=False, tp_dependent=False,
                        needs_head_split=False, card_meaning="standard pre-norm Llama layer",
                        what_if="every layer dense; each all-reduce blocks"),
    "ladder": ModeTraits(reads_stale=True, attention_allreduce=True, converted=True, tp_dependent=False,
                         needs_head_split=False, card_tag="ladder-residual",
                         card_meaning="each module reads the residual one module late, so its all-reduce overlaps the next module",
                         option_help="Layers converted to Ladder Residual",
                         budget_help="relative perplexity increase (0.05) or layer count (12)",
                         what_if="every layer ladder: module k's all-reduce hidden behind module k+1",
                         learning_rates={"sequential": 1e-3, "kd": 2e-4, "joint": 3e-4}),
    "spd": ModeTraits(reads_stale=False, attention_allreduce=False, converted=True, tp_dependent=True,
                      needs_head_split=True, card_tag="sync-point-drop",
                      card_meaning="attention all-reduce dropped: one all-reduce per block, exact at TP={tp} only",
                      option_help="Layers whose attention all-reduce is dropped (Sync-Point Drop)",
                      budget_help="relative perplexity increase (0.03) or layer count (15)",
                      what_if="every layer SPD: attention all-reduces removed (what SPD buys at most)",
                      learning_rates={"sequential": 2e-3, "kd": 1e-4, "joint": 3e-4}),
}


class ModuleKind(str, enum.Enum):
    ATTENTION = "attention"
    MLP = "mlp"


@dataclass(frozen=True)
class ModuleOp:
    """One module of the forward pass: the unit of the mode program.

    Modules are numbered ``k = 1..2L`` (attention, MLP, attention, ...); ``r_k`` is the residual
    stream after module k and ``r_0`` the embeddings. ``reads = j`` means the module's norm reads
    the complete state ``r_j``. An SPD attention adds nothing to the shared stream by itself (its
    partial travels with the MLP's all-reduce), so ``r_k`` after an SPD attention is its input,
    and the SPD MLP also reads its own rank's unreduced attention partial (``reads_local_partial``).
    """

    k: int
    layer: int
    kind: ModuleKind
    mode: LayerMode
    reads: int
    reads_local_partial: bool  # SPD MLP: LN2(X + Y_r), the rank's own attention partial
    allreduce: bool  # the module ends in an all-reduce under TP
    overlaps_next: bool  # that all-reduce may still run while module k+1 computes

    @property
    def reads_stale(self) -> bool:
        """Reads the stale slot (``r_{k-2}``, ``r_0`` for the first module) instead of the previous output."""
        return self.mode.traits.reads_stale


def module_program(modes: Sequence[LayerMode]) -> tuple[ModuleOp, ...]:
    """The per-module program of a layer-mode sequence (see ``ModuleOp``).

    A module reads ``r_{k-1}``, or ``r_{k-2}`` when its layer reads the stale residual. The
    all-reduce of module k overlaps module k+1 exactly when module k+1 reads a state from
    before module k's output; the last module's never does (the final norm reads ``r_{2L}``).
    """
    kinds = [(layer, kind, LayerMode(mode.value)) for layer, mode in enumerate(modes) for kind in ModuleKind]
    local_only = {  # SPD attentions: their output exists only as each rank's partial
        k for k, (_, kind, mode) in enumerate(kinds, start=1)
        if kind is ModuleKind.ATTENTION and not mode.traits.attention_allreduce
    }

    def visible(j: int) -> int:  # the complete state that stands for r_j
        return max(0, j - 1 if j in local_only else j)

    ops: list[ModuleOp] = []
    for k, (layer, kind, mode) in enumerate(kinds, start=1):
        local = kind is ModuleKind.MLP and (k - 1) in local_only
        lag = 2 if mode.traits.reads_stale else 1
        allreduce = kind is ModuleKind.MLP or mode.traits.attention_allreduce
        ops.append(ModuleOp(k, layer, kind, mode, visible(k - lag), local, allreduce, False))
    return tuple(replace(op, overlaps_next=op.allreduce and op.k < len(ops) and ops[op.k].reads < op.k) for op in ops)


def spd_tp_for(spd: str | None, spd_tp: int | None, default: int | None = None, default_from: str = "") -> int:
    """``tp_degree_for`` of the ``--spd`` ranges alone."""
    return tp_degree_for({"spd": spd}, spd_tp, default, default_from)


def tp_degree_for(ranges: Mapping[str, str | None], spd_tp: int | None, default: int | None = None,
                  default_from: str = "") -> int:
    """The TP degree the TP-dependent layers of ``ranges`` (mode name to ``--<mode>`` ranges) are converted for:
    the one rule of every command taking ``--spd-tp``.

    A TP-dependent mode at TP 1 is exactly dense (SPD: one rank has nothing to drop), so with such layers the
    degree must be given (``--spd-tp``) or defaulted by the command (``default``, from ``default_from``, e.g.
    "--tp"; a sensitivity report's) and be at least 2. Without them it is ``spd_tp`` or ``default`` or 1.
    """
    wanted = [name for name, spec in ranges.items() if name in MODE_TRAITS and MODE_TRAITS[name].tp_dependent
              and spec is not None and str(spec).strip().lower() not in ("", "none")]
    chosen = spd_tp if spd_tp is not None else default
    if not wanted:
        return chosen or 1
    name = wanted[0]
    if chosen is None:
        raise LayoutError(f"--{name} needs --spd-tp N, the tensor-parallel degree the {name.upper()} layers will run at "
                          f"({name.upper()} at TP 1 is exactly dense)")
    if chosen < 2:
        given = "--spd-tp" if spd_tp is not None else (default_from or "the default")
        raise LayoutError(f"--{name} at TP {chosen} ({given}) is exactly dense: one rank has no all-reduce to drop; "
                          "give --spd-tp with the TP degree the model will run at (2 or more)")
    return int(chosen)


def mode_flags(separator: str = "/") -> str:
    """The converted modes' ``--<mode>`` options, joined: ``"--ladder/--spd"``."""
    return separator.join(f"--{mode.value}" for mode in LayerMode.converted_modes())


def parse_layer_ranges(spec: str | None, num_layers: int) -> list[int]:
    """Parse ``"16:32"``, ``"-8:"``, ``"0:4,10"``, ``"all"`` or ``"none"`` into sorted layer indices.

    Slices are half-open and 0-based, like Python's. A bare integer selects one layer.
    Raises ``LayoutError`` on syntax errors and on indices outside ``[0, num_layers)``.
    """
    text = (spec or "none").strip().lower()
    if text in ("", "none"):
        return []
    if text == "all":
        return list(range(num_layers))
    chosen: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            raise LayoutError(f"empty item in layer ranges {spec!r}")
        try:
            if ":" in part:
                start_text, _, stop_text = part.partition(":")
                if ":" in stop_text:
                    raise ValueError
                start = int(start_text) if start_text.strip() else 0
                stop = int(stop_text) if stop_text.strip() else num_layers
            else:
                start = int(part)
                stop = start + 1 if start >= 0 else (start + 1 or num_layers)
        except ValueError:
            raise LayoutError(
                f"cannot parse layer range {part!r}: use half-open slices like '16:32', '-8:', a layer index, 'all' or 'none'"
            ) from None
        for bound in (start, stop):
            if not -num_layers <= bound <= num_layers:
                raise LayoutError(
                    f"layer range {part!r} is outside the model's {num_layers} layers (valid indices 0..{num_layers - 1})"
                )
        start, stop = start % num_layers if start < 0 else start, stop % num_layers if stop < 0 else stop
        if start >= stop:
            raise LayoutError(f"layer range {part!r} selects no layers of the model's {num_layers}")
        chosen.update(range(start, stop))
    return sorted(chosen)


def format_layer_ranges(layers: Iterable[int]) -> str:
    """Inverse of ``parse_layer_ranges``: ``[15, 16, 17, 20]`` -> ``"15:18,20:21"``."""
    ordered = sorted(set(layers))
    if not ordered:
        return "none"
    runs: list[str] = []
    start = prev = ordered[0]
    for index in ordered[1:] + [None]:
        if index is not None and index == prev + 1:
            prev = index
            continue
        runs.append(f"{start}:{prev + 1}")
        if index is not None:
            start = prev = index
    return ",".join(runs)


def described_layers(description: str) -> dict[str, list[int]] | None:
    """The converted layers per mode of a ``Layout.describe()`` text (``"ladder 22:30 + spd@tp3 0:4"``;
    ``"dense"`` has none), or ``None`` when the text is not one. Records that keep only the description use it."""
    text = description.strip()
    if text == "dense":
        return {}
    layers: dict[str, list[int]] = {}
    for part in text.split(" + "):
        mode, _, spec = part.strip().partition(" ")
        name = mode.split("@", 1)[0]
        if name not in {mode.value for mode in LayerMode.converted_modes()} or not spec:
            return None
        try:
            stop = max(int(item.partition(":")[2] or item) for item in spec.split(","))
            layers[name] = parse_layer_ranges(spec, stop)
        except (ValueError, LayoutError):
            return None
    return layers


@dataclass(frozen=True)
class Layout:
    """The mode of every decoder layer, plus the TP degree SPD layers were converted for.

    ``spd_head_order[i]`` (optional) is a permutation of layer i's key/value heads: rank r
    of an SPD layer owns the KV heads ``order[r*K/N:(r+1)*K/N]`` and their query heads.
    """

    modes: tuple[LayerMode, ...]
    spd_tp_size: int = 1
    spd_head_order: tuple[tuple[int, ...] | None, ...] | None = None

    @property
    def num_layers(self) -> int:
        return len(self.modes)

    @classmethod
    def dense(cls, num_layers: int) -> "Layout":
        return cls(tuple([LayerMode.DENSE] * num_layers))

    @classmethod
    def from_ranges(
        cls, num_layers: int, ladder: str | None = None, spd: str | None = None, spd_tp_size: int = 1
    ) -> "Layout":
        """Build a layout from range specs (see ``parse_layer_ranges``); the rest stays dense."""
        return cls.from_mode_ranges(num_layers, {"ladder": ladder, "spd": spd}, spd_tp_size)

    @classmethod
    def from_mode_ranges(cls, num_layers: int, ranges: Mapping[str, str | None], spd_tp_size: int = 1) -> "Layout":
        """Build a layout from a range spec per converted mode name (``{"ladder": "15:30"}``); the rest stays dense."""
        chosen: dict[LayerMode, set[int]] = {}
        for mode in LayerMode.converted_modes():
            layers = set(parse_layer_ranges(ranges.get(mode.value), num_layers))
            for other, taken in chosen.items():
                if layers & taken:
                    raise LayoutError(f"layers {format_layer_ranges(layers & taken)} are selected for both "
                                      f"{other.value} and {mode.value}; a layer has one mode")
            chosen[mode] = layers
        unknown = set(ranges) - {mode.value for mode in chosen}
        if unknown:
            raise LayoutError(f"unknown layer mode {sorted(unknown)[0]!r}: the converted modes are {', '.join(m.value for m in chosen)}")
        if spd_tp_size < 1:
            raise LayoutError(f"spd TP degree must be at least 1, got {spd_tp_size}")
        by_layer = {layer: mode for mode, layers in chosen.items() for layer in layers}
        return cls(tuple(by_layer.get(i, LayerMode.DENSE) for i in range(num_layers)), spd_tp_size=spd_tp_size)

    @classmethod
    def from_config(cls, config: Any) -> "Layout":
        """Read the layout stored on a (ladder_llama or plain) config; plain configs are all dense."""
        num_layers = int(config.num_hidden_layers)
        raw = getattr(config, "layer_modes", None) or ["dense"] * num_layers
        if len(raw) != num_layers:
            raise LayoutError(f"config lists {len(raw)} layer modes for {num_layers} layers")
        try:
            modes = tuple(LayerMode(m) for m in raw)
        except ValueError as exc:
            raise LayoutError(f"unknown layer mode in config: {exc}") from None
        order = getattr(config, "spd_head_order", None)
        head_order = tuple(tuple(o) if o is not None else None for o in order) if order else None
        return cls(modes, int(getattr(config, "spd_tp_size", 1) or 1), head_order)

    def config_fields(self) -> dict[str, Any]:
        """The config entries that store this layout."""
        return {
            "layer_modes": [m.value for m in self.modes],
            "spd_tp_size": self.spd_tp_size,
            "spd_head_order": [list(o) if o is not None else None for o in self.spd_head_order]
            if self.spd_head_order
            else None,
        }

    def layers(self, mode: LayerMode) -> list[int]:
        return [i for i, m in enumerate(self.modes) if m is mode]

    @property
    def converted_layers(self) -> list[int]:
        return [i for i, m in enumerate(self.modes) if m.is_converted]

    @property
    def tp_dependent_layers(self) -> list[int]:
        """Layers whose function depends on the TP degree they were converted for (``spd_tp_size``)."""
        return [i for i, m in enumerate(self.modes) if m.traits.tp_dependent]

    @property
    def head_split_layers(self) -> list[int]:
        """Layers split into ``spd_tp_size`` head groups: that degree must divide the heads, with no KV replication."""
        return [i for i, m in enumerate(self.modes) if m.traits.needs_head_split]

    def ranges(self) -> dict[str, str]:
        """Range spec of each converted mode, e.g. ``{"ladder": "15:30", "spd": "none"}``."""
        return {m.value: format_layer_ranges(self.layers(m)) for m in LayerMode.converted_modes()}

    def label(self, mode: LayerMode) -> str:
        """A mode's name in ``describe``: ``spd@tp3`` for a TP-dependent mode, else the name."""
        return f"{mode.value}@tp{self.spd_tp_size}" if mode.traits.tp_dependent else mode.value

    def describe(self) -> str:
        """Short human-readable name such as ``ladder 15:30 + spd@tp3 0:4`` or ``dense``."""
        parts = [f"{self.label(mode)} {format_layer_ranges(self.layers(mode))}"
                 for mode in LayerMode.converted_modes() if self.layers(mode)]
        return " + ".join(parts) or "dense"

    def program(self) -> tuple[ModuleOp, ...]:
        """The per-module program: what each module reads, and where its all-reduce goes."""
        return module_program(self.modes)

    def allreduces_per_token(self) -> dict[str, int]:
        """All-reduces per token per forward under TP: total, and how many can overlap the next module."""
        program = self.program()
        return {"total": sum(op.allreduce for op in program), "overlappable": sum(op.overlaps_next for op in program)}

    def head_order(self, layer: int, num_kv_heads: int) -> list[int]:
        """KV-head order of a layer (identity when none was recorded)."""
        order = self.spd_head_order[layer] if self.spd_head_order else None
        return list(order) if order is not None else list(range(num_kv_heads))

    def validate(self, num_attention_heads: int, num_key_value_heads: int, intermediate_size: int) -> None:
        """Check that SPD layers can be split over ``spd_tp_size`` ranks; raise ``LayoutError``."""
        if self.spd_head_order is not None and len(self.spd_head_order) != self.num_layers:
            raise LayoutError(f"spd_head_order has {len(self.spd_head_order)} entries for {self.num_layers} layers")
        for layer in range(self.num_layers):
            order = self.head_order(layer, num_key_value_heads)
            if sorted(order) != list(range(num_key_value_heads)):
                raise LayoutError(f"spd_head_order of layer {layer} is not a permutation of {num_key_value_heads} KV heads")
        if not self.head_split_layers:
            return
        check_tp_divides(self.spd_tp_size, num_attention_heads, num_key_value_heads, intermediate_size, what="SPD TP degree")


def check_tp_divides(
    tp: int,
    num_attention_heads: int,
    num_key_value_heads: int,
    intermediate_size: int,
    what: str = "TP degree",
    replicate_kv: bool = False,
) -> None:
    """Raise ``LayoutError`` unless ``tp`` divides the query heads, KV heads and MLP width.

    With ``replicate_kv`` a TP degree that is a multiple of the KV-head count is allowed too:
    each KV head is then replicated on ``tp / K`` ranks (as vLLM and gpt-fast do).
    """
    checks = [(num_attention_heads, "query heads"), (intermediate_size, "MLP intermediate size")]
    if not (replicate_kv and tp > num_key_value_heads and tp % num_key_value_heads == 0):
        checks.insert(1, (num_key_value_heads, "key/value heads"))
    for count, name in checks:
        if count % tp:
            more = " (nor is it a multiple of them, for KV-head replication)" if replicate_kv and name == "key/value heads" else ""
            raise LayoutError(f"{what} {tp} does not divide the model's {count} {name}{more}")


def kv_replicas(tp: int, num_key_value_heads: int) -> int:
    """On how many ranks each KV head lives: 1, or ``tp / K`` when ``tp`` exceeds the KV-head count."""
    return tp // num_key_value_heads if tp > num_key_value_heads else 1


def kv_heads_per_rank(tp: int, num_key_value_heads: int) -> int:
    """KV heads each rank holds (at least one: replicated when ``tp`` exceeds the KV-head count)."""
    return max(1, num_key_value_heads // tp)


def rank_kv_heads(order: Sequence[int], tp: int, rank: int) -> list[int]:
    """KV heads owned by ``rank`` when ``order`` is split into ``tp`` contiguous groups.

    When ``tp`` exceeds the number of KV heads, each head is replicated on ``tp / K``
    consecutive ranks, and rank r holds head ``order[r // (tp / K)]``.
    """
    replicas = kv_replicas(tp, len(order))
    if replicas > 1:
        return [order[rank // replicas]]
    per_rank = len(order) // tp
    return list(order[rank * per_rank : (rank + 1) * per_rank])


def rank_query_heads(
    kv_heads: Sequence[int], num_attention_heads: int, num_key_value_heads: int, tp: int = 1, rank: int = 0
) -> list[int]:
    """Query heads that attend with the given KV heads (GQA groups stay together).

    Under KV replication (``tp`` above the KV-head count) a rank holds its share of one group:
    the ``tp / K`` ranks that hold the same KV head split its query heads in order.
    """
    group = num_attention_heads // num_key_value_heads
    heads = [kv * group + j for kv in kv_heads for j in range(group)]
    replicas = kv_replicas(tp, num_key_value_heads)
    share = len(heads) // replicas
    return heads[(rank % replicas) * share : (rank % replicas + 1) * share]

