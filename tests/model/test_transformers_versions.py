"""What ladderize writes, read by other transformers versions (.venv-tf4, from scripts/setup_tf4.sh).

transformers 4 (the newest 4.x): a plain Llama checkpoint (what ``pull`` writes) loads there with the
logits transformers 5 gives; a converted one is refused in one line that names the transformers it needs.
The lowest transformers pyproject allows (5.4.0): ladderize itself loads, saves and reloads a hybrid there,
with the logits of this venv's transformers.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from ladderize.convert.conversion import convert_checkpoint
from ladderize.model.configuration_ladder_llama import TRANSFORMERS_REQUIREMENT
from tests.conftest import TINY

from .helpers import ATOL, logits, logits_without_ladderize, max_diff, token_ids

ROOT = Path(__file__).resolve().parents[2]
TF4_PYTHON = ROOT / ".venv-tf4" / "bin" / "python"
LOWEST = ROOT / ".venv-tf4" / "transformers-lowest"
needs_tf4 = pytest.mark.skipif(not LOWEST.is_dir(), reason="no .venv-tf4 (bash scripts/setup_tf4.sh builds it)")

ROPES = {
    "default": {"rope_type": "default", "rope_theta": 100000.0},  # SmolLM2's theta: a 4.x default (10000) differs
    "llama3": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
}  # fmt: skip


def _plain_checkpoint(tmp_path: Path, rope: str) -> tuple[Path, LlamaForCausalLM]:
    torch.manual_seed(0)
    source = LlamaForCausalLM(LlamaConfig(**TINY, rope_parameters=dict(ROPES[rope]))).eval()
    source.save_pretrained(tmp_path / "source")
    return convert_checkpoint(str(tmp_path / "source"), tmp_path / "plain", plain=True), source


@pytest.mark.parametrize("rope", sorted(ROPES))
def test_plain_checkpoint_keeps_the_fields_a_transformers4_reader_uses(tmp_path, rope):
    out, source = _plain_checkpoint(tmp_path, rope)
    config = json.loads((out / "config.json").read_text())
    assert config["rope_theta"] == ROPES[rope]["rope_theta"]
    assert config["rope_scaling"] == (None if rope == "default" else {k: v for k, v in ROPES[rope].items() if k != "rope_theta"})
    assert config["rope_parameters"] == ROPES[rope]
    again = LlamaForCausalLM.from_pretrained(out).eval()  # transformers 5 reads the same rope from both
    assert again.config.rope_parameters == ROPES[rope]
    ids = token_ids(seq=96)  # past original_max_position_embeddings: llama3's scaling matters
    assert torch.equal(logits(again, ids), logits(source, ids))


@needs_tf4
@pytest.mark.parametrize("rope", sorted(ROPES))
def test_plain_checkpoint_has_equal_logits_on_transformers4(tmp_path, rope):
    out, source = _plain_checkpoint(tmp_path, rope)
    ids = token_ids(seq=96)
    assert max_diff(logits_without_ladderize(out, ids, tmp_path, python=str(TF4_PYTHON), remote=False), logits(source, ids)) <= ATOL


@needs_tf4
def test_converted_checkpoint_is_refused_on_transformers4_in_one_line(tiny_llama_dir, tmp_path):
    out = convert_checkpoint(str(tiny_llama_dir), tmp_path / "ladder", ladder="2:")
    with pytest.raises(subprocess.CalledProcessError) as failed:
        logits_without_ladderize(out, token_ids(), tmp_path, python=str(TF4_PYTHON))
    last = failed.value.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: ladder_llama checkpoints need") and TRANSFORMERS_REQUIREMENT in last, last


@needs_tf4
def test_lowest_supported_transformers_loads_saves_and_reloads_with_equal_logits(tiny_llama_dir, tmp_path):
    out = convert_checkpoint(str(tiny_llama_dir), tmp_path / "hybrid", ladder="2:", spd="0:1", spd_tp_size=3)
    ids = token_ids()
    from ladderize.checkpoint.io import load_model

    want = logits(load_model(out), ids)
    torch.save(ids, tmp_path / "ids.pt")
    script = f"""
import torch, transformers
assert transformers.__version__ == "5.4.0", transformers.__version__
import ladderize
from ladderize.checkpoint.io import load_model
model = transformers.AutoModelForCausalLM.from_pretrained({str(out)!r}).eval()
assert type(model).__module__ == "ladderize.model.modeling_ladder_llama"
model.save_pretrained({str(tmp_path / "saved")!r})
with torch.no_grad():
    torch.save(load_model({str(tmp_path / "saved")!r})(torch.load({str(tmp_path / "ids.pt")!r})).logits, {str(tmp_path / "low.pt")!r})
"""
    env = {**os.environ, "PYTHONPATH": f"{LOWEST}{os.pathsep}{ROOT}", "HF_HUB_OFFLINE": "1"}
    run = subprocess.run([str(TF4_PYTHON), "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert max_diff(torch.load(tmp_path / "low.pt"), want) <= ATOL


@needs_tf4
@pytest.mark.parametrize("plain", [True, False], ids=["plain", "converted"])
def test_the_written_tokenizer_loads_on_transformers4_with_the_same_ids(tiny_llama_dir, tmp_path, plain):
    """transformers 5 names a fast tokenizer's class ``TokenizersBackend``; ladderize writes the name 4.x reads too."""
    from ladderize.synthetic import char_tokenizer

    tokenizer = char_tokenizer()
    tokenizer.save_pretrained(tiny_llama_dir)
    out = convert_checkpoint(str(tiny_llama_dir), tmp_path / "out", plain=plain, ladder=None if plain else "2:")
    assert json.loads((out / "tokenizer_config.json").read_text())["tokenizer_class"] == "PreTrainedTokenizerFast"
    text = "To be, or not to be"
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(out)(text).input_ids == tokenizer(text).input_ids
    script = f"from transformers import AutoTokenizer; print(AutoTokenizer.from_pretrained({str(out)!r}, trust_remote_code=False)({text!r}).input_ids)"
    env = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "PATH": "/usr/bin:/bin"}
    run = subprocess.run([str(TF4_PYTHON), "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert json.loads(run.stdout.strip().splitlines()[-1]) == tokenizer(text).input_ids


@needs_tf4
def test_generation_tests_pass_on_the_lowest_supported_transformers(tmp_path):
    """tests/model/test_generation.py (cached against uncached generate, every layout, left padding) under 5.4.0;
    the rest of the suite runs them on the locked version (locks/main.txt)."""
    env = {**os.environ, "PYTHONPATH": f"{LOWEST}{os.pathsep}{ROOT}", "HF_HUB_OFFLINE": "1"}
    check = subprocess.run([str(TF4_PYTHON), "-c", "import transformers; print(transformers.__version__)"], env=env,
                           capture_output=True, text=True, timeout=120)
    assert check.stdout.strip() == "5.4.0", check.stdout + check.stderr[-2000:]
    run = subprocess.run(
        [str(TF4_PYTHON), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "--timeout", "300",
         str(ROOT / "tests" / "model" / "test_generation.py")],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert " passed" in run.stdout.strip().splitlines()[-1] and "failed" not in run.stdout.strip().splitlines()[-1]
