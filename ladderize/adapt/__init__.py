"""Adaptation of converted layers, in rooms that import one way (top first): ``entrance`` (the one entrance: the
plan, the lock, the process group), ``recipe_run`` (a plan's stages in order) and ``stage_run`` (one stage, joint
or sequential), ``sequential/`` (the sequential stage), ``train/`` (the joint stages' one loop and its strategies'
runs, the training state, the deadline, OUT), ``layers/`` (what both read from disk), ``plan/`` (the settings, stages,
budget, strategy and price, before any weight loads), ``objectives/`` (the losses and their registry). Calibration text
comes from ``corpus``, the teacher and head grouping from ``convert``."""
