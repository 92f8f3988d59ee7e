"""One stage of a recipe as it will train, typed: what every planning and training function takes below
``stages.resolve_stages`` (which lays a stage's given settings over its preset and the shared ones).

Its settings are read through the typed sections (``stage.resolved.training.tokens``); a change makes a new stage
(``with_fields``, one section at a time); ``step`` is the dict ``recipe.json`` and the provenance record of it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .config import AdaptConfig, GivenSettings
from .settings_sections import ObjectiveSettings, SavingSettings, ScopeSettings


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
    def of(cls, number: int, name: str, settings: GivenSettings) -> "PlannedStage":
        """The stage that sets ``settings``."""
        return cls(number, name, settings.config, settings.names)

    @property
    def settings(self) -> dict[str, Any]:
        """The settings the stage sets, by flat name."""
        return GivenSettings(self.resolved, self.given).record()

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
        """The stage of a ``step`` dict (a ``recipe.json``'s record of it)."""
        settings = GivenSettings.of({k: v for k, v in step.items() if k not in ("stage", "name")})
        return cls.of(int(step["stage"]), str(step["name"]), settings)

    def with_fields(self, section: type, **values: Any) -> "PlannedStage":
        """This stage with ``values`` set in its section of type ``section`` (``AdaptConfig.with_fields``): a new
        stage, which sets those it changes (a name it set keeps its place in ``step``)."""
        resolved = self.resolved.with_fields(section, **values)
        changed = resolved.changed_from(self.resolved)
        return PlannedStage(self.number, self.name, resolved, self.given + tuple(n for n in changed if n not in self.given))

    def config(self, checkpoint: str, out: str, *, run_dir: str | None = None, force: bool = False,
               keep_state: bool = False, recipe: dict[str, Any] | None = None, teacher_states: str | None = None,
               teacher_state_rows: int | None = None) -> AdaptConfig:
        """The stage's ``AdaptConfig`` for input ``checkpoint`` and output ``out``, with the run's own settings: its
        run folder, ``force``, ``keep_state``, the provenance ``recipe``, and where the teacher's states are kept."""
        return (self.resolved.with_fields(ScopeSettings, checkpoint=checkpoint)
                .with_fields(SavingSettings, out=out, run_dir=run_dir, force=force, keep_state=keep_state, recipe=recipe)
                .with_fields(ObjectiveSettings, teacher_states=teacher_states, teacher_state_rows=teacher_state_rows))
