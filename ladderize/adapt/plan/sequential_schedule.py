"""How a sequential stage's work is counted: its groups of layers, each group's epochs and steps, its states held.

The sequential training (``layer_training.py``, run by ``sequential_run.py``) trains the converted layers in groups of
consecutive layers (``layer_windows``, ``window`` at a time), each group for its epochs (``window_epochs``: ``epochs``,
ramped over the depth by ``epochs_ramp``) in whole optimizer steps (``window_steps``), on cached calibration states of
which ``state_copies`` ``[N, S, D]`` tensors are alive at once; a later joint stage reads the teacher's states it
stores where its windows are those rows (``reads_stored_teacher``: the plan's guess; ``teacher_states.py``: the files).
The plan (``adapt_plan.py``), the pricing (``cost.py``) and the budget (``budget.py``) count the same things from the same
functions, so what a plan counts is what runs.

Plain arithmetic on settings and shapes: no torch, nothing of the training imported.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from .planned_stage import PlannedStage

STATE_COPIES = 8  # [N, S, D] tensors alive at once: teacher in/out and student in pairs, plus a new student pair


def state_copies(window: int = 1) -> int:
    """``[N, S, D]`` state tensors alive at once when ``window`` layers train together: ``STATE_COPIES``, plus the
    teacher's output pair of each layer of the window past the first."""
    return STATE_COPIES + 2 * (window - 1)


def steps_per_layer(num_sequences: int, epochs: float, batch_size: int) -> int:
    """Optimizer steps each converted layer takes: ``epochs`` passes over the calibration set."""
    return max(1, math.ceil(epochs * num_sequences / batch_size))


def window_epochs(converted: list[int] | set[int], epochs: float, ramp: float, window: int) -> dict[int, float]:
    """The epochs of each group of layers the sequential stage trains together (``layer_windows``, keyed by the
    group's first layer): the mean of its layers' ``layer_epochs``."""
    ramped = {index: layer_epochs(epochs, ramp, position, len(converted)) for position, index in enumerate(sorted(converted))}
    return {group[0]: sum(ramped[i] for i in group) / len(group) for group in layer_windows(converted, window)}


def window_steps(epochs: dict[int, float], num_sequences: int, batch_size: int) -> dict[int, int]:
    """The optimizer steps of each window of ``window_epochs``: its epochs over ``num_sequences`` calibration
    sequences, ``batch_size`` a step (the sequential stage's count, which its plan counts too)."""
    return {start: steps_per_layer(num_sequences, share, batch_size) for start, share in epochs.items()}


def layer_epochs(epochs: float, ramp: float, position: int, count: int) -> float:
    """Epochs of the ``position``-th of ``count`` converted layers (0: the lowest) under ``epochs_ramp``.

    ``epochs x (1 + ramp x (2 position / (count - 1) - 1))``: a straight line from ``(1 - ramp) x epochs`` at the
    lowest layer to ``(1 + ramp) x epochs`` at the highest, so the layers' mean stays ``epochs`` (and with it the
    stage's token passes and the budget's plan); ``ramp`` 0 trains every layer alike, a negative one trains the
    lower layers more.
    """
    if count < 2 or ramp == 0:
        return epochs
    return epochs * (1 + ramp * (2 * position / (count - 1) - 1))


def layer_windows(converted: list[int] | set[int], window: int) -> list[list[int]]:
    """The converted layers in the groups the sequential stage trains together: runs of consecutive layers cut
    into pieces of ``window`` (a run's last piece may be shorter; a layer not converted ends a run)."""
    groups: list[list[int]] = []
    for index in sorted(converted):
        if groups and groups[-1][-1] == index - 1 and len(groups[-1]) < window:
            groups[-1].append(index)
        else:
            groups.append([index])
    return groups


def reads_kept_states(stage: PlannedStage, before: PlannedStage) -> bool:
    """Whether joint stage ``stage`` can read the teacher's states sequential stage ``before`` keeps: it trains the
    converted layers with ``kd`` and/or ``lm`` only, on the same data and sequence length (as each stage resolves them:
    one that sets the default and one left to it read the same text)."""
    from ..objectives.registry import STORED_TEACHER_OBJECTIVES, parse_objectives

    objectives = set(parse_objectives(str(stage.resolved.objective.objectives)))
    mine, theirs = stage.resolved.training, before.resolved.training
    return (before.sequential and not stage.sequential
            and stage.resolved.scope.train != "all" and objectives <= STORED_TEACHER_OBJECTIVES
            and (theirs.data, theirs.seq_len) == (mine.data, mine.seq_len))


def reads_stored_teacher(stages: Sequence[PlannedStage], index: int, data_tokens: int | None = None) -> bool:
    """Whether stage ``index`` will read the teacher's states a sequential stage before it stores
    (``reads_kept_states``), for windows (its tokens, at most the ``data_tokens`` the data
    holds) within the rows that stage stores: its calibration set and the batch of held-out rows after it. The stage
    itself checks its windows token for token (a batch with a row outside runs the teacher); this is the plan's guess."""
    stage = stages[index]
    reads = stage.tokens if data_tokens is None else min(stage.tokens, data_tokens)
    return any(reads_kept_states(stage, before) and reads <= before.tokens + before.resolved.training.tokens_per_step
               for before in stages[:index])


def keeps_teacher_states(stages: Sequence[PlannedStage], index: int) -> bool:
    """Whether stage ``index`` is a sequential stage whose teacher states a later stage can read."""
    return any(reads_kept_states(stage, stages[index]) for stage in stages[index + 1:])


def gathers_teacher(stage: PlannedStage, processes: int) -> bool:
    """Whether joint stage ``stage`` on ``processes`` runs a teacher whose layers gather across the ranks (sharded over
    more than one process): its ranks run it together or not at all, so it reads stored states only for a micro-batch
    whose rows are stored on every rank (``trainer._all_stored``)."""
    from .strategy_choice import choose_strategy

    return processes > 1 and choose_strategy(stage.resolved, processes).shards


def rows_read(stages: Sequence[PlannedStage], index: int, processes: int = 1) -> int:
    """How many of its first sequences' teacher states sequential stage ``index`` stores: as many as the later stages
    that read them (``reads_kept_states``) take windows (a joint stage's tokens rounded up to whole steps of its global
    batch, ``batch_size`` sequences on any process count: ``batches.StepSplit``); 0 where none reads them.

    A later stage whose teacher gathers across ``processes`` (``gathers_teacher``) reads stored states only where all
    of a micro-batch's rows are stored: it counts where the sequential stage's calibration set holds every window it
    takes (then each is read), and not at all otherwise (a few micro-batches would read a few of them)."""
    rows = 0
    before = stages[index].resolved
    calibration = before.training.sequences
    for stage in stages[index + 1:]:
        if reads_kept_states(stage, stages[index]):
            training = stage.resolved.training
            windows = training.steps * training.batch_size
            if gathers_teacher(stage, processes) and windows > calibration:
                continue
            rows = max(rows, windows)
    return rows
