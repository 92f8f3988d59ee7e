"""Published figures, the fits that fixed the profiles' parameters, and the validation table.

The published speed-ups were measured on the Ladder authors' gpt-fast runtime, so the fits use their
logged runs (Llama-3.1-70B, 8x H100 SXM, prompt 1024, 512 new tokens), in this order:

1. ``h100-gpt-fast`` compute (``fit_gpt_fast``): the logged no-communication ("upper bound") decode
   latency per token at TP8 batch 1, TP4 batch 1 and TP8 batch 64 fix the weight bandwidth, the KV-read
   bandwidth and the per-module overhead (a 3x3 linear solve); the upper-bound prefill at TP8 batch 1
   fixes one factor on the h100 fit's FLOP efficiencies.
2. ``h100-nvlink`` all-reduce (``fit_interconnects``): dense minus upper bound, per all-reduce (160 per
   step), is the logged cost of one all-reduce at that message size. Decode at TP8 batch 1, TP4 batch 1
   and TP8 batch 64 (16 KB, 16 KB, 1 MB) fix ``launch_s``, the per-hop ``latency_s`` and the latency
   protocol's bandwidth; prefill at TP8 batch 1 and 64 (16.8 MB, 1.07 GB) fix the bandwidth protocol's
   hop latency and bus bandwidth.
3. ``h100-no-p2p`` all-reduce (``fit_no_p2p_allreduce``): the same dense-minus-upper-bound costs from the authors'
   P2P-disabled campaign (``NO_P2P_RUNS``; NCCL splits the node into two groups of 4): TP4 decode at batch 1 and 16
   fixes the hop latency and bandwidth of a ring inside a group, TP8 decode at batch 1 and 4 those of a ring across the
   groups, TP8 prefill at batch 1 and 4 the bandwidth protocol. The paper's 1.60x (TP8, batch 1) fitted the hop
   latency before issue 35 and is now held out.

The overlap's interference on NVLink is not fitted: ``overlap_slowdown`` follows from the SMs NCCL's channels hold
(``interconnect.sm_share_slowdown``), so the 1.31x Ladder figure is held out like every other NVLink Ladder
speed-up.

4. ``h100-no-p2p`` host-staged overlap (``fit_host_staged_channel_slowdown``): what each channel of a host-staged (SHM)
   all-reduce costs a memory-bound module beside it, fitted on one Ladder figure, the P2P-disabled log at 70B TP4
   batch 64 (``NO_P2P_OVERLAP_FIT``, 1 MB all-reduces on 16 channels); that figure is a fit point. Every other
   P2P-disabled Ladder figure is held out, among them 70B TP4 batch 16 (256 KB, also 16 channels) and batch 1 (16 KB,
   1 channel).
 Everything else is held out too: the logged runs at TP8 batch 4 and 16 and TP4 batch 16, the blog's
batch 8 and 32, the Llama-3.1-8B runs (logs and blog), the logged Ladder and SPD-everywhere runs of both models,
and every figure whose setting uses none of the rows above. ``FIT_RUNS`` lists the logged runs the fits read.

Sources: Ladder Residual, Zhang et al. 2025 (arXiv:2501.06589) and its authors' blog table (Together AI
blog "Ladder-residual", mirrored at github.com/Nanami18/Nanami18.github.io
blogs/ladder_residual/together_blog.md); the authors' benchmark logs
(github.com/mayank31398/ladder-residual-inference, final-results-512/, prompt 1024, 512 new tokens,
8x H100 SXM; Llama-3.1-70B as ``llama-3-70b``, Llama-3.1-8B as ``llama-3-8b``, dense ``gpt_dense``, Ladder
``gpt_ladder``, no communication ``gpt_ensemble:*-upper-bound``); SPD, Kim et al., ICML 2025 (arXiv:2502.20727).

The logs' ``gpt_ensemble:llama-3-8b`` / ``llama-3-70b`` runs are not Ladder (issue 35): that model drops every
attention all-reduce and keeps the MLP's, blocking, i.e. SPD on every layer, and its decode step lies halfway
between dense and the upper bound in every log. They validate the ``spd`` schedule (``SYNC_DROP_LOGS``); the
``gpt_ladder`` runs (``LADDER_LOGS_8B``, ``LADDER_LOGS_70B``) validate ``ladder`` and reproduce the paper's and the
blog's figures (70B TP8: 1.308 / 1.282 at batch 1 / 4 against the published 1.31 / 1.282; 8B TP8 batch 4: 1.443
against the blog's 1.447). Read as Ladder, the ``gpt_ensemble`` runs put the model 10.3% off on average
(``ENSEMBLE_READ_AS_LADDER``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, Callable

import numpy as np

from ladderize.model.layout import Layout
from ladderize.predict.compute import ComputeModel, RooflineCompute
from ladderize.predict.estimate import PredictRequest, decode_kv_len, predict
from ladderize.predict.fit import ComputeFit
from ladderize.predict.gpus import GPU_PROFILES, GPUProfile
from ladderize.predict.interconnect import PROFILES, InterconnectProfile, ring_volume
from ladderize.predict.presets import PUBLIC_PRESETS, ModelShape
from ladderize.predict.work import module_work

PROMPT, GEN = 1024, 512
DECODE_STEPS = GEN - 1
LADDER_PAPER = "Ladder Residual (arXiv:2501.06589), 70B at TP8 on H100"
LADDER_BLOG = "Ladder authors' blog table (Nanami18.github.io blogs/ladder_residual/together_blog.md)"
LADDER_LOGS = "github.com/mayank31398/ladder-residual-inference final-results-512/"
_LOG_TAIL = "bs_B_tp_T.log 'Average tokens/sec'"
LADDER_LOGS_8B = (f"{LADDER_LOGS} gpt_ladder:llama-3-8b against gpt_dense:llama-3-8b, {_LOG_TAIL}")
LADDER_LOGS_70B = (f"{LADDER_LOGS} gpt_ladder:llama-3-70b against gpt_dense:llama-3-70b, {_LOG_TAIL}")
LADDER_LOGS_NO_P2P = ("github.com/mayank31398/ladder-residual-inference logs/arxiv/prompt_length_1024_max_new_512/"
                      f"p2p_disable1/compile/ gpt_ladder:llama-3-70b / llama-3-8b against gpt_dense, {_LOG_TAIL}")
#: The logs' ``gpt_ensemble`` model is not Ladder: its blocks drop the attention all-reduce and keep the MLP's,
#: blocking (``reduce_pattern`` attention False, mlp True in gpt_fast/gpt_ensemble_TP.py), which is SPD on every
#: layer. Its decode step sits halfway between dense and the upper bound in every log (8B TP8 b1: 2.854 ms against
#: (3.554 + 2.098) / 2 = 2.826; 70B TP8 b1: 10.83 against 10.86), as half the all-reduces, none overlapped.
SYNC_DROP_LOGS = (f"{LADDER_LOGS} gpt_ensemble:llama-3-8b / llama-3-70b (attention all-reduce dropped in every "
                  f"layer: SPD everywhere) against gpt_dense, {_LOG_TAIL}")
SPD_PAPER = "SPD (Kim et al., ICML 2025, arXiv:2502.20727): about 20% lower latency, LLaMA2-70B on 8 GPUs, 70% of blocks"


@dataclass(frozen=True)
class LoggedRun:
    """One run from the Ladder authors' logs: Llama-3.1-70B on H100, prompt 1024, 512 new tokens."""

    model: str  # "dense" or "upper-bound" (the no-communication run)
    tp: int
    batch: int
    prefill_s: float
    decode_s: float  # the whole decode phase: 511 steps
    e2e_tokens_per_s: float  # 512 new tokens per sequence over prefill and decode (the logs' "tokens/s")
    path: str

    @property
    def decode_s_per_token(self) -> float:
        return self.decode_s / DECODE_STEPS


_DENSE = "gpt_dense:llama-3-70b"
_UB = "gpt_ensemble:llama-3-70b-upper-bound"
LOGGED_RUNS: tuple[LoggedRun, ...] = (
    LoggedRun("dense", 8, 1, 0.0812, 6.5310, 77.39, f"{_DENSE}/bs_1_tp_8.log"),
    LoggedRun("dense", 8, 4, 0.2599, 7.6558, 258.56, f"{_DENSE}/bs_4_tp_8.log"),
    LoggedRun("dense", 8, 16, 0.9951, 8.7168, 843.15, f"{_DENSE}/bs_16_tp_8.log"),
    LoggedRun("dense", 8, 64, 4.0603, 12.4776, 1980.92, f"{_DENSE}/bs_64_tp_8.log"),
    LoggedRun("dense", 4, 1, 0.1223, 8.4932, 59.41, f"{_DENSE}/bs_1_tp_4.log"),
    LoggedRun("dense", 4, 16, 1.7276, 12.2677, 585.23, f"{_DENSE}/bs_16_tp_4.log"),
    LoggedRun("upper-bound", 8, 1, 0.0564, 4.5711, 110.59, f"{_UB}/bs_1_tp_8.log"),
    LoggedRun("upper-bound", 8, 4, 0.2056, 5.5474, 355.80, f"{_UB}/bs_4_tp_8.log"),
    # This log stops after run 8 of 10: the mean of runs 1-8.
    LoggedRun("upper-bound", 8, 16, 0.8117, 6.5684, 1109.7, f"{_UB}/bs_16_tp_8.log (runs 1-8)"),
    LoggedRun("upper-bound", 8, 64, 3.3527, 9.9090, 2470.39, f"{_UB}/bs_64_tp_8.log"),
    LoggedRun("upper-bound", 4, 1, 0.1031, 7.3108, 69.04, f"{_UB}/bs_1_tp_4.log"),
    LoggedRun("upper-bound", 4, 16, 1.5343, 10.7806, 665.07, f"{_UB}/bs_16_tp_4.log"),
)


#: The authors' P2P-disabled campaign (NCCL_P2P_DISABLE=1, December 2024, in the logs folder they named ``arxiv``):
#: dense with P2P off, and the same campaign's no-communication runs (dense minus upper bound is the all-reduce; the
#: campaign's upper-bound decode is within 3.3% of final-results-512's at TP8 batch 1 and 4 and TP4 batch 1 and 16,
#: its prefill within 4.4%).
_ARXIV = "logs/arxiv/prompt_length_1024_max_new_512/p2p_disable1/compile"
_DENSE_NO_P2P, _UB_ARXIV = f"{_ARXIV}/gpt_dense:llama-3-70b", f"{_ARXIV}/gpt_ensemble:llama-3-70b-upper-bound"
NO_P2P_RUNS: tuple[LoggedRun, ...] = (
    LoggedRun("dense", 8, 1, 0.0918, 9.8167, 51.66, f"{_DENSE_NO_P2P}/bs_1_tp_8.log"),
    LoggedRun("dense", 8, 4, 0.2848, 11.5086, 173.62, f"{_DENSE_NO_P2P}/bs_4_tp_8.log"),
    LoggedRun("dense", 4, 1, 0.1254, 9.4694, 53.35, f"{_DENSE_NO_P2P}/bs_1_tp_4.log"),
    LoggedRun("dense", 4, 16, 1.7439, 14.0557, 518.41, f"{_DENSE_NO_P2P}/bs_16_tp_4.log"),
    LoggedRun("dense", 4, 64, 6.9973, 20.3153, 1199.62, f"{_DENSE_NO_P2P}/bs_64_tp_4.log"),
    LoggedRun("upper-bound", 8, 1, 0.0589, 4.6425, 108.86, f"{_UB_ARXIV}/bs_1_tp_8.log"),
    LoggedRun("upper-bound", 8, 4, 0.2074, 5.4728, 360.43, f"{_UB_ARXIV}/bs_4_tp_8.log"),
    LoggedRun("upper-bound", 4, 1, 0.1056, 7.2855, 69.25, f"{_UB_ARXIV}/bs_1_tp_4.log"),
    LoggedRun("upper-bound", 4, 16, 1.5548, 10.4259, 683.66, f"{_UB_ARXIV}/bs_16_tp_4.log"),
    LoggedRun("upper-bound", 4, 64, 6.1584, 16.4335, 1450.27, f"{_UB_ARXIV}/bs_64_tp_4.log"),
)


def logged(model: str, tp: int, batch: int, runs: tuple[LoggedRun, ...] = LOGGED_RUNS) -> LoggedRun:
    for run in runs:
        if (run.model, run.tp, run.batch) == (model, tp, batch):
            return run
    raise KeyError((model, tp, batch))


def _logged_ratio(tp: int, batch: int) -> float:
    return logged("upper-bound", tp, batch).e2e_tokens_per_s / logged("dense", tp, batch).e2e_tokens_per_s


@dataclass(frozen=True)
class Figure:
    """A published speed-up (or latency reduction) and the setting that reproduces it."""

    key: str
    description: str
    published: float
    source: str
    schedule: str  # "upper-bound", "ladder", "spd" (every layer SPD, e2e speed-up) or "spd-latency-reduction"
    interconnect: str
    tp: int
    batch: int
    model: str = "llama-3.1-70b"
    fixes: str = ""  # the parameter this figure fixed; empty when held out


#: The one Ladder figure a fit reads: the P2P-disabled log at 70B TP4 batch 64 fixes h100-no-p2p's per-channel
#: host-staged slowdown (``fit_host_staged_channel_slowdown``).
NO_P2P_OVERLAP_FIT = "ladder-nop2p-70b-tp4-b64-log"

FIGURES: tuple[Figure, ...] = (
    Figure("ub-tp8-b1", "upper bound / dense, TP8, batch 1, NVLink", 1.43, LADDER_PAPER, "upper-bound",
           "h100-nvlink", 8, 1, fixes="its logged runs fit compute and all-reduce"),
    Figure("ub-tp4-b1", "upper bound / dense, TP4, batch 1, NVLink", round(_logged_ratio(4, 1), 3), LADDER_LOGS,
           "upper-bound", "h100-nvlink", 4, 1, fixes="its logged runs fit compute and all-reduce"),
    Figure("ladder-tp8-b1", "Ladder / dense, TP8, batch 1, NVLink", 1.31, LADDER_PAPER, "ladder", "h100-nvlink", 8, 1),
    Figure("ladder-nop2p-tp8-b1", "Ladder / dense, TP8, batch 1, peer-to-peer disabled", 1.60, LADDER_PAPER, "ladder",
           "h100-no-p2p", 8, 1),
    Figure("ladder-tp8-b16", "Ladder / dense, TP8, batch 16, NVLink", 1.19, LADDER_PAPER, "ladder", "h100-nvlink", 8, 16),
    Figure("ladder-tp8-b4", "Ladder / dense, TP8, batch 4, NVLink", 1.282, LADDER_BLOG, "ladder", "h100-nvlink", 8, 4),
    Figure("ladder-tp8-b64", "Ladder / dense, TP8, batch 64, NVLink", 1.155, LADDER_BLOG, "ladder", "h100-nvlink", 8, 64),
    Figure("ub-tp8-b4", "upper bound / dense, TP8, batch 4, NVLink", round(_logged_ratio(8, 4), 3), LADDER_LOGS,
           "upper-bound", "h100-nvlink", 8, 4),
    Figure("ub-tp8-b16", "upper bound / dense, TP8, batch 16, NVLink", round(_logged_ratio(8, 16), 3), LADDER_LOGS,
           "upper-bound", "h100-nvlink", 8, 16),
    Figure("ub-tp8-b64", "upper bound / dense, TP8, batch 64, NVLink", round(_logged_ratio(8, 64), 3), LADDER_LOGS,
           "upper-bound", "h100-nvlink", 8, 64, fixes="its logged runs fit compute and all-reduce"),
    Figure("ub-tp4-b16", "upper bound / dense, TP4, batch 16, NVLink", round(_logged_ratio(4, 16), 3), LADDER_LOGS,
           "upper-bound", "h100-nvlink", 4, 16),
    Figure("ladder-tp8-b8", "Ladder / dense, TP8, batch 8, NVLink", 1.256, LADDER_BLOG, "ladder", "h100-nvlink", 8, 8),
    Figure("ladder-tp8-b32", "Ladder / dense, TP8, batch 32, NVLink", 1.184, LADDER_BLOG, "ladder", "h100-nvlink", 8, 32),
    Figure("ladder-8b-tp8-b4-blog", "Ladder / dense, Llama-3.1-8B, TP8, batch 4, NVLink (blog)", 1.447,
           LADDER_BLOG + ", model-size table", "ladder", "h100-nvlink", 8, 4, model="llama-3.1-8b"),
    *(Figure(f"ladder-8b-tp{tp}-b{b}-log", f"Ladder / dense, Llama-3.1-8B, TP{tp}, batch {b}, NVLink (logs)",
             round(ladder / dense, 3), LADDER_LOGS_8B, "ladder", "h100-nvlink", tp, b, model="llama-3.1-8b")
      for tp, b, dense, ladder in ((2, 1, 223.28, 251.94), (4, 1, 264.32, 329.98), (8, 1, 278.63, 395.71),
                                   (8, 4, 902.02, 1301.53), (4, 16, 2732.49, 3230.18), (8, 16, 3097.47, 4242.27),
                                   (2, 64, 4060.03, 4257.75), (8, 64, 8573.70, 10566.79))),
    *(Figure(f"ladder-tp{tp}-b{b}-log", f"Ladder / dense, TP{tp}, batch {b}, NVLink (logs)", round(ladder / dense, 3),
             LADDER_LOGS_70B, "ladder", "h100-nvlink", tp, b)
      for tp, b, dense, ladder in ((8, 1, 77.39, 101.22), (8, 4, 258.56, 331.45), (8, 64, 1980.92, 2260.25),
                                   (4, 1, 59.41, 67.51))),
    *(Figure(f"spd-all-8b-tp{tp}-b{b}-log", f"SPD on every layer / dense, Llama-3.1-8B, TP{tp}, batch {b}, NVLink (logs)",
             round(spd / dense, 3), SYNC_DROP_LOGS, "spd", "h100-nvlink", tp, b, model="llama-3.1-8b")
      for tp, b, dense, spd in ((2, 1, 223.28, 243.30), (4, 1, 264.32, 311.07), (8, 1, 278.63, 346.93),
                                (8, 4, 902.02, 1094.00), (4, 16, 2732.49, 3029.85), (8, 16, 3097.47, 3669.10),
                                (2, 64, 4060.03, 4239.90), (8, 64, 8573.70, 9706.93))),
    *(Figure(f"spd-all-tp{tp}-b{b}-log", f"SPD on every layer / dense, TP{tp}, batch {b}, NVLink (logs)",
             round(spd / dense, 3), SYNC_DROP_LOGS, "spd", "h100-nvlink", tp, b)
      for tp, b, dense, spd in ((8, 1, 77.39, 91.25), (8, 4, 258.56, 298.86), (8, 16, 843.15, 957.31),
                                (8, 64, 1980.92, 2186.12), (4, 1, 59.41, 64.52))),
    *(Figure(f"ladder-nop2p-{size}-tp{tp}-b{b}-log", f"Ladder / dense, {size.upper()}, TP{tp}, batch {b}, peer-to-peer "
             "disabled (logs)", round(ladder / dense, 3), LADDER_LOGS_NO_P2P, "ladder", "h100-no-p2p", tp, b,
             model=f"llama-3.1-{size}")
      for size, tp, b, dense, ladder in (("70b", 8, 1, 51.66, 77.51), ("70b", 8, 4, 173.62, 271.82),
                                         ("70b", 4, 1, 53.35, 66.60), ("70b", 4, 16, 518.41, 598.71),
                                         ("70b", 4, 64, 1199.62, 1313.44), ("8b", 8, 4, 567.17, 793.08))),
    Figure("ub-8b-tp8-b1-log", "upper bound / dense, Llama-3.1-8B, TP8, batch 1, NVLink (logs)", round(471.34 / 278.63, 3),
           f"{LADDER_LOGS} gpt_ensemble:llama-3-8b-upper-bound against gpt_dense:llama-3-8b, {_LOG_TAIL}", "upper-bound",
           "h100-nvlink", 8, 1, model="llama-3.1-8b"),
    Figure("spd-nvlink", "SPD latency reduction, LLaMA2-70B, TP8, 70% of blocks, batch 1, on h100-nvlink", 0.20,
           SPD_PAPER, "spd-latency-reduction", "h100-nvlink", 8, 1, model="llama-2-70b"),
    Figure("spd-nop2p", "SPD latency reduction, LLaMA2-70B, TP8, 70% of blocks, batch 1, on h100-no-p2p", 0.20,
           SPD_PAPER, "spd-latency-reduction", "h100-no-p2p", 8, 1, model="llama-2-70b"),
)


FIGURES = tuple(replace(f, fixes="h100-no-p2p.host_staged_channel_slowdown") if f.key == NO_P2P_OVERLAP_FIT else f
                for f in FIGURES)


#: The 8B log figures as this module read them before (main 00a91f1): the ``gpt_ensemble`` runs (SPD on every
#: layer) taken for Ladder. Kept to show what that reading cost (``benchmarks/predict_validation.py``), never validated.
ENSEMBLE_READ_AS_LADDER: tuple[Figure, ...] = tuple(
    replace(f, key=f.key.replace("spd-all-8b", "ensemble-as-ladder-8b"), schedule="ladder",
            description=f.description.replace("SPD on every layer", "gpt_ensemble read as Ladder"))
    for f in FIGURES if f.source == SYNC_DROP_LOGS and f.model == "llama-3.1-8b"
)


@dataclass(frozen=True)
class OtherFigure:
    """A published overlap speed-up of another method: no Ladder/SPD setting reproduces it, so it is checked against
    the no-communication bound of the nearest setting (``bound_phase`` speed-up of ``upper-bound`` at TP8 on
    ``h100-nvlink``, batch 1-64), or only cited when ``bound_phase`` is empty (``why`` says why)."""

    key: str
    description: str
    published: float
    source: str
    bound_phase: str = ""  # "e2e", "decode" or "prefill"; "" when no bound applies
    model: str = "llama-3.1-70b"
    why: str = ""


_ANCHORS = "as quoted in this project's public anchors (../shared/MISSION.md)"
OTHER_FIGURES: tuple[OtherFigure, ...] = (
    OtherFigure("tokenweave", "TokenWeave: 1.28x (overlapped, fused all-reduce in vLLM, multi-GPU H100)", 1.28,
                f"TokenWeave (arXiv:2505.11329), {_ANCHORS}", "e2e"),
    OtherFigure("flux-decode", "Flux: 1.30x decode (GEMM and communication fused into one kernel)", 1.30,
                f"Flux (arXiv:2406.06858), {_ANCHORS}", "decode"),
    OtherFigure("vllm-fused-ar-norm", "vLLM's fused AllReduce + RMSNorm: 5-20% faster (the 20% end)", 1.20,
                f"vLLM, {_ANCHORS}", "e2e"),
    OtherFigure("domino-training", "Domino: up to 1.3x faster training than Megatron-LM (DGX-H100)", 1.30,
                f"Domino (Wang et al., 2024), {_ANCHORS}",
                why="training (forward, backward and optimizer): predict models inference only"),
)


def other_figures_table(gpu: GPUProfile | None = None) -> list[dict[str, Any]]:
    """Each other method's published speed-up against the predicted no-communication bound (no method that only
    overlaps or fuses communication can beat it): ``consistent`` when published <= bound."""
    gpu = gpu or GPU_PROFILES["h100-gpt-fast"]
    table = []
    for figure in OTHER_FIGURES:
        entry = {**asdict(figure)}
        if figure.bound_phase:
            request = PredictRequest(PUBLIC_PRESETS[figure.model], (8,), (1, 4, 16, 64), PROMPT, GEN, PROFILES["h100-nvlink"],
                                     schedules=("dense", "upper-bound"))
            rows = [r for r in predict(request, RooflineCompute(gpu)).rows if r.schedule == "upper-bound"]
            field_name = {"e2e": "e2e_speedup_vs_dense", "decode": "decode_speedup_vs_dense",
                          "prefill": "prefill_speedup_vs_dense"}[figure.bound_phase]
            bound = max(getattr(r, field_name) for r in rows)
            entry.update(bound=bound, consistent=figure.published <= bound)
        else:
            entry.update(bound=None, consistent=None)
        table.append(entry)
    return table


def spd_calibration_layout(model: ModelShape, tp: int = 8, fraction: float = 0.7) -> Layout:
    """SPD on the last ``fraction`` of the blocks (the paper adds SPD from the last layer backwards)."""
    count = round(model.num_hidden_layers * fraction)
    return Layout.from_ranges(model.num_hidden_layers, spd=f"-{count}:", spd_tp_size=tp)


def predict_figure(
    figure: Figure, gpu: GPUProfile, interconnect: InterconnectProfile, compute: ComputeModel | None = None
) -> float:
    """The model's value for ``figure``'s setting, under the given profiles (``compute``: roofline of ``gpu``)."""
    model = PUBLIC_PRESETS[figure.model]
    compute = compute or RooflineCompute(gpu)
    if figure.schedule == "spd-latency-reduction":
        request = PredictRequest(model, (figure.tp,), (figure.batch,), PROMPT, GEN, interconnect,
                                 layout=spd_calibration_layout(model, figure.tp), schedules=("dense", "layout"))
        rows = {r.schedule: r for r in predict(request, compute).rows}
        return 1.0 - rows["dense"].e2e_tokens_per_s / rows["layout"].e2e_tokens_per_s
    request = PredictRequest(model, (figure.tp,), (figure.batch,), PROMPT, GEN, interconnect,
                             schedules=("dense", figure.schedule))
    rows = {r.schedule: r for r in predict(request, compute).rows}
    return rows[figure.schedule].e2e_speedup_vs_dense  # the published figures are end-to-end tokens/s


# ---- fitting ---------------------------------------------------------------------------------------


def _solve(f: Callable[[float], float], lo: float, hi: float, tol: float = 1e-12, iterations: int = 200) -> float:
    """A root of ``f`` in [lo, hi] (bracketing bisection with secant steps)."""
    f_lo, f_hi = f(lo), f(hi)
    if f_lo == 0:
        return lo
    if f_hi == 0:
        return hi
    if (f_lo > 0) == (f_hi > 0):
        raise ValueError(f"no sign change in [{lo}, {hi}]: f={f_lo}, {f_hi}")
    for _ in range(iterations):
        mid = hi - f_hi * (hi - lo) / (f_hi - f_lo) if f_hi != f_lo else (lo + hi) / 2
        if not lo < mid < hi or abs(mid - lo) < 0.01 * (hi - lo) or abs(hi - mid) < 0.01 * (hi - lo):
            mid = (lo + hi) / 2
        f_mid = f(mid)
        if abs(hi - lo) <= tol * max(1.0, abs(mid)) or f_mid == 0:
            return mid
        if (f_mid > 0) == (f_lo > 0):
            lo, f_lo = mid, f_mid
        else:
            hi, f_hi = mid, f_mid
    return (lo + hi) / 2


#: The logged runs the fits read; every other logged run is held out.
FIT_RUNS = ((8, 1), (4, 1), (8, 64))
_ALLREDUCES_PER_STEP = 160  # 80 layers x (attention + MLP); the head needs none


def _decode_features(model: ModelShape, tp: int, batch: int) -> list[float]:
    """Per decode step: weight + activation bytes, KV bytes, and the number of modules."""
    kv = decode_kv_len(PROMPT, GEN)
    works = [module_work(model, kind, tp, batch, 1, kv) for kind in ("attention", "mlp")]
    head = module_work(model, "head", tp, batch, 1, 0)
    layers = model.num_hidden_layers
    kv_read = layers * sum(w.kv_bytes for w in works)
    other = layers * sum(w.bytes for w in works) + head.bytes - kv_read
    return [other, kv_read, 2 * layers + 1]


def fit_gpt_fast(base: GPUProfile | None = None) -> GPUProfile:
    """Step 1: the ``h100-gpt-fast`` compute model from the logged upper-bound runs (``FIT_RUNS``)."""
    gpu = base or GPU_PROFILES["h100-gpt-fast"]
    table_fit = GPU_PROFILES["h100"].fit
    model = PUBLIC_PRESETS["llama-3.1-70b"]
    features = np.array([_decode_features(model, tp, b) for tp, b in FIT_RUNS])
    targets = np.array([logged("upper-bound", tp, b).decode_s_per_token for tp, b in FIT_RUNS])
    inv_w, inv_kv, overhead = np.linalg.solve(features, targets)

    def with_scale(scale: float) -> GPUProfile:
        fit = ComputeFit(
            weight_bytes_per_s=1.0 / float(inv_w), kv_bytes_per_s=1.0 / float(inv_kv),
            overhead_s={k: float(overhead) for k in ("attention", "mlp", "head")},
            flops_efficiency={k: tuple((w, e * scale) for w, e in v) for k, v in table_fit.flops_efficiency.items()},
            sources=gpu.fit.sources,
        )  # fmt: skip
        return gpu.with_fit(fit)

    target = logged("upper-bound", 8, 1).prefill_s
    request = PredictRequest(model, (8,), (1,), PROMPT, GEN, PROFILES["h100-nvlink"], schedules=("upper-bound",))

    def prefill_error(scale: float) -> float:
        rows = {r.schedule: r for r in predict(request, RooflineCompute(with_scale(scale))).rows}
        return rows["upper-bound"].prefill_s - target

    return with_scale(_solve(prefill_error, 0.2, 2.0))


def logged_allreduce_s(tp: int, batch: int, phase: str) -> float:
    """One all-reduce's cost in the logs: (dense - upper bound) / 160, per decode step or per prefill."""
    dense, bound = logged("dense", tp, batch), logged("upper-bound", tp, batch)
    if phase == "decode":
        return (dense.decode_s_per_token - bound.decode_s_per_token) / _ALLREDUCES_PER_STEP
    return (dense.prefill_s - bound.prefill_s) / _ALLREDUCES_PER_STEP


def allreduce_bytes(batch: int, phase: str, hidden: int = 8192, dtype_bytes: int = 2) -> int:
    return batch * (1 if phase == "decode" else PROMPT) * hidden * dtype_bytes


def fit_nvlink_allreduce(base: InterconnectProfile | None = None) -> InterconnectProfile:
    """Step 2: the NVLink all-reduce curve from the logged dense-minus-upper-bound costs (``FIT_RUNS``)."""
    nvlink = base or PROFILES["h100-nvlink"]
    small = [(tp, b) for tp, b in FIT_RUNS]  # decode messages: 16 KB, 16 KB, 1 MB
    rows = [[1.0, nvlink.steps(tp), ring_volume(allreduce_bytes(b, "decode"), tp)] for tp, b in small]
    launch, hop, inv_small = np.linalg.solve(np.array(rows), np.array([logged_allreduce_s(tp, b, "decode") for tp, b in small]))
    large = [(8, 1), (8, 64)]  # prefill messages: 16.8 MB and 1.07 GB
    rows = [[nvlink.steps(tp), ring_volume(allreduce_bytes(b, "prefill"), tp)] for tp, b in large]
    rhs = [logged_allreduce_s(tp, b, "prefill") - launch for tp, b in large]
    large_hop, inv_large = np.linalg.solve(np.array(rows), np.array(rhs))
    return replace(nvlink, launch_s=float(launch), latency_s=float(hop), small_bus_bytes_per_s=1.0 / float(inv_small),
                   large_latency_s=float(large_hop), bus_bytes_per_s=1.0 / float(inv_large))


#: The P2P-disabled runs the no-P2P fit reads (decode: TP4 b1 and b16 inside a group, TP8 b1 and b4 across the groups;
#: prefill: TP8 b1 and b4); TP4 b64 decode and every TP4 prefill all-reduce are held out, and every Ladder figure.
NO_P2P_FIT = {"intra": ((4, 1), (4, 16)), "cross": ((8, 1), (8, 4)), "prefill": ((8, 1), (8, 4))}


def logged_no_p2p_allreduce_s(tp: int, batch: int, phase: str) -> float:
    """One all-reduce's cost in the P2P-disabled logs: (dense - upper bound) / 160, from the same campaign."""
    dense, bound = logged("dense", tp, batch, NO_P2P_RUNS), logged("upper-bound", tp, batch, NO_P2P_RUNS)
    if phase == "decode":
        return (dense.decode_s_per_token - bound.decode_s_per_token) / _ALLREDUCES_PER_STEP
    return (dense.prefill_s - bound.prefill_s) / _ALLREDUCES_PER_STEP


def fit_no_p2p_allreduce(launch_s: float, base: InterconnectProfile | None = None) -> InterconnectProfile:
    """Step 3: the P2P-disabled curve from the logged dense-minus-upper-bound costs (``NO_P2P_FIT``), with NVLink's
    ``launch_s``: a ring inside a group of 4 and one across the groups each get their latency-protocol hop and
    bandwidth (2x2 solves), and the TP8 prefill runs fix the bandwidth protocol."""
    profile = base or PROFILES["h100-no-p2p"]

    def solve(runs: tuple[tuple[int, int], ...], phase: str) -> tuple[float, float]:
        rows = [[profile.steps(tp), ring_volume(allreduce_bytes(b, phase), tp)] for tp, b in runs]
        rhs = [logged_no_p2p_allreduce_s(tp, b, phase) - launch_s for tp, b in runs]
        hop, inverse = np.linalg.solve(np.array(rows), np.array(rhs))
        return float(hop), 1.0 / float(inverse)

    hop, small = solve(NO_P2P_FIT["intra"], "decode")
    cross_hop, cross_small = solve(NO_P2P_FIT["cross"], "decode")
    large_hop, large = solve(NO_P2P_FIT["prefill"], "prefill")
    return replace(profile, launch_s=launch_s, latency_s=hop, small_bus_bytes_per_s=small, cross_latency_s=cross_hop,
                   cross_small_bus_bytes_per_s=cross_small, large_latency_s=large_hop, bus_bytes_per_s=large)


def fit_host_staged_channel_slowdown(gpu: GPUProfile, no_p2p: InterconnectProfile) -> InterconnectProfile:
    """Step 4: ``host_staged_channel_slowdown`` such that the model gives the published ``NO_P2P_OVERLAP_FIT`` figure
    (70B, TP4, batch 64, P2P disabled: 1 MB decode all-reduces on 16 channels) under ``gpu``'s roofline."""
    figure = next(f for f in FIGURES if f.key == NO_P2P_OVERLAP_FIT)

    def error(value: float) -> float:
        return predict_figure(figure, gpu, replace(no_p2p, host_staged_channel_slowdown=value)) - figure.published

    return replace(no_p2p, host_staged_channel_slowdown=_solve(error, 0.0, 0.5, tol=1e-7, iterations=60))


def fit_interconnects(gpu: GPUProfile) -> dict[str, InterconnectProfile]:
    """Steps 2 to 4: the NVLink and the P2P-disabled curves, both from logged all-reduce costs, then the P2P-disabled
    per-channel overlap cost from one Ladder figure under ``gpu`` (NVLink's overlap slowdowns are derived)."""
    nvlink = fit_nvlink_allreduce()
    no_p2p = fit_no_p2p_allreduce(nvlink.launch_s)
    return {"h100-nvlink": nvlink, "h100-no-p2p": fit_host_staged_channel_slowdown(gpu, no_p2p)}


@dataclass(frozen=True)
class Calibration:
    gpu: GPUProfile
    interconnects: dict[str, InterconnectProfile]

    def parameters(self) -> dict[str, float]:
        nvlink, no_p2p = self.interconnects["h100-nvlink"], self.interconnects["h100-no-p2p"]
        fit = self.gpu.fit
        return {
            "h100-gpt-fast.weight_bytes_per_s": fit.weight_bytes_per_s,
            "h100-gpt-fast.kv_bytes_per_s": fit.kv_bytes_per_s,
            "h100-gpt-fast.overhead_s": fit.overhead_s["mlp"],
            "h100-gpt-fast.prefill_scale": fit.flops_efficiency["mlp"][0][1] / GPU_PROFILES["h100"].fit.flops_efficiency["mlp"][0][1],
            "h100-nvlink.launch_s": nvlink.launch_s,
            "h100-nvlink.latency_s": nvlink.latency_s,
            "h100-nvlink.small_bus_bytes_per_s": nvlink.small_bus_bytes_per_s or 0.0,
            "h100-nvlink.large_latency_s": nvlink.large_latency_s or 0.0,
            "h100-nvlink.bus_bytes_per_s": nvlink.bus_bytes_per_s,
            "overlap_slowdown": nvlink.overlap_slowdown,
            "h100-no-p2p.latency_s": no_p2p.latency_s,
            "h100-no-p2p.small_bus_bytes_per_s": no_p2p.small_bus_bytes_per_s or 0.0,
            "h100-no-p2p.cross_latency_s": no_p2p.cross_latency_s or 0.0,
            "h100-no-p2p.cross_small_bus_bytes_per_s": no_p2p.cross_small_bus_bytes_per_s or 0.0,
            "h100-no-p2p.large_latency_s": no_p2p.large_latency_s or 0.0,
            "h100-no-p2p.bus_bytes_per_s": no_p2p.bus_bytes_per_s,
            "h100-no-p2p.host_staged_channel_slowdown": no_p2p.host_staged_channel_slowdown,
        }


def calibrate() -> Calibration:
    """Re-derive every fitted constant from the logs and published figures (the shipped values are these, rounded)."""
    gpu = fit_gpt_fast()
    return Calibration(gpu, fit_interconnects(gpu))


# ---- validation --------------------------------------------------------------------------------------


def validation_table(
    gpu: GPUProfile | None = None, interconnects: dict[str, InterconnectProfile] | None = None,
    compute: Callable[[], ComputeModel] | None = None, figures: tuple[Figure, ...] | None = None,
) -> list[dict[str, Any]]:
    """Predicted against published for every figure, with the shipped profiles unless others are given.

    ``gpu`` defaults to ``h100-gpt-fast`` (the runtime the figures were measured on); ``compute`` builds
    another compute model instead of its roofline (the measured column: ``fit.TableCompute``); ``figures``: another
    set than ``FIGURES`` (``ENSEMBLE_READ_AS_LADDER``).
    """
    gpu = gpu or GPU_PROFILES["h100-gpt-fast"]
    table = []
    for figure in FIGURES if figures is None else figures:
        profile = (interconnects or {}).get(figure.interconnect, PROFILES[figure.interconnect])
        predicted = predict_figure(figure, gpu, profile, compute() if compute else None)
        table.append({
            **{k: v for k, v in asdict(figure).items() if k != "fixes"},
            "role": f"fit: {figure.fixes}" if figure.fixes else "held out",
            "predicted": predicted,
            "error": predicted / figure.published - 1.0,
        })
    return table


def validation_summary(table: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean and worst absolute error of the end-to-end speed-ups (Ladder, SPD on every layer, upper bound), fit and
    held-out rows apart, per source; SPD's partial-layout latency reductions are left to the table."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in table:
        if row["schedule"] in ("ladder", "upper-bound", "spd"):
            role = "fit" if row["role"].startswith("fit") else "held out"
            groups.setdefault((role, row["source"]), []).append(row)
    return [{"role": role, "source": source, "points": len(rows),
             "mean_abs_error": sum(abs(r["error"]) for r in rows) / len(rows),
             "worst_error": max((r["error"] for r in rows), key=abs), "worst": max(rows, key=lambda r: abs(r["error"]))["key"]}
            for (role, source), rows in sorted(groups.items())]


def roofline_vs_logged(gpu: GPUProfile | None = None) -> list[dict[str, Any]]:
    """The roofline's upper-bound (compute-only) latencies against the authors' measured H100 runs."""
    gpu = gpu or GPU_PROFILES["h100-gpt-fast"]
    model = PUBLIC_PRESETS["llama-3.1-70b"]
    table = []
    for run in LOGGED_RUNS:
        if run.model != "upper-bound":
            continue
        request = PredictRequest(model, (run.tp,), (run.batch,), PROMPT, GEN, PROFILES["h100-nvlink"],
                                 schedules=("upper-bound",))
        row = next(r for r in predict(request, RooflineCompute(gpu)).rows if r.schedule == "upper-bound")
        for phase, predicted, measured in (
            ("prefill", row.prefill_s, run.prefill_s),
            ("decode per token", row.decode_s_per_token, run.decode_s_per_token),
        ):
            used = (run.tp, run.batch) in FIT_RUNS if phase.startswith("decode") else (run.tp, run.batch) == (8, 1)
            table.append({
                "tp": run.tp, "batch": run.batch, "phase": phase, "roofline_s": predicted, "measured_s": measured,
                "error": predicted / measured - 1.0, "role": "fit" if used else "held out", "log": run.path,
            })
    return table


def allreduce_vs_logged(nvlink: InterconnectProfile | None = None) -> list[dict[str, Any]]:
    """The NVLink all-reduce model against the logs' per-call cost (dense minus upper bound over 160)."""
    nvlink = nvlink or PROFILES["h100-nvlink"]
    table = []
    for tp, batch in sorted({(r.tp, r.batch) for r in LOGGED_RUNS}):
        for phase in ("decode", "prefill"):
            nbytes = allreduce_bytes(batch, phase)
            measured, predicted = logged_allreduce_s(tp, batch, phase), nvlink.allreduce_s(nbytes, tp)
            used = (tp, batch) in FIT_RUNS if phase == "decode" else (tp, batch) in ((8, 1), (8, 64))
            table.append({
                "tp": tp, "batch": batch, "phase": phase, "bytes": nbytes, "measured_s": measured,
                "predicted_s": predicted, "error": predicted / measured - 1.0,
                "busbw_measured": ring_volume(nbytes, tp) / measured, "role": "fit" if used else "held out",
            })
    return table


def no_p2p_allreduce_vs_logged(no_p2p: InterconnectProfile | None = None) -> list[dict[str, Any]]:
    """The P2P-disabled all-reduce model against the P2P-disabled logs' per-call cost (dense minus upper bound / 160)."""
    no_p2p = no_p2p or PROFILES["h100-no-p2p"]
    fit = {("decode", tp, b) for tp, b in NO_P2P_FIT["intra"] + NO_P2P_FIT["cross"]}
    fit |= {("prefill", tp, b) for tp, b in NO_P2P_FIT["prefill"]}
    table = []
    for tp, batch in sorted({(r.tp, r.batch) for r in NO_P2P_RUNS}):
        for phase in ("decode", "prefill"):
            nbytes = allreduce_bytes(batch, phase)
            measured, predicted = logged_no_p2p_allreduce_s(tp, batch, phase), no_p2p.allreduce_s(nbytes, tp)
            table.append({"tp": tp, "batch": batch, "phase": phase, "bytes": nbytes, "measured_s": measured,
                          "predicted_s": predicted, "error": predicted / measured - 1.0,
                          "role": "fit" if (phase, tp, batch) in fit else "held out"})
    return table

