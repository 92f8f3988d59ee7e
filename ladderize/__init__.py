"""ladderize: convert, adapt, evaluate and benchmark Ladder Residual / Sync-Point-Drop Llama models.

``import ladderize`` is cheap (it imports neither torch nor transformers, so the command line
answers ``--help`` at once) and still registers the ``ladder_llama`` model type with
transformers' ``AutoConfig`` / ``AutoModelForCausalLM``: at once if transformers' auto classes
are already loaded, else right after they are first imported.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys

from .model.auto_classes import is_registered, register_auto_classes
from .version import __version__

_AUTO_PACKAGE = "transformers.models.auto"
_MODEL_NAMES = ("LadderLlamaConfig", "LadderLlamaForCausalLM", "LayerMode", "Layout", "LayoutError")


class _RegisterAfterAutoImport(importlib.abc.MetaPathFinder):
    """Registers once ``transformers.models.auto`` is loaded and no transformers or ladderize module is mid-import.

    Registering imports ladderize's modeling code, which needs ``transformers.modeling_utils``
    (and ``ladderize.model``) complete; transformers imports its auto package from inside other
    modules' imports, so the registration waits until the outermost such import has finished.
    """

    def __init__(self):
        self.depth = 0

    def find_spec(self, name, path, target=None):
        if not name.startswith(("transformers.", "ladderize.")) and name != "transformers":
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
            self.depth += 1
            try:
                loader_exec(module)
            finally:
                self.depth -= 1
            if self.depth == 0 and _AUTO_PACKAGE in sys.modules and not is_registered():
                if self in sys.meta_path:
                    sys.meta_path.remove(self)
                register_auto_classes()

        spec.loader.exec_module = exec_module
        return spec


if _AUTO_PACKAGE in sys.modules:
    register_auto_classes()
elif not any(type(finder).__name__ == "_RegisterAfterAutoImport" for finder in sys.meta_path):
    sys.meta_path.insert(0, _RegisterAfterAutoImport())


def __getattr__(name: str):
    if name in _MODEL_NAMES:
        from . import model

        return getattr(model, name)
    raise AttributeError(f"module 'ladderize' has no attribute {name!r}")


__all__ = ["LadderLlamaConfig", "LadderLlamaForCausalLM", "LayerMode", "Layout", "LayoutError", "__version__", "register_auto_classes"]
