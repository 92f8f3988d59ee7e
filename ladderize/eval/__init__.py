"""Accuracy measurement: lm-eval on ladderize models (harness, local tasks) and a quick perplexity helper."""
