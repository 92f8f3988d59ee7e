"""ladderize: convert, adapt, evaluate and benchmark Ladder Residual / Sync-Point-Drop Llama models.

``import ladderize`` is cheap (it imports neither torch nor transformers, so the command line
answers ``--help`` at once) and still registers the ``ladder_llama`` model type with
transformers' ``AutoConfig`` / ``AutoModel`` / ``AutoModelForCausalLM``: at once if transformers' auto classes
are already loaded, else right after they are first imported. It also gives ``ladder_llama`` Llama's
rows in peft's default target-module tables (``register_peft_targets``), at once or right after peft
loads them, so ``LoraConfig(task_type="CAUSAL_LM")`` without ``target_modules`` works as on Llama.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys

from .checkpoint.auto_classes import is_registered, register_auto_classes
from .version import __version__

_AUTO_PACKAGE = "transformers.models.auto"
_PEFT_TABLES = "peft.utils.constants"
_MODEL_TYPE = "ladder_llama"  # LadderLlamaConfig.model_type (not imported here: that needs transformers)
_MODEL_NAMES = ("LadderLlamaConfig", "LadderLlamaForCausalLM", "LayerMode", "Layout", "LayoutError")


def register_peft_targets() -> None:
    """Give ``ladder_llama`` Llama's entry in every default table of peft (target modules, IA3's
    feed-forward modules, ...): the modules and their names are Llama's. Idempotent; needs peft loaded."""
    tables = sys.modules.get(_PEFT_TABLES)
    if tables is None:
        return
    for table in vars(tables).values():
        if isinstance(table, dict) and "llama" in table:
            table.setdefault(_MODEL_TYPE, table["llama"])


class _ImportWatcher(importlib.abc.MetaPathFinder):
    """Runs code around the import of the modules it ``watches``: ``entered`` before a module executes,
    ``left`` after (even on error), ``done`` after a module executed without error. It finds nothing itself."""

    def watches(self, name: str) -> bool:
        raise NotImplementedError

    def entered(self) -> None:
        pass

    def left(self) -> None:
        pass

    def done(self) -> None:
        raise NotImplementedError

    def find_spec(self, name, path, target=None):
        if not self.watches(name):
            return None
        spec = None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader_exec = spec.loader.exec_module

        def exec_module(module):
            self.entered()
            try:
                loader_exec(module)
            finally:
                self.left()
            self.done()

        spec.loader.exec_module = exec_module
        return spec

    def leave_meta_path(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)


class _PatchPeftTables(_ImportWatcher):
    """Calls ``register_peft_targets`` right after ``peft.utils.constants`` is executed, before peft's
    tuners copy any of its tables; then leaves ``sys.meta_path``."""

    def watches(self, name: str) -> bool:
        return name == _PEFT_TABLES

    def done(self) -> None:
        self.leave_meta_path()
        register_peft_targets()


class _RegisterAfterAutoImport(_ImportWatcher):
    """Registers once ``transformers.models.auto`` is loaded and no transformers or ladderize module is mid-import.

    Registering imports ladderize's modeling code, which needs ``transformers.modeling_utils``
    (and ``ladderize.model``) complete; transformers imports its auto package from inside other
    modules' imports, so the registration waits until the outermost such import has finished.
    """

    def __init__(self):
        self.depth = 0

    def watches(self, name: str) -> bool:
        return name.startswith(("transformers.", "ladderize.")) or name == "transformers"

    def entered(self) -> None:
        self.depth += 1

    def left(self) -> None:
        self.depth -= 1

    def done(self) -> None:
        if self.depth == 0 and _AUTO_PACKAGE in sys.modules and not is_registered():
            self.leave_meta_path()
            register_auto_classes()


if _AUTO_PACKAGE in sys.modules:
    register_auto_classes()
elif not any(type(finder).__name__ == "_RegisterAfterAutoImport" for finder in sys.meta_path):
    sys.meta_path.insert(0, _RegisterAfterAutoImport())

if _PEFT_TABLES in sys.modules:
    register_peft_targets()
elif not any(type(finder).__name__ == "_PatchPeftTables" for finder in sys.meta_path):
    sys.meta_path.insert(0, _PatchPeftTables())


def __getattr__(name: str):
    if name in _MODEL_NAMES:
        from . import model

        return getattr(model, name)
    raise AttributeError(f"module 'ladderize' has no attribute {name!r}")


__all__ = ["LadderLlamaConfig", "LadderLlamaForCausalLM", "LayerMode", "Layout", "LayoutError", "__version__", "register_auto_classes",
           "register_peft_targets"]
