"""A training run's pace: tokens per second per process and in total, the projected time of the whole budget,
and on CUDA the model FLOPs utilisation (MFU).

MFU counts the model's FLOPs, not the hardware's: per trained token, 6 x the trained parameters, 4 x the frozen ones
the gradient passes through and 2 x the forward-only ones (``cost.FlopCount``: the embedding lookup excluded, the LM
head included, the attention's quadratic term left out, as in the PaLM paper's appendix B). It is divided by the
GPU's dense BF16 peak (``hardware.GPU_PEAKS``; the datasheet figure) times the processes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...hardware import GPU_PEAKS, gpu_named

MFU_FORMULA = ("(6 x trained + 4 x frozen parameters the gradient passes through + 2 x forward-only parameters, "
               "embeddings excluded) x tokens per second / (processes x the GPU's dense BF16 peak FLOP/s)")


def peak_flops_per_s(device: torch.device) -> float | None:
    """The dense BF16 peak of ``device``'s GPU from ``hardware.GPU_PEAKS`` (H100, H200, A100), else None (CPUs, others)."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    key = gpu_named(torch.cuda.get_device_name(device))
    return GPU_PEAKS[key].peak_flops_per_s if key else None


@dataclass
class Throughput:
    """Tokens per second of a run, measured over its optimizer steps (training time only)."""

    processes: int
    flops_per_token: int
    peak_flops_per_s: float | None  # per process (one GPU each); None off a known GPU

    def record(self, tokens: int, train_s: float) -> dict:
        """The fields a result JSON carries for ``tokens`` trained (all processes) in ``train_s`` seconds."""
        total = tokens / train_s if train_s > 0 else 0.0
        fields = {"tokens_per_s": round(total, 1), "tokens_per_s_per_process": round(total / self.processes, 1),
                  "processes": self.processes, "model_flops_per_token": self.flops_per_token}
        if self.peak_flops_per_s:
            fields["mfu"] = round(self.mfu(total), 4)
            fields["mfu_formula"] = MFU_FORMULA
        return fields

    def mfu(self, tokens_per_s: float) -> float:
        """Model FLOPs utilisation at ``tokens_per_s`` in total (0 without a known peak)."""
        if not self.peak_flops_per_s:
            return 0.0
        return tokens_per_s * self.flops_per_token / (self.processes * self.peak_flops_per_s)

    def describe(self, tokens_per_s: float) -> str:
        """``1,234 tok/s (617/process), MFU 41.2%``: the pace for a plan line."""
        return f"{tokens_per_s:,.0f} tok/s" + (f" ({self.per_process(tokens_per_s)})" if self.per_process(tokens_per_s) else "")

    def per_process(self, tokens_per_s: float) -> str:
        """What a progress line adds to its tokens/s: per process (several processes), and MFU (a known GPU)."""
        parts = [f"{tokens_per_s / self.processes:,.0f} tok/s/process"] if self.processes > 1 else []
        if self.peak_flops_per_s:
            parts.append(f"MFU {100 * self.mfu(tokens_per_s):.1f}%")
        return ", ".join(parts)


def plan_line(tokens: int, steps: int, split, seq_len: int) -> str:
    """The run's plan before its first step: the budget in tokens, steps and sequences, and how a step's batch is split
    (``batches.StepSplit``)."""
    from ...progress import counted

    return (f"plan: {tokens:,} tokens = {counted(steps, 'step')} x {counted(split.batch_size, 'sequence')} "
            f"({split.describe()}) x {seq_len} tokens")


def projection_line(steps_timed: int, timed_s: float, steps_left: int, total_steps: int, tokens_per_step: int,
                    pace: Throughput) -> str:
    """The projected wall time of the whole budget from ``steps_timed`` steps that took ``timed_s`` seconds."""
    from ...progress import counted, format_duration

    per_step = timed_s / steps_timed
    return (f"projected: {format_duration(per_step * total_steps)} of training for the whole budget "
            f"({format_duration(per_step * steps_left)} left) at {pace.describe(tokens_per_step / per_step)}, "
            f"from the pace of {counted(steps_timed, 'step')}")


PROJECT_AFTER_STEPS = 3  # steps timed before the projection (the run's first step, with its one-time costs, is not)
