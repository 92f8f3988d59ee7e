"""Fixtures for eval tests: a tiny checkpoint with a character tokenizer, and a tiny local data dir."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.conftest import TINY, char_tokenizer  # noqa: F401  (re-exported for the tests here)

PASSAGES = [
    "the cat sat on the mat and looked at the dog",
    "all the world is a stage and all the men and women merely players",
    "to be or not to be that is the question",
    "now is the winter of our discontent made glorious summer",
    "we few we happy few we band of brothers",
    "a horse a horse my kingdom for a horse",
]
TEXT = "\n\n".join(
    f"{p.capitalize()}.\nAnd then {p}, said the player once more." for p in PASSAGES * 3
)


def tiny_llama(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**TINY))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
    return model.eval()


@pytest.fixture(scope="session")
def tiny_dense_dir(tmp_path_factory) -> Path:
    """A plain transformers Llama checkpoint (random weights) with a tokenizer."""
    path = tmp_path_factory.mktemp("eval-dense") / "tiny-dense"
    tiny_llama().save_pretrained(path)
    char_tokenizer().save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_ladder_dir(tiny_dense_dir: Path, tmp_path_factory) -> Path:
    from ladderize.convert.conversion import convert_checkpoint

    return convert_checkpoint(str(tiny_dense_dir), tmp_path_factory.mktemp("eval-ladder") / "tiny-ladder", ladder="2:4")


@pytest.fixture(scope="session")
def tiny_data_dir(tmp_path_factory) -> Path:
    """A data dir shaped like ../shared/data: lambada_openai/lambada_test.jsonl and wikitext-2/valid.txt."""
    root = tmp_path_factory.mktemp("eval-data")
    (root / "lambada_openai").mkdir()
    (root / "lambada_openai" / "lambada_test.jsonl").write_text("".join(json.dumps({"text": p}) + "\n" for p in PASSAGES))
    (root / "wikitext-2").mkdir()
    (root / "wikitext-2" / "valid.txt").write_text(TEXT)
    return root
