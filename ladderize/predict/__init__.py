"""Performance model for ``ladderize predict``: what ladder, SPD and domino buy on a multi-GPU node.

One concept per module: ``presets`` (model shapes), ``gpus`` (roofline GPU profiles), ``interconnect``
(all-reduce cost and fabric profiles), ``compute`` (measured or roofline module times), ``schedule``
(the two-stream simulator), ``predict`` (rows per TP degree, batch and schedule) and ``calibration``
(the published figures and the fits that fixed the profiles' parameters).
"""

from .compute import MeasuredCompute, ModuleWork, RooflineCompute, make_compute, module_work
from .gpus import GPU_PROFILES, GPUProfile, load_gpu_profile
from .interconnect import PROFILES, InterconnectProfile, load_interconnect
from .predict import Prediction, PredictionRow, PredictRequest, layout_from_checkpoint, predict
from .presets import PRESETS, ModelShape, load_model_shape
from .schedule import ModuleCost, StepTiming, plan_modules, simulate, simulate_step

__all__ = [
    "GPU_PROFILES",
    "GPUProfile",
    "InterconnectProfile",
    "MeasuredCompute",
    "ModelShape",
    "ModuleCost",
    "ModuleWork",
    "PRESETS",
    "PROFILES",
    "Prediction",
    "PredictRequest",
    "PredictionRow",
    "RooflineCompute",
    "StepTiming",
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
