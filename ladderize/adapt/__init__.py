"""Adaptation of converted layers: recipes and stages, objectives, joint, sequential and sharded training, LoRA,
the run's state and pace. Calibration text comes from ``corpus``, the teacher and head grouping from ``convert``."""
