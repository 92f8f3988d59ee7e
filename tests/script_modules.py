"""A module of ``benchmarks/`` or ``lab/`` (folders of scripts, not packages) loaded from its file, for the tests of
the pieces those scripts share (``benchmarks/published_figures.py``, ``benchmarks/teacher_agreement.py``)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def script_module(folder: str, name: str) -> ModuleType:
    """``ROOT/folder/name.py`` as the module ``name`` (registered in ``sys.modules``, as dataclasses need)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
