"""Training and calibration text as tokens: a data spec's documents (``documents``), tokenized once into a
memory-mapped store (``token_store``), read as sequences of ``seq_len`` tokens (``windows``). Read by adapt,
sensitivity, head grouping and ``ladderize tokenize``. Importing this package imports nothing."""
