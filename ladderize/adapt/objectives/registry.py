"""The objectives' registry: each objective's name and traits (``Objective``), their weights' parsing, and the kd
target's settings. No torch: what plans and prices a run (``config``, ``cost``, ``sequential_schedule``) reads the
traits here, and the training (``losses.py``) implements each entry's loss (``implement``).

The built-in objectives:

- ``lm``: the student's next-token cross-entropy, over its logits;
- ``kd``: a divergence between the teacher's and the student's next-token distributions, over both heads (it reads
  the teacher's final residual stream);
- ``local``: each converted layer (or module) matched to the teacher's own update (it reads the teacher's states
  entering and leaving every converted layer; no head).

A new objective is one file: ``register(Objective(...))`` with its traits and its loss (docs/architecture.md,
"Adding an objective").
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Set
from dataclasses import dataclass, replace
from typing import Any

from ...errors import LadderizeError

LOCAL_INPUTS = ("teacher", "student", "stack")
JOINT_ONLY_INPUTS = frozenset({"stack"})  # the student's states with the graph kept: a whole stack, not one layer
DIVERGENCES = ("forward", "reverse")  # kd: KL(teacher || student), KL(student || teacher)
LOGIT_BLOCK_BYTES = 24 << 20  # float32 logits per block of tokens in blockwise_head_losses (below glibc's 32 MiB mmap ceiling)
LOGIT_BLOCK_BYTES_CUDA = 1 << 29  # on a GPU: 1,046 tokens a block at Llama 3's 128,256-token vocabulary


# what an objective reads of the teacher (``Objective.teacher``)
NO_TEACHER = "none"
TEACHER_FINAL = "final"  # its final residual stream: the teacher runs every layer
TEACHER_LAYERS = "layers"  # its states entering and leaving every converted layer: it runs up to the last converted one


@dataclass(frozen=True)
class Objective:
    """One objective, declared once: what it reads of the two models (its traits, which planning reads), and its loss
    (the callables, which the training calls; ``implement`` gives them to an entry declared without).

    ``teacher``: ``NO_TEACHER``, ``TEACHER_FINAL`` or ``TEACHER_LAYERS``. ``student_final``: it reads the student's
    final residual stream (the student runs every layer). ``head``: its loss is over the student's logits, one block of
    tokens at a time (``block_loss``: that block's summed loss and the count the sum divides by); the student's head
    runs. ``teacher_head``: it runs the teacher's LM head too. Any other objective gives ``loss``. ``pass_loss``: the
    loss computed along the student's own pass up to layer ``stop``, with the stream leaving it, or None where the
    objective's settings compute it apart (``loss``).
    """

    name: str
    teacher: str = NO_TEACHER
    student_final: bool = False
    head: bool = False
    teacher_head: bool = False
    # the callables take an ``objectives.LossInputs``: (inputs) -> loss; (inputs) -> (block loss, count); (inputs, stop)
    loss: Callable[[Any], Any] | None = None
    block_loss: Callable[[Any], tuple[Callable[..., Any], int]] | None = None
    pass_loss: Callable[[Any, int], Any] | None = None

    def __post_init__(self) -> None:
        if not self.name.isidentifier() or self.name != self.name.lower():
            raise LadderizeError(f"objective name {self.name!r}: lowercase letters, digits and underscores")
        if self.teacher not in (NO_TEACHER, TEACHER_FINAL, TEACHER_LAYERS):
            raise LadderizeError(f"objective {self.name}: teacher must be {NO_TEACHER}, {TEACHER_FINAL} or {TEACHER_LAYERS}")
        if self.teacher_head and self.teacher != TEACHER_FINAL:
            raise LadderizeError(f"objective {self.name}: the teacher's head reads its final stream (teacher={TEACHER_FINAL})")
        if (self.loss is not None or self.block_loss is not None) and not self.implemented:  # a loss of the other kind
            raise LadderizeError(f"objective {self.name}: give {'block_loss' if self.head else 'loss'}")

    @property
    def implemented(self) -> bool:
        """Whether the entry has the loss its traits call for (``block_loss`` for a head objective, else ``loss``)."""
        return (self.block_loss if self.head else self.loss) is not None

    @property
    def needs_teacher(self) -> bool:
        return self.teacher != NO_TEACHER

    @property
    def reads_final(self) -> bool:
        """Whether the student runs every layer for it."""
        return self.student_final or self.head

    @property
    def reads_stored_teacher(self) -> bool:
        """Whether the teacher states a sequential stage stores (``teacher_states.py``: its states entering the first
        converted layer and its final stream) are all it needs of the teacher."""
        return self.teacher != TEACHER_LAYERS


OBJECTIVES: dict[str, Objective] = {}  # the objectives by name, in the order their losses sum; ``register`` adds one


def register(objective: Objective) -> Objective:
    """Add ``objective`` to ``OBJECTIVES`` (a name taken by another entry is refused)."""
    if OBJECTIVES.get(objective.name, objective) is not objective:
        raise LadderizeError(f"objective {objective.name} is registered already")
    OBJECTIVES[objective.name] = objective
    return objective


def implement(name: str, **losses: Callable[..., Any]) -> Objective:
    """Give the entry ``name`` its loss callables (``loss``, ``block_loss``, ``pass_loss``): the training side implements
    what this registry declares."""
    objective = replace(OBJECTIVES[name], **losses)
    if not objective.implemented:
        raise LadderizeError(f"objective {name}: give {'block_loss' if objective.head else 'loss'}")
    OBJECTIVES[name] = objective
    return objective


def entries(weights: Iterable[str]) -> list[Objective]:
    """The entries of the objectives named in ``weights``, in ``OBJECTIVES``' order."""
    names = set(weights)
    return [objective for name, objective in OBJECTIVES.items() if name in names]


class ObjectiveNames(Set):
    """The names of the registered objectives with a trait, read from ``OBJECTIVES`` at each use (a set: ``<=``, ``&``)."""

    def __init__(self, trait: Callable[[Objective], bool]):
        self._trait = trait

    def __contains__(self, name: object) -> bool:
        return name in OBJECTIVES and self._trait(OBJECTIVES[name])

    def __iter__(self) -> Iterator[str]:
        return (name for name, objective in OBJECTIVES.items() if self._trait(objective))

    def __len__(self) -> int:
        return sum(1 for _ in self)

    @classmethod
    def _from_iterable(cls, names: Iterable[str]) -> frozenset[str]:
        return frozenset(names)


TEACHER_OBJECTIVES = ObjectiveNames(lambda objective: objective.needs_teacher)
STORED_TEACHER_OBJECTIVES = ObjectiveNames(lambda objective: objective.reads_stored_teacher)


def parse_objectives(spec: str) -> dict[str, float]:
    """``"local"``, ``"lm,kd"`` or ``"kd=1,local=0.5"`` -> ``{name: weight}``."""
    weights: dict[str, float] = {}
    for part in (spec or "").split(","):
        part = part.strip()
        if not part:
            continue
        name, _, weight_text = part.partition("=")
        name = name.strip().lower()
        if name not in OBJECTIVES:
            raise LadderizeError(f"unknown objective {name!r}; choose from {', '.join(OBJECTIVES)} (comma-separated)")
        try:
            weight = float(weight_text) if weight_text else 1.0
        except ValueError:
            raise LadderizeError(f"objective weight {weight_text!r} of {name} is not a number") from None
        if weight < 0:
            raise LadderizeError(f"objective weight of {name} must not be negative")
        weights[name] = weight
    if not weights:
        raise LadderizeError(f"no objective given; use {', '.join(OBJECTIVES)} (comma-separated)")
    return weights


def check_top_k(top_k: int, divergence: str) -> None:
    """``kd_top_k``: 0 (the whole vocabulary) or a positive count, with the forward divergence only."""
    if top_k < 0:
        raise LadderizeError(f"kd_top_k must be 0 (the whole vocabulary) or a positive number of tokens, got {top_k}")
    if top_k and divergence != "forward":
        raise LadderizeError("kd_top_k keeps the teacher's likeliest tokens as the target of KL(teacher || student); "
                             "it does not apply to the reverse divergence")


def logit_block_rows(vocab: int, device: str = "cpu") -> int:
    """Tokens per block in ``blockwise_head_losses``: ``LOGIT_BLOCK_BYTES`` of float32 logits
    (``LOGIT_BLOCK_BYTES_CUDA`` on a GPU, where a block is one matmul of the head and a thin one leaves the tensor cores
    idle), at least 16."""
    budget = LOGIT_BLOCK_BYTES_CUDA if device == "cuda" else LOGIT_BLOCK_BYTES
    return max(16, budget // (4 * vocab))


register(Objective("lm", head=True))
register(Objective("kd", teacher=TEACHER_FINAL, head=True, teacher_head=True))
register(Objective("local", teacher=TEACHER_LAYERS))
