"""Adaptation recipes as data: stage presets, named recipes, a recipe file or ``--stage`` parsed, and each stage's
resolved settings (run by ``recipe_run.py``, through the plan of ``adapt_plan.py``).

A recipe is a list of stages plus settings shared by all of them. A stage is a named preset
(``STAGES``) with optional overrides; the learning rate defaults per stage kind and layer
mode, as measured (docs/adapt.md). Precedence, lowest first: ``AdaptConfig`` defaults, the
stage preset, the shared settings (recipe file top level, or the command line's shared
flags), the stage's own settings.

Command line (``ladderize adapt CKPT OUT``):

    (no stage flag)                         the built-in recipe ``best``
    --recipe best|seq-local|FILE.yaml       a built-in recipe or a recipe file
    --stage seq-local:tokens=65536,epochs=2 --stage kd:tokens=32768,lr=2e-4
                                            stages named on the command line, in order;
                                            ``objective=kd+local*0.5`` weights objectives

Recipe file (YAML, torchtune / axolotl style)::

    data: wikitext2-heldout        # shared settings: AdaptConfig field names
    seq_len: 512
    stages:
      - seq-local                  # a stage by name, with its preset
      - name: kd
        tokens: 32768
        lr: 2.0e-4
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ...errors import LadderizeError, one_line
from ...progress import counted
from .config import FLAT_FIELDS, AdaptConfig, GivenSettings
from .planned_stage import PlannedStage
from .settings_sections import OptimizerSettings

# Stage presets (AdaptConfig overrides): the settings of the measured best recipe (benchmarks/adapt_ladder.py:
# 512-token sequences, 2 per step; 2 warm-up steps for seq-local, 5 for kd, as in the measured kd pass).
STAGES: dict[str, dict[str, Any]] = {
    "seq-local": {"objectives": "local", "local_schedule": "sequential", "tokens": 65_536, "epochs": 2.0, "batch_size": 2,
                  "warmup_steps": 2},
    "kd": {"objectives": "kd", "tokens": 32_768, "batch_size": 2, "warmup_steps": 5},
    "local": {"objectives": "local", "local_schedule": "joint", "tokens": 131_072},
    "lm": {"objectives": "lm", "tokens": 131_072},
}
RECIPES: dict[str, list[str]] = {
    # sequential local 65,536 x 2, then kd 32,768: 96.0% of the ladder 15-29 gap (docs/adapt-measurements.md)
    "best": ["seq-local", "kd"],
    "seq-local": ["seq-local"],
    "kd": ["kd"],
}
DEFAULT_RECIPE = "best"
ALIASES = {"objective": "objectives", "schedule": "local_schedule", "inputs": "local_inputs", "top_k": "kd_top_k"}
# settings a recipe may not set (they name the run, not a stage)
_RESERVED = {"checkpoint", "out", "run_dir", "force", "keep_state", "recipe"}


@dataclass(frozen=True)
class Stage:
    """A recipe's stage as written: its preset's name and its own settings (given by flat name, a ``dict``, they are
    read as a recipe file's are)."""

    name: str
    settings: GivenSettings = field(default_factory=GivenSettings)

    def __post_init__(self) -> None:
        if not isinstance(self.settings, GivenSettings):
            object.__setattr__(self, "settings", _given(self.settings, f"stage {self.name}"))


@dataclass(frozen=True)
class Recipe:
    """A recipe as written: its name, its stages, and the settings they share (a ``dict`` of flat names is read as a
    recipe file's top level is)."""

    name: str
    stages: list[Stage]
    shared: GivenSettings = field(default_factory=GivenSettings)

    def __post_init__(self) -> None:
        if not isinstance(self.shared, GivenSettings):
            object.__setattr__(self, "shared", _given(self.shared, f"recipe {self.name}"))

    def with_stage(self, index: int, **settings: Any) -> "Recipe":
        """This recipe with stage ``index``'s own settings ``settings`` (flat names) given over its own."""
        stages = list(self.stages)
        stage = stages[index]
        stages[index] = replace(stage, settings=_given(settings, f"stage {stage.name}").over(stage.settings))
        return replace(self, stages=stages)


def _given(settings: dict[str, Any], where: str) -> GivenSettings:
    return GivenSettings.of(dict(_coerce(k, v, where) for k, v in settings.items()))


def _coerce(key: str, value: Any, where: str) -> tuple[str, Any]:
    key = ALIASES.get(key.replace("-", "_"), key.replace("-", "_"))
    if key not in FLAT_FIELDS or key in _RESERVED:
        known = sorted(k for k in FLAT_FIELDS if k not in _RESERVED)
        raise LadderizeError(f"{where}: unknown setting {key!r}; settings are {', '.join(known)}")
    kind = str(FLAT_FIELDS[key].type)
    try:
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            return key, None
        if kind.startswith("int"):
            return key, int(value)
        if kind.startswith("float"):
            return key, float(value)
        if kind.startswith("bool"):
            if isinstance(value, str):
                if value.lower() not in ("true", "false", "yes", "no", "1", "0"):
                    raise ValueError(value)
                return key, value.lower() in ("true", "yes", "1")
            return key, bool(value)
    except (TypeError, ValueError):
        raise LadderizeError(f"{where}: {key} must be {kind.split(' ')[0]}, got {value!r}") from None
    if key == "objectives" and isinstance(value, str):
        value = value.replace("+", ",").replace("*", "=")  # command-line form kd+local*0.5
    return key, str(value)


def _stage(name: str, settings: dict[str, Any], where: str) -> Stage:
    if name not in STAGES:
        raise LadderizeError(f"{where}: unknown stage {name!r}; stages are {', '.join(STAGES)}")
    return Stage(name, _given(settings, f"{where} stage {name}"))


def parse_stage(spec: str) -> Stage:
    """``NAME[:key=value,key=value]`` (the ``--stage`` form)."""
    name, _, rest = spec.strip().partition(":")
    settings = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq:
            raise LadderizeError(f"--stage {spec}: expected key=value, got {item!r} (e.g. --stage kd:tokens=32768,lr=2e-4)")
        settings[key.strip()] = value.strip()
    return _stage(name.strip(), settings, f"--stage {spec}")


def load_recipe(spec: str) -> Recipe:
    """A built-in recipe by name, or a YAML recipe file."""
    if spec in RECIPES:
        return Recipe(spec, [Stage(name) for name in RECIPES[spec]])
    path = Path(spec).expanduser()
    if not path.is_file():
        raise LadderizeError(f"unknown recipe {spec!r}: give a built-in recipe ({', '.join(RECIPES)}) or a YAML recipe file")
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" at line {where.line + 1}, column {where.column + 1}" if where is not None else ""
        problem = getattr(exc, "problem", None) or one_line(exc)
        raise LadderizeError(f"recipe {path} does not parse as YAML{line}: {problem}") from None
    if not isinstance(data, dict) or not isinstance(data.get("stages"), list) or not data["stages"]:
        raise LadderizeError(f"recipe {path} must be a mapping with a non-empty 'stages' list (see docs/adapt.md)")
    stages = []
    for number, item in enumerate(data["stages"], 1):
        if isinstance(item, str):
            stages.append(parse_stage(item))
        elif isinstance(item, dict) and isinstance(item.get("name"), str):
            stages.append(_stage(item["name"], {k: v for k, v in item.items() if k != "name"}, f"recipe {path}"))
        else:
            raise LadderizeError(f"recipe {path}: stage {number} must be a stage name or a mapping with 'name'")
    return Recipe(str(path), stages, _given({k: v for k, v in data.items() if k != "stages"}, f"recipe {path}"))


def converted_modes(checkpoint: str) -> set[str]:
    """The modes of the converted layers of ``checkpoint`` (read from its config without torch, no weights)."""
    from ...checkpoint.architectures import read_config_header

    layout = read_config_header(checkpoint).layout
    return {layout.modes[i].value for i in layout.converted_layers}


def stage_kind(config: AdaptConfig) -> str:
    """The kind of stage ``config`` makes (``sequential``, ``kd`` or ``joint``), for its measured rate."""
    if config.sequential.runs:
        return "sequential"
    return "kd" if config.objective.objectives == "kd" else "joint"


def measured_lr(config: AdaptConfig, modes: set[str]) -> float:
    """The measured peak learning rate for this stage kind and these converted-layer modes: the smallest of the
    modes' own rates (``ModeTraits.learning_rates``, the mode table's), else ``learning_rates_fallback``'s."""
    from ...model.layout import LayerMode, learning_rates_fallback

    kind = stage_kind(config)
    own = [rates[kind] for rates in (LayerMode(mode).traits.learning_rates for mode in modes) if kind in rates]
    return min(own, default=learning_rates_fallback()[kind])


def with_measured_lr(settings: GivenSettings, modes: set[str]) -> GivenSettings:
    """``settings`` with the measured learning rate (``measured_lr``) where they give none."""
    if settings.sets("lr") and settings.config.optimizer.lr is not None:
        return settings
    lr = measured_lr(settings.config, modes)
    return GivenSettings(settings.config.with_fields(OptimizerSettings, lr=lr), settings.names).including("lr")


def resolve_stages(recipe: Recipe, checkpoint: str, shared: GivenSettings = GivenSettings()) -> list[PlannedStage]:
    """Every stage as it will train: its preset, the recipe's shared settings, ``shared`` (the command line's) and its
    own, in that order, with ``lr`` filled in per layer mode."""
    modes = converted_modes(checkpoint) if Path(checkpoint).is_dir() else set()
    stages = []
    for number, stage in enumerate(recipe.stages, 1):
        settings = stage.settings.over(shared.over(recipe.shared.over(GivenSettings.of(STAGES[stage.name]))))
        if number > 1:
            settings = settings.without("head_grouping")  # once, before the first stage
        stages.append(PlannedStage.of(number, stage.name, with_measured_lr(settings, modes)))
    return stages


def describe(stage: PlannedStage) -> str:
    """One line: the stage as a plan prints it (the settings it sets beyond its size, by name)."""
    config = stage.resolved
    kind = config.sequential.local_schedule
    tokens = counted(stage.tokens, "token") + (f" x {counted(config.sequential.epochs, 'epoch')}" if kind == "sequential" else "")
    keys = ("train", "data", "local_inputs", "kd_divergence", "kd_temperature", "kd_top_k", "interpolate", "ema") + (("states", "stream_layers", "closed_form", "epochs_ramp", "window") if kind == "sequential" else ())
    flat = config.flat()
    extra = "".join(f", {k} {flat[k]}" for k in keys if stage.sets(k))
    return (f"{stage.number}. {stage.name}: {config.objective.objectives} ({kind}), {tokens}, lr {config.optimizer.lr:g}, "
            f"batch {config.training.batch_size}{extra}")


SINGLE_STAGE_FLAGS = {"objectives": "--objective", "local_schedule": "--local-schedule", "local_inputs": "--local-inputs"}
SINGLE_STAGE_SETTINGS = ("objectives", "train", "tokens", "lr", "local_inputs", "local_schedule", "epochs")


def given_settings(options: dict[str, Any]) -> tuple[GivenSettings, GivenSettings]:
    """The settings a request's names give (``None``: not given): those every stage shares, with the device (``auto``
    unless given), and a single stage's own (``SINGLE_STAGE_SETTINGS``). An unknown name is refused in one line."""
    given = {name: value for name, value in options.items() if value is not None}
    shared = {name: value for name, value in given.items() if name not in SINGLE_STAGE_SETTINGS}
    single = {name: value for name, value in given.items() if name in SINGLE_STAGE_SETTINGS}
    return GivenSettings.of({**shared, "device": shared.get("device", "auto")}), GivenSettings.of(single)


def chosen_recipe(recipe: str | Recipe | None, stages: list[str] | None) -> Recipe:
    """The stages named on the command line, else the recipe named (the default one without a name)."""
    if isinstance(recipe, Recipe):
        return recipe
    return Recipe("command line", [parse_stage(s) for s in stages]) if stages else load_recipe(recipe or DEFAULT_RECIPE)
