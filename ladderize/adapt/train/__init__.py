"""Training a joint stage: the one loop over a strategy's run (one process, replicated, sharded), its state, deadline,
logging and write-out."""
