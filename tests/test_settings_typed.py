"""A setting is read from a typed ``AdaptConfig`` (``config.stage_config``, ``PlannedStage.resolved``), never as the
class's default beside a dict: no ``settings.get("x", AdaptConfig.x)``, ``settings.get("x") or AdaptConfig.x`` nor
``getattr(AdaptConfig, key)`` anywhere in ladderize."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "ladderize"
CONFIG = PACKAGE / "adapt" / "config.py"


def setting_names(config: Path = CONFIG) -> set[str]:
    """The fields of ``AdaptConfig``, read from its source."""
    tree = ast.parse(config.read_text(), str(config))
    cls = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "AdaptConfig")
    return {node.target.id for node in cls.body if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)}


def default_reads(source: str, names: set[str], where: str = "<source>") -> list[int]:
    """The lines of ``source`` that read a setting as ``AdaptConfig``'s class default: ``AdaptConfig.<field>``, or
    ``getattr(AdaptConfig, ...)``."""
    lines = []
    for node in ast.walk(ast.parse(source, where)):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "AdaptConfig"
                and node.attr in names):
            lines.append(node.lineno)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr" and node.args
              and isinstance(node.args[0], ast.Name) and node.args[0].id == "AdaptConfig"):
            lines.append(node.lineno)
    return sorted(lines)


def test_the_scan_finds_each_form():
    names = {"batch_size", "device"}
    source = ('a = step.get("batch_size", AdaptConfig.batch_size)\n'
              'b = step.get("device") or AdaptConfig.device\n'
              'c = getattr(AdaptConfig, key)\n'
              'd = stage_config(step).batch_size\n'
              'e = AdaptConfig(checkpoint="", out="").fingerprint()\n')
    assert default_reads(source, names) == [1, 2, 3]


def test_no_setting_is_read_as_a_class_default():
    names = setting_names()
    assert {"batch_size", "seq_len", "device", "objectives"} <= names
    found = [f"{file.relative_to(PACKAGE.parent)}:{line}" for file in sorted(PACKAGE.rglob("*.py"))
             for line in default_reads(file.read_text(), names, str(file))]
    assert not found, ("settings read as AdaptConfig's class default (read them from config.stage_config(settings) or "
                       f"PlannedStage.resolved): {', '.join(found)}")
