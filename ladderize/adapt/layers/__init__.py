"""What both stage kinds read from disk: a model's layers one at a time from safetensors, a finished layer's file, and
the teacher's states a sequential stage keeps for the stages after it."""
