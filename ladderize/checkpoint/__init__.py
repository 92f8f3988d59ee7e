"""Checkpoint I/O and policy: what ladderize does *with* the portable model (``ladderize.model``).

Config reading and building, the one checkpoint writer and loader (``io``), safetensors files
(``tensor_files``), tensor-name templates and source formats (``architectures``), temp-then-rename
outputs (``atomic``), device and dtype (``placement``), shapes and the preset table (``shapes``),
the model card (``card``) and the registration with transformers' Auto classes (``auto_classes``).
None of it travels inside a checkpoint. Importing this package imports nothing.
"""
