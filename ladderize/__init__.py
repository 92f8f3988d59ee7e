"""ladderize: convert, adapt, evaluate and benchmark Ladder Residual / Sync-Point-Drop Llama models."""

from importlib.metadata import PackageNotFoundError, version

from transformers import AutoConfig, AutoModelForCausalLM

from .model import LadderLlamaConfig, LadderLlamaForCausalLM, LayerMode, Layout, LayoutError

try:
    __version__ = version("ladderize")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+unknown"

AutoConfig.register(LadderLlamaConfig.model_type, LadderLlamaConfig, exist_ok=True)
AutoModelForCausalLM.register(LadderLlamaConfig, LadderLlamaForCausalLM, exist_ok=True)

__all__ = ["LadderLlamaConfig", "LadderLlamaForCausalLM", "LayerMode", "Layout", "LayoutError", "__version__"]
