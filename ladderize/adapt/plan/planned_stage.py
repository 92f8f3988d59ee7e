"""One stage of a recipe as it will train, typed: what every planning and training function takes below
``stages.resolve_stages`` (which builds the flat dicts from presets, ``--stage`` and recipe files: the edges).

Its settings are read through the typed sections (``stage.resolved.training.tokens``); a change makes a new stage
(``with_settings``); ``step`` is the dict ``recipe.json`` and the provenance record of it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .config import AdaptConfig


@dataclass(frozen=True)
class PlannedStage:
    """One stage as it will train: its number in the recipe, its preset's name, its settings typed (``resolved``: the
    preset, the shared settings and its own, with the learning rate filled in, over the sections' defaults), which
    every read of a setting goes through, and the flat names it sets (``given``: what ``recipe.json`` and the
    provenance record of it)."""

    number: int
    name: str
    resolved: AdaptConfig
    given: tuple[str, ...] = ()

    @classmethod
    def of(cls, number: int, name: str, settings: Mapping[str, Any]) -> "PlannedStage":
        """The stage that sets ``settings`` (flat names)."""
        return cls(number, name, AdaptConfig.from_flat(settings), tuple(settings))

    @property
    def settings(self) -> dict[str, Any]:
        """The settings the stage sets, by flat name."""
        flat = self.resolved.flat()
        return {name: flat[name] for name in self.given}

    def sets(self, name: str) -> bool:
        """Whether the stage sets the setting ``name`` (flat name) itself, rather than taking its section's default."""
        return name in self.given

    @property
    def sequential(self) -> bool:
        return self.resolved.sequential.runs

    @property
    def tokens(self) -> int:
        return self.resolved.training.tokens

    @property
    def passes(self) -> float:
        """Training passes over each of its tokens: a sequential stage's epochs per layer, else 1."""
        return float(self.resolved.sequential.epochs) if self.sequential else 1.0

    @property
    def step(self) -> dict[str, Any]:
        """The stage as ``recipe.json`` and the provenance record it."""
        return {"stage": self.number, "name": self.name, **self.settings}

    @classmethod
    def from_step(cls, step: Mapping[str, Any]) -> "PlannedStage":
        """The stage of a ``step`` dict (``stages.resolve_stages``, a ``recipe.json``'s plan)."""
        return cls.of(int(step["stage"]), str(step["name"]), {k: v for k, v in step.items() if k not in ("stage", "name")})

    def with_settings(self, **names: Any) -> "PlannedStage":
        """This stage with the settings ``names`` (flat names) set: a new stage, which sets them (a name it set keeps
        its place in ``step``)."""
        given = self.given + tuple(name for name in names if name not in self.given)
        return PlannedStage(self.number, self.name, self.resolved.with_flat(**names), given)

    def config(self, checkpoint: str, out: str, **run: Any) -> AdaptConfig:
        """The stage's ``AdaptConfig`` for input ``checkpoint`` and output ``out`` (``run``: the run's own settings by
        flat name: ``run_dir``, ``force``, ``keep_state``, ``recipe``, ``teacher_states``)."""
        return self.resolved.with_flat(checkpoint=checkpoint, out=out, **run)
