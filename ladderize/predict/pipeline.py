"""The pipeline behind ``ladderize predict``: which shape and layout to predict (``--layout``/``--model``/``--<mode>``),
the profiles and the compute model, then the prediction."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from ..errors import LadderizeError
from ..parsing import parse_int_list
from .compute import ComputeModel
from .interconnect import InterconnectProfile
from .estimate import Prediction, PredictRequest


@dataclass
class PreparedPrediction:
    """A validated request and the compute model that prices it (``run`` predicts)."""

    request: PredictRequest
    compute: ComputeModel

    @property
    def interconnect(self) -> InterconnectProfile:
        return self.request.interconnect

    def run(self) -> Prediction:
        from .estimate import predict

        return predict(self.request, self.compute)


def prepare_prediction(
    *,
    model: str | None = None,
    layout: Path | str | None = None,
    ranges: Mapping[str, str | None] | None = None,
    spd_tp: int | None = None,
    tp: str = "1,2,4,8",
    batch: str = "1,4,16,64",
    prompt: int = 1024,
    gen: int = 512,
    interconnect: str | None = None,
    compute: str | None = None,
    gpu: str | None = None,
    schedules: str | None = None,
    domino_chunks: int = 2,
    cache_dir: Path | str | None = None,
    device: str = "auto",
    dtype: str | None = None,
    profile: Path | str | None = None,
) -> PreparedPrediction:
    """Resolve the shape (``model``, else the ``layout`` checkpoint's own) and the layout (``layout`` or
    ``ranges``, mode name to ``--<mode>`` ranges, never both), validate the request and build the compute model (``measured`` times
    modules on ``device``).

    ``profile``: a ``--calibrate`` profile JSON; its fitted GPU prices the modules (roofline), and its
    measured all-reduce is the interconnect unless ``interconnect`` names one. ``interconnect`` None:
    the profile's, else ``h100-nvlink``. ``compute`` None: ``resolve_compute`` (measured only on the fabric's GPU, local);
    ``gpu`` None: the interconnect's own GPU profile (``InterconnectProfile.gpu``)."""
    from ..model.layout import Layout, mode_flags, tp_degree_for
    from ..checkpoint.placement import check_device, check_dtype
    from .compute import make_compute
    from .gpus import load_gpu_profile
    from .interconnect import load_interconnect
    from .estimate import layout_from_checkpoint, select_scenarios
    from .presets import load_model_shape

    device = check_device(device)
    check_dtype(dtype)  # TODO(predict measured): modules are timed in bf16 on CUDA, fp32 on CPU; honour dtype
    ranges = {name: spec for name, spec in (ranges or {}).items() if spec}
    if layout is not None and ranges:
        raise LadderizeError(f"give either --layout or {mode_flags()}, not both")
    tps, batches = parse_int_list(tp, "--tp"), parse_int_list(batch, "--batch")
    chosen_layout = None
    if layout is not None:
        chosen_layout, checkpoint_shape = layout_from_checkpoint(layout)
        shape = load_model_shape(model) if model else checkpoint_shape
    elif model:
        shape = load_model_shape(model)
    else:
        raise LadderizeError("--model is required (a preset or config.json) unless --layout gives a checkpoint")
    if ranges:
        chosen_layout = Layout.from_mode_ranges(shape.num_hidden_layers, ranges, spd_tp_size=tp_degree_for(
            ranges, spd_tp, default=max(tps), default_from="the largest --tp"))
    measured_interconnect = None
    if profile is not None:
        from .calibrate import load_profile

        gpu_profile, measured_interconnect = load_profile(profile)
    if interconnect is None and measured_interconnect is not None:
        link = measured_interconnect
    else:
        link = load_interconnect(interconnect or "h100-nvlink")
    if profile is not None:
        compute, why = "roofline", ""
    else:
        gpu_profile = load_gpu_profile(gpu or link.gpu or "h100")
        compute, why = resolve_compute(compute, device, link)
    if compute == "roofline" and gpu_profile.name.startswith("CPU") and link.gpu is not None:
        raise LadderizeError(
            f"{gpu_profile.name} was calibrated on a CPU, and {link.name} is a GPU fabric: CPU compute against GPU "
            "communication is no prediction of either; calibrate on the GPU, or give --interconnect a CPU fabric "
            "(a profile JSON without \"gpu\")"
        )
    request = PredictRequest(
        model=shape, tps=tps, batches=batches, prompt_tokens=prompt, new_tokens=gen, interconnect=link,
        layout=chosen_layout, schedules=select_scenarios(schedules, chosen_layout is not None),
        domino_chunks=domino_chunks,
    )
    request.validate()
    model_of_compute = make_compute(compute, gpu_profile, cache_dir, device=device)
    if why:
        model_of_compute.label += f"; {why}"
    return PreparedPrediction(request, model_of_compute)


def local_gpu_name(device: str = "auto") -> str | None:
    """The name of the CUDA GPU ``device`` would use here, or None when there is none (torch is imported only where
    an NVIDIA driver is installed)."""
    import shutil

    if device == "cpu" or not (Path("/dev/nvidiactl").exists() or shutil.which("nvidia-smi")):
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_name(torch.device(device) if device.startswith("cuda") else None)


def resolve_compute(compute: str | None, device: str, link: InterconnectProfile) -> tuple[str, str]:
    """The compute mode, and why when it was not asked for.

    ``None``: ``measured`` where ``device`` is (or ``auto`` finds) a GPU of the fabric's kind (an H100 for the H100
    fabrics), else ``roofline`` of the interconnect's GPU. ``measured`` on a CPU against a GPU fabric is refused:
    its table would be CPU compute against GPU communication (every speed-up near 1.000x), and CPU
    timings are noise at these shapes.
    """
    if compute == "roofline":
        return compute, ""
    local = local_gpu_name(device)
    family = _gpu_family(link.gpu)
    if compute is None:
        if local is not None and (family is None or family in local.upper()):
            return "measured", ""
        if local is not None:
            return "roofline", f"the default: this machine's {local} is not {link.name}'s {family}"
        return "roofline", f"the default without a local GPU: {link.name}'s GPUs priced by their fitted model"
    if compute == "measured" and local is None and link.gpu is not None:
        raise LadderizeError(
            f"--compute measured would time this CPU against {link.name}, a GPU fabric: CPU compute against GPU "
            f"communication is no prediction of either; leave --compute out (roofline of {link.gpu} here) or run "
            "on a machine with that GPU"
        )
    return compute, ""


def _gpu_family(profile: str | None) -> str | None:
    """``h100-gpt-fast`` -> ``H100``: the part of a GPU profile's name a local device name contains."""
    return profile.split("-")[0].upper() if profile else None


def calibrate_from_options(
    *, model: str | None, layout: Path | str | None = None, tp: str = "1,2,4,8", batch: str = "1,4,16,64",
    prompt: int = 1024, gen: int = 512, out: Path | str | None = None, force: bool = False,
    cache_dir: Path | str | None = None, device: str = "auto",
):
    """``ladderize predict --calibrate --profile OUT``: the shape from ``model`` (or the ``layout`` checkpoint),
    the TP degrees and batches to time, then ``calibrate.run_calibration``."""
    from ..checkpoint.placement import check_device
    from .calibrate import run_calibration
    from .estimate import layout_from_checkpoint
    from .presets import load_model_shape

    if out is None:
        raise LadderizeError("--calibrate writes a profile: give --profile FILE")
    if prompt < 1 or gen < 1:
        raise LadderizeError("--prompt and --gen must be at least 1 token")
    if model:
        shape = load_model_shape(model)
    elif layout is not None:
        shape = layout_from_checkpoint(layout)[1]
    else:
        raise LadderizeError("--calibrate needs --model (a preset or config.json) or --layout")
    tps, batches = parse_int_list(tp, "--tp"), parse_int_list(batch, "--batch")
    if min(tps) < 1 or min(batches) < 1:
        raise LadderizeError("TP degrees and batch sizes must be positive")
    return run_calibration(shape, tps, batches, prompt, gen, out, force=force, cache_dir=cache_dir,
                           device=check_device(device))


def run_prediction(**options) -> Prediction:
    """``prepare_prediction(**options).run()``: the same rows as ``ladderize predict`` with those options."""
    return prepare_prediction(**options).run()


def gpu_node_prediction(
    checkpoint: Path | str, tps: Sequence[int], batches: Sequence[int], prompt: int = 1024, gen: int = 512,
    interconnect: str = "h100-nvlink",
) -> Prediction:
    """What ``predict`` gives for a converted checkpoint's own layout on a GPU node, whatever this machine is:
    dense, the checkpoint's ``layout`` and the upper bound, priced by the interconnect's fitted GPU model
    (never this machine's timings). For tables that set predicted GPU speed beside measured CPU speed (the
    demo); label the figures with ``compute_label`` and the interconnect's name."""
    return prepare_prediction(layout=checkpoint, tp=",".join(map(str, tps)), batch=",".join(map(str, batches)),
                           prompt=prompt, gen=gen, interconnect=interconnect, compute="roofline",
                           schedules="dense,layout,upper-bound").run()
