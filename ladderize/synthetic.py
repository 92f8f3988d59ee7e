"""Pieces of synthetic checkpoints (random weights, for benchmarks and tests): a character-level tokenizer.

A random Llama has no tokenizer of its own; ``ladderize adapt`` and ``eval`` need one to read
text. ``char_tokenizer`` maps each character to one id: ``<pad>``=0, ``<s>``=1, ``</s>``=2,
``<unk>``=3, then newline and printable ASCII (100 ids), so any vocabulary of at least 100 fits.
"""

from __future__ import annotations


def char_tokenizer():
    """A character-level ``PreTrainedTokenizerFast`` (100 ids; see the module docstring)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, "\n": 4}
    for code in range(32, 127):
        vocab[chr(code)] = len(vocab)
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
