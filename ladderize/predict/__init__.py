"""Performance model for ``ladderize predict``: what ladder, SPD and domino buy on a multi-GPU node.

One concept per module: ``presets`` (model shapes), ``gpus`` (GPU profiles: datasheet peaks and a fitted
compute model), ``fit`` (the compute model ``ComputeFit`` and its fit from measured module timings; the
bundled H100 table), ``interconnect`` (the two-protocol all-reduce cost, overlap, and fabric profiles),
``work`` (one rank's module: shape, FLOPs, bytes), ``compute`` (how a module is priced: roofline, or
``measured`` on the local device with its cache), ``simulate`` (the two-stream simulator), ``estimate``
(rows per TP degree, batch and schedule, as ``ladderize.records.PredictRow``) and ``calibrate``
(``predict --calibrate``: fit this machine and write a profile). The published figures, the authors' logs and the
fits on them that fixed the shipped constants are ``benchmarks/published_figures.py``'s.
"""

from .compute import RooflineCompute, make_compute
from .fit import ComputeFit, TableCompute, fit_compute
from .gpus import GPU_PROFILES, GPUProfile, load_gpu_profile
from .interconnect import PROFILES, InterconnectProfile, load_interconnect
from .measured import MeasuredCompute
from .estimate import Prediction, PredictRequest, layout_from_checkpoint, predict
from .presets import PUBLIC_PRESETS, ModelShape, load_model_shape
from .simulate import ModuleCost, StepTiming, plan_modules, simulate, simulate_step
from .work import ModuleWork, module_work

__all__ = [
    "ComputeFit",
    "GPU_PROFILES",
    "GPUProfile",
    "InterconnectProfile",
    "MeasuredCompute",
    "ModelShape",
    "ModuleCost",
    "ModuleWork",
    "PUBLIC_PRESETS",
    "PROFILES",
    "Prediction",
    "PredictRequest",
    "RooflineCompute",
    "StepTiming",
    "TableCompute",
    "fit_compute",
    "layout_from_checkpoint",
    "load_gpu_profile",
    "load_interconnect",
    "load_model_shape",
    "make_compute",
    "module_work",
    "plan_modules",
    "predict",
    "simulate",
    "simulate_step",
]
