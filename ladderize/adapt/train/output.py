"""Writing OUT: the adapted checkpoint in the converted format, its provenance extended by an ``adapt`` record.

Two writers, one result:

- ``write_output`` saves a model held whole in memory (``save_model_checkpoint``);
- ``write_streamed_output`` assembles OUT tensor by tensor from the checkpoint's safetensors,
  with the trained layers taken from their files in the run dir (``layer_source.StreamedLayers``),
  so it never holds more than one layer plus one output shard.

Both write OUT's tensors in ``output_dtype`` (``--output-dtype``; by default the input checkpoint's: bf16 in, bf16
out), the fp32 weights the training keeps cast once as they are written; the config records that dtype (``dtype``,
what transformers' ``dtype="auto"`` reads) and so does the provenance. Both write the same config, tokenizer,
generation config, modeling files and provenance, into a temp dir renamed to OUT at the end
(``checkpoint.atomic.atomic_directory``).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from pathlib import Path
from typing import Any

import torch

from ...model import LadderLlamaConfig, LadderLlamaForCausalLM
from ...checkpoint.architectures import layer_prefix
from ...checkpoint.placement import dtype_name
from ..plan.config import AdaptConfig, AdaptResult
from .lora import ADAPTER_DIR

CURVE_FILE = "adapt_curve.json"


def checkpoint_dtype(path: str | Path) -> str:
    """The dtype a checkpoint's weights are stored in (the one holding most of its floating values); ``float32`` where
    none is floating."""
    from ...checkpoint.tensor_files import HEADER, CheckpointTensors

    with CheckpointTensors(path, framework=HEADER) as tensors:
        return tensors.floating_dtype() or "float32"


def output_dtype(config: AdaptConfig) -> torch.dtype:
    """The dtype OUT's floating tensors are written in: ``config.saving.output_dtype``, or (auto) the input checkpoint's."""
    from ...checkpoint.placement import parse_dtype

    return parse_dtype(config.saving.output_dtype) or getattr(torch, checkpoint_dtype(config.scope.checkpoint))


def written_marker(out: Path) -> Path:
    """The file beside OUT that says the main process has written it (``process_group.written_by_main``)."""
    out = Path(out).expanduser().absolute()
    return out.parent / f".{out.name}.written"


def run_curve(config: AdaptConfig, result: AdaptResult) -> list[dict[str, Any]]:
    """The loss curve OUT records: a single run's points as they are; a recipe stage's tagged with its ``stage``
    (number) and ``stage_name``, after the points of the stages before it, which its input checkpoint's curve holds
    (each stage writes the curve of the run so far). Each stage counts its own ``step``, ``tokens`` and ``train_s``."""
    if not config.saving.recipe:
        return result.curve
    number = config.saving.recipe["stage"]
    name = next((step["name"] for step in config.saving.recipe.get("plan", []) if step.get("stage") == number), None)
    earlier: list[dict[str, Any]] = []
    before = Path(config.scope.checkpoint) / CURVE_FILE
    if number > 1 and before.is_file():
        earlier = [point for point in json.loads(before.read_text()) if point.get("stage", number) < number]
    return earlier + [{"stage": number, "stage_name": name, **point} for point in result.curve]


def stage_points(curve: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The points of a curve's last stage (all of a single run's curve)."""
    last = curve[-1].get("stage") if curve else None
    return [point for point in curve if point.get("stage") == last]


def adapt_provenance(
    checkpoint: str, teacher_path: str | None, config: AdaptConfig, weights: dict[str, float], result: AdaptResult,
    model_config: LadderLlamaConfig, lora: bool = False, dtype: torch.dtype = torch.float32,
) -> dict[str, Any]:
    """The checkpoint's provenance with this run's ``adapt`` record appended, its layout and ``dtype`` (OUT's tensors')
    updated."""
    from ...checkpoint.io import read_provenance

    layout = model_config.layout
    device, precision = config.parallelism.placement()
    provenance = read_provenance(checkpoint)
    if not provenance.get("source") and teacher_path:
        provenance["source"] = {"path": _absolute(teacher_path)}
    recipe = config.saving.recipe and {**config.saving.recipe, "name": _absolute(config.saving.recipe["name"]),
                                "plan": [{**step, **({"data": _absolute(step["data"])} if "data" in step else {})}
                                         for step in config.saving.recipe.get("plan", [])]}  # fmt: skip
    provenance.setdefault("history", []).append(
        {
            "step": "adapt",
            "at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "from": _absolute(checkpoint),
            "teacher": _absolute(teacher_path),
            "objectives": weights,
            "local_schedule": config.sequential.local_schedule,
            "train": config.scope.train,
            "data": _absolute(config.training.data),
            "tokens": result.tokens,
            "seq_len": config.training.seq_len,
            "steps": result.steps,
            "train_s": round(result.train_s, 1),
            **({"throughput": result.throughput} if result.throughput else {}),
            "final_loss": result.curve[-1] if result.curve else None,
            "head_grouping": config.scope.head_grouping,
            "device": device.type,
            "precision": precision.name,
            "layout": layout.describe(),
            "dtype": dtype_name(dtype),
            **({"adapter": ADAPTER_DIR, "lora_rank": config.scope.lora_rank, "lora_alpha": config.scope.lora_alpha} if lora else {}),
            **({"recipe": recipe} if recipe else {}),
            # the weights written are (1 - x) * from + x * trained (interpolation.py); final_loss is the trained end's
            **({"interpolate": config.scope.interpolate} if config.scope.interpolate != 1 else {}),
            # the weights written are the moving average of the trained ones (weight_ema.py)
            **({"ema": config.scope.ema} if config.scope.ema else {}),
        }
    )
    provenance["layout"] = {**layout.ranges(), "spd_tp_size": layout.spd_tp_size, "describe": layout.describe()}
    provenance["dtype"] = dtype_name(dtype)
    return provenance


def _absolute(value: Any) -> Any:
    """A local path as an absolute one (the checkpoint writer then records it relative to OUT); else unchanged."""
    if isinstance(value, str) and value and Path(value).expanduser().exists():
        return str(Path(value).expanduser().absolute())
    return value


def write_output(
    final: LadderLlamaForCausalLM, tokenizer, checkpoint: str, teacher_path: str | None,
    config: AdaptConfig, weights: dict[str, float], result: AdaptResult, out: Path, adapter: Path | None = None,
) -> None:
    """Save the adapted model (held whole) as a converted checkpoint, its provenance extended by an ``adapt`` record;
    ``final`` is cast to ``output_dtype(config)`` in place first.

    ``adapter``: a saved peft adapter, moved to ``OUT/adapter/`` once the merged checkpoint is written.
    """
    from ...checkpoint.io import save_model_checkpoint

    final.requires_grad_(False)
    dtype = output_dtype(config)
    final.to(dtype)
    provenance = adapt_provenance(checkpoint, teacher_path, config, weights, result, final.config,
                                  lora=adapter is not None, dtype=dtype)
    save_model_checkpoint(final, tokenizer, out, provenance=provenance, force=config.saving.force)
    (out / CURVE_FILE).write_text(json.dumps(run_curve(config, result), indent=1) + "\n")
    if adapter is not None:
        os.replace(adapter, out / ADAPTER_DIR)


def write_streamed_output(
    student, tokenizer, checkpoint: str, teacher_path: str | None,
    config: AdaptConfig, weights: dict[str, float], result: AdaptResult, out: Path,
) -> None:
    """Assemble OUT from ``student`` (a ``layer_source.StreamedLayers`` whose trained layers point at their files).

    Tensors stream, cast to ``output_dtype(config)``, into shards of at most ``DEFAULT_MAX_SHARD_BYTES``, the
    converter's rule (the same model is sharded the same way by convert and adapt); the config is the
    checkpoint's, as ``load_model(checkpoint, dtype)`` would save it.
    """
    from transformers import GenerationConfig

    from ...checkpoint.io import DEFAULT_MAX_SHARD_BYTES, write_checkpoint

    model_config = student.model.config
    dtype = output_dtype(config)
    provenance = adapt_provenance(checkpoint, teacher_path, config, weights, result, model_config, dtype=dtype)
    saved = LadderLlamaConfig.from_dict(model_config.to_dict())
    saved.dtype = dtype_name(dtype)
    generation = Path(checkpoint) / "generation_config.json"
    if generation.is_file():
        generation_config = GenerationConfig.from_pretrained(checkpoint)
    else:
        generation_config = GenerationConfig.from_model_config(saved)
    write_checkpoint(
        out, saved, student.iter_tensors(dtype), force=config.saving.force, max_shard_bytes=DEFAULT_MAX_SHARD_BYTES,
        tokenizer=tokenizer, generation_config=generation_config, provenance=provenance,
        extra=lambda tmp: (tmp / CURVE_FILE).write_text(json.dumps(run_curve(config, result), indent=1) + "\n"),
    )


def layer_tensors(layer: torch.nn.Module, index: int) -> dict[str, torch.Tensor]:
    """A decoder layer's tensors under their checkpoint names (``model.layers.N.*``), contiguous."""
    return {f"{layer_prefix(index)}{key}": value.detach().contiguous() for key, value in layer.state_dict().items()}
