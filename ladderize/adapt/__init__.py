"""Adaptation of converted layers: data, objectives, trainer, LoRA, sensitivity, head grouping."""
