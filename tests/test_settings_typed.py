"""A setting is read from a typed ``AdaptConfig`` (``PlannedStage.resolved``, ``GivenSettings.config``), never as a
class's default beside a dict: no ``settings.get("x", TrainingSettings.x)``, ``settings.get("x") or AdaptConfig.x`` nor
``getattr(AdaptConfig, key)`` anywhere in ladderize. ``AdaptConfig`` holds the typed sections and nothing else."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "ladderize"
CONFIG = PACKAGE / "adapt" / "plan" / "config.py"
SECTIONS = PACKAGE / "adapt" / "plan" / "settings_sections.py"


def class_fields(source: Path, name: str) -> set[str]:
    """The annotated fields of class ``name`` in ``source``."""
    tree = ast.parse(source.read_text(), str(source))
    cls = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == name)
    return {node.target.id for node in cls.body if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)}


def section_classes(sections: Path = SECTIONS) -> set[str]:
    """The section classes of ``settings_sections.py`` (``*Settings``)."""
    tree = ast.parse(sections.read_text(), str(sections))
    return {node.name for node in tree.body if isinstance(node, ast.ClassDef) and node.name.endswith("Settings")}


def setting_names(sections: Path = SECTIONS) -> set[str]:
    """Every setting's flat name: the fields of the sections, read from their source."""
    return {name for cls in section_classes(sections) for name in class_fields(sections, cls)}


def default_reads(source: str, names: set[str], where: str = "<source>") -> list[int]:
    """The lines of ``source`` that read a setting as a class default: ``AdaptConfig.<field>`` or
    ``<Section>Settings.<field>``, or ``getattr`` of one of those classes."""
    owners = {"AdaptConfig", *section_classes()}
    lines = []
    for node in ast.walk(ast.parse(source, where)):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in owners
                and node.attr in names):
            lines.append(node.lineno)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr" and node.args
              and isinstance(node.args[0], ast.Name) and node.args[0].id in owners):
            lines.append(node.lineno)
    return sorted(lines)


def test_the_scan_finds_each_form():
    names = {"batch_size", "device"}
    source = ('a = step.get("batch_size", AdaptConfig.batch_size)\n'
              'b = step.get("device") or AdaptConfig.device\n'
              'c = getattr(AdaptConfig, key)\n'
              'd = stage_config(step).batch_size\n'
              'e = AdaptConfig.from_flat(checkpoint="", out="").fingerprint()\n')
    assert default_reads(source, names) == [1, 2, 3]
    assert default_reads('f = TrainingSettings.batch_size\ng = getattr(ParallelismSettings, key)\n', names) == [1, 2]


def test_no_setting_is_read_as_a_class_default():
    names = setting_names()
    assert {"batch_size", "seq_len", "device", "objectives"} <= names
    found = [f"{file.relative_to(PACKAGE.parent)}:{line}" for file in sorted(PACKAGE.rglob("*.py"))
             for line in default_reads(file.read_text(), names, str(file))]
    assert not found, ("settings read as AdaptConfig's class default (read them from GivenSettings.config or "
                       f"PlannedStage.resolved): {', '.join(found)}")


def test_adapt_config_holds_the_sections_only():
    sections = {name for name in class_fields(CONFIG, "AdaptConfig")}
    assert sections == {"objective", "scope", "sequential", "training", "saving", "parallelism", "optimizer"}
    assert not sections & setting_names()


STAGE_NAMES = {"step", "steps", "stage", "stages"}
TYPED_PACKAGES = ("plan", "train", "sequential")
EDGES = {"from_step"}  # PlannedStage.from_step: the typed stage of a dict (resolve_stages', a recipe.json's record)


def _is_settings_dict(annotation: ast.expr | None) -> bool:
    """Whether ``annotation`` is ``dict[str, Any]`` or ``list[dict[str, Any]]`` (``| None`` and quoted forms too)."""
    if annotation is None:
        return False
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        return _is_settings_dict(ast.parse(annotation.value, mode="eval").body)
    if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
        return _is_settings_dict(annotation.left) or _is_settings_dict(annotation.right)
    if not isinstance(annotation, ast.Subscript) or not isinstance(annotation.value, ast.Name):
        return False
    if annotation.value.id in ("list", "Sequence", "tuple"):
        return _is_settings_dict(annotation.slice)
    return (annotation.value.id in ("dict", "Mapping") and isinstance(annotation.slice, ast.Tuple)
            and [ast.unparse(e) for e in annotation.slice.elts] == ["str", "Any"])


def dict_stage_parameters(source: str, where: str = "<source>") -> list[str]:
    """The parameters of every function in ``source`` named like a stage (``STAGE_NAMES``) and annotated as a
    settings dict or a list of them: ``function(parameter):line``."""
    found = []
    for node in ast.walk(ast.parse(source, where)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            arguments = node.args
            for argument in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]:
                if (argument.arg in STAGE_NAMES and _is_settings_dict(argument.annotation)
                        and getattr(node, "name", None) not in EDGES):
                    found.append(f"{getattr(node, 'name', 'lambda')}({argument.arg}):{node.lineno}")
    return found


def test_the_stage_scan_finds_each_form():
    source = ("def a(step: dict[str, Any]) -> None: ...\n"
              "def b(x, steps: list[dict[str, Any]], *, stage: 'dict[str, Any] | None' = None): ...\n"
              "def c(stages: Sequence[Mapping[str, Any]]): ...\n"
              "def d(record: dict[str, Any], stage: PlannedStage, steps: Sequence[PlannedStage]): ...\n"
              "def e(stage: dict[str, int]): ...\n")
    assert dict_stage_parameters(source) == ["a(step):1", "b(steps):2", "b(stage):2", "c(stages):3"]


def test_no_stage_below_the_recipe_is_a_dict():
    """Below ``stages.resolve_stages`` a recipe's stages are typed (``PlannedStage``, read through its sections): no
    function of adapt/plan, train or sequential takes a stage as a dict of settings."""
    found = [f"{file.relative_to(PACKAGE.parent)}: {where}"
             for package in TYPED_PACKAGES for file in sorted((PACKAGE / "adapt" / package).rglob("*.py"))
             for where in dict_stage_parameters(file.read_text(), str(file))]
    assert not found, f"stages taken as dicts (take PlannedStage, or Sequence[PlannedStage]): {', '.join(found)}"


def test_the_budget_is_parsed_once_at_the_edge():
    """``--budget`` text becomes a ``Budget`` in one place, the request (``AdaptRequest``): the CLI, the entrance and
    the plan read it typed, and a budget that is no budget is refused as the request is made."""
    import pytest

    from ladderize.adapt.plan.budget import Budget
    from ladderize.adapt.request import AdaptRequest
    from ladderize.errors import LadderizeError

    callers = [f"{file.relative_to(PACKAGE)}:{number}" for file in sorted(PACKAGE.rglob("*.py"))
               for number, line in enumerate(file.read_text().splitlines(), 1)
               if "parse_budget(" in line and "def parse_budget(" not in line]
    assert callers == ["adapt/request.py:" + callers[0].split(":")[1]] and len(callers) == 1, callers
    request = AdaptRequest.of("ckpt", "out", budget="30m")
    assert request.budget == Budget("30m", seconds=1800.0) and request.with_settings(budget="3B").budget.tokens == 3 * 10**9
    with pytest.raises(LadderizeError, match="--budget '30x'"):
        AdaptRequest.of("ckpt", "out", budget="30x")


def test_a_stage_changes_through_a_typed_section():
    """The plan changes a stage one section at a time (``with_fields``): a field the section has not is a TypeError,
    a section AdaptConfig has not too, and what changed is what the stage now sets (its ``recipe.json`` record)."""
    import pytest

    from ladderize.adapt.plan.config import AdaptConfig
    from ladderize.adapt.plan.planned_stage import PlannedStage
    from ladderize.adapt.plan.settings_sections import OptimizerSettings, TrainingSettings

    stage = PlannedStage(1, "kd", AdaptConfig().with_fields(OptimizerSettings, lr=2e-4), ("lr",))
    grown = stage.with_fields(TrainingSettings, batch_size=8, seq_len=512)  # 512: the default, unchanged
    assert grown.resolved.training.batch_size == 8 and grown.resolved.optimizer.lr == 2e-4
    assert grown.given == ("lr", "batch_size") and grown.step == {"stage": 1, "name": "kd", "lr": 2e-4, "batch_size": 8}
    assert stage.resolved.training.batch_size == 4  # the stage it came from is as it was
    with pytest.raises(TypeError):
        stage.with_fields(TrainingSettings, batch=8)
    with pytest.raises(TypeError, match="not a section"):
        stage.resolved.with_fields(dict, x=1)


FLAT_MARKS = ("from_flat", "with_flat", "FLAT_FIELDS", "ALIASES", "stage_config")
FLAT_HOMES = {"adapt/plan/config.py", "adapt/plan/stages.py"}  # the names' map to the sections, and the recipe parser


def flat_name_files(package: Path = PACKAGE) -> set[str]:
    """The modules of adapt, the command line and the demo that name a setting's flat-name machinery
    (``FLAT_MARKS``)."""
    found = set()
    for file in [*(package / "adapt").rglob("*.py"), *(package / "cli").rglob("*.py"), *(package / "demo").rglob("*.py")]:
        if any(mark in file.read_text() for mark in FLAT_MARKS):
            found.add(str(file.relative_to(package)))
    return found


def test_flat_setting_names_live_at_the_edge_only(tmp_path):
    """A setting's flat name is the edge's: the recipe parser (presets, recipe files, ``--stage``, the command line's
    names) and the map of names to sections (with the records a run keeps). Below, settings are typed sections, given
    ones as ``GivenSettings``, changed one section at a time."""
    (tmp_path / "adapt").mkdir()
    (tmp_path / "adapt" / "x.py").write_text("config = AdaptConfig.from_flat(lr=1)\n")
    assert flat_name_files(tmp_path) == {"adapt/x.py"}  # the scan finds a use
    assert flat_name_files() <= FLAT_HOMES, f"flat setting names below the edge: {sorted(flat_name_files() - FLAT_HOMES)}"


MOST_READERS = 6  # the files of adapt that may read one setting (``SECTION.FIELD``)


def field_readers(package: Path = PACKAGE) -> dict[str, list[str]]:
    """For every setting, the modules under ``adapt`` that read it as ``section.field`` (``config.training.seq_len``,
    ``training.seq_len``)."""
    import re
    from dataclasses import fields

    from ladderize.adapt.plan.config import AdaptConfig

    texts = {str(file.relative_to(package)): file.read_text() for file in (package / "adapt").rglob("*.py")}
    readers = {}
    for section in fields(AdaptConfig):
        for setting in fields(section.default_factory):
            pattern = re.compile(rf"\b{section.name}\.{setting.name}\b")
            readers[f"{section.name}.{setting.name}"] = sorted(name for name, text in texts.items() if pattern.search(text))
    return readers


def test_each_setting_is_read_in_few_places(tmp_path):
    """A setting's derived values are the section's own (``TrainingSettings.tokens_per_step``, ``.split``,
    ``.step_rows``, ``ParallelismSettings.placement``, ``ObjectiveSettings.teacher_for``), so each setting is read by
    at most ``MOST_READERS`` modules of adapt."""
    (tmp_path / "adapt").mkdir()
    for number in range(3):
        (tmp_path / "adapt" / f"m{number}.py").write_text("x = config.training.batch_size\n")
    assert field_readers(tmp_path)["training.batch_size"] == ["adapt/m0.py", "adapt/m1.py", "adapt/m2.py"]
    crowded = {name: files for name, files in field_readers().items() if len(files) > MOST_READERS}
    assert not crowded, f"settings read in more than {MOST_READERS} modules: {crowded}"
