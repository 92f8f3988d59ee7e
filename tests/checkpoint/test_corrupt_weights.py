"""Non-finite (NaN/Inf) weights behind a valid header: one line and exit 2 wherever the weights are read
(convert, generate, load_model), and non-finite logits stop generation instead of returning token 0."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.cli_helpers import error_lines, run_cli
from tests.runtime.runtime_helpers import TINY_TP23, save_char_tokenizer, save_tiny


def _poison(path: Path, name: str = "model.layers.1.mlp.up_proj.weight") -> None:
    """Overwrite part of one tensor with NaN and Inf, as a damaged disk block would (the header stays valid)."""
    weights = load_file(path / "model.safetensors")
    flat = weights[name].view(-1)
    flat[: flat.numel() // 3] = float("nan")
    flat[-3:] = float("inf")
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})


def _assert_one_line(code: int, err: str, pattern: str) -> None:
    lines = error_lines(err)
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("error:") and pattern in lines[0], err
    assert "Traceback" not in err


def test_convert_refuses_nan_weights(tiny_llama_dir: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    _poison(tiny_llama_dir)
    out = tmp_path / "out"
    code, _, err = run_cli(["convert", tiny_llama_dir, out, "--ladder", "2:"], capsys, monkeypatch)
    _assert_one_line(code, err, "tensor model.layers.1.mlp.up_proj.weight has")
    assert "non-finite values (NaN/Inf)" in err
    assert not out.exists()


def test_generate_refuses_nan_weights(tmp_path: Path, capsys, monkeypatch) -> None:
    path = tmp_path / "ckpt"
    save_tiny(path, **TINY_TP23)
    save_char_tokenizer(path)
    _poison(path)
    code, out, err = run_cli(["generate", path, "--prompt", "hello", "--max-new-tokens", "4", "--json"], capsys, monkeypatch)
    _assert_one_line(code, err, "non-finite values (NaN/Inf)")
    assert out == ""


def test_load_model_refuses_nan_weights(tiny_llama_dir: Path) -> None:
    from ladderize.errors import LadderizeError
    from ladderize.checkpoint.io import load_model

    _poison(tiny_llama_dir, "model.norm.weight")
    with pytest.raises(LadderizeError, match="model.norm.weight has .* non-finite"):
        load_model(tiny_llama_dir)


def test_non_finite_logits_stop_generation() -> None:
    """Finite weights whose activations overflow (a float16 run) give NaN logits: one line, not tokens [0, 0, ...]."""
    from ladderize.errors import LadderizeError
    from ladderize.runtime.decode import generate_on_rank

    class NanDecoder:
        def prefill(self, ids: torch.Tensor) -> torch.Tensor:
            return torch.full((ids.shape[0], ids.shape[1], 16), float("nan"))

        def extend(self, ids: torch.Tensor, position: int) -> torch.Tensor:
            return torch.full((ids.shape[0], 1, 16), float("nan"))

    with pytest.raises(LadderizeError, match="non-finite logits"):
        generate_on_rank(NanDecoder(), torch.tensor([[1, 2, 3]]), 4)


def test_finite_weights_still_convert(tiny_llama_dir: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    code, _, err = run_cli(["convert", tiny_llama_dir, tmp_path / "out", "--ladder", "2:"], capsys, monkeypatch)
    assert code == 0, err
    assert json.loads((tmp_path / "out" / "config.json").read_text())["num_hidden_layers"] == 4
