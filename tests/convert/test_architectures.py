"""Mistral (full attention) and Qwen2 convert to the same function; other architectures are refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

from ladderize.checkpoint.io import load_model
from ladderize.convert.conversion import convert_checkpoint
from ladderize.errors import LadderizeError

SHAPE = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=128)  # fmt: skip


def save_family_member(model_cls, config, path: Path):
    """Save a random family model (every bias made non-zero) at ``path``; return it in eval mode."""
    torch.manual_seed(0)
    model = model_cls(config).eval()
    with torch.no_grad():  # qwen2's q/k/v biases start at zero; make them matter
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_()
    model.save_pretrained(path)
    return model


@pytest.mark.parametrize(
    "model_cls,config",
    [
        (MistralForCausalLM, MistralConfig(**SHAPE, sliding_window=None)),
        (Qwen2ForCausalLM, Qwen2Config(**SHAPE)),
    ],
    ids=["mistral", "qwen2"],
)
def test_family_member_reproduced(model_cls, config, tmp_path: Path) -> None:
    reference = save_family_member(model_cls, config, tmp_path / "src")
    model = load_model(convert_checkpoint(str(tmp_path / "src"), tmp_path / "out"))
    ids = torch.randint(0, 96, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (reference(ids).logits - model(ids).logits).abs().max() <= 1e-4


def test_mistral_sliding_window_refused(tmp_path: Path) -> None:
    MistralForCausalLM(MistralConfig(**SHAPE, sliding_window=16)).save_pretrained(tmp_path / "src")
    with pytest.raises(LadderizeError, match="sliding_window"):
        convert_checkpoint(str(tmp_path / "src"), tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("ladder_layers,expected", [(2, ["dense", "dense", "ladder", "ladder"]), ([0, 2], ["ladder", "dense", "ladder", "dense"])])
def test_ladder_authors_format_converts_to_its_ladder_layers(ladder_layers, expected, tmp_path: Path, capfd) -> None:
    """A checkpoint in the Ladder authors' format (model_type llamaLadder, ladder_layers) keeps their layout."""
    import json

    from transformers import LlamaConfig, LlamaForCausalLM

    from ladderize.checkpoint.io import load_tokenizer
    from tests.conftest import TINY, char_tokenizer
    from tests.model.reference import reference_logits

    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**TINY)).save_pretrained(tmp_path / "authors")
    config_path = tmp_path / "authors" / "config.json"
    config = json.loads(config_path.read_text())
    config.update(  # the shape of their published configs: a Llama architecture name and their own model type
        model_type="llamaLadder",
        ladder_layers=ladder_layers,
        architectures=["LlamaForCausalLM"],
        auto_map={"AutoConfig": "modeling_llama_ladder.LlamaLadderConfig",
                  "AutoModelForCausalLM": "modeling_llama_ladder.LlamaLadderForCausalLM"},
    )  # fmt: skip
    config_path.write_text(json.dumps(config))
    char_tokenizer().save_pretrained(tmp_path / "authors")  # its auto_map must not make the tokenizer load ask or run code
    tokenizer_config = tmp_path / "authors" / "tokenizer_config.json"
    tokenizer_config.write_text(json.dumps({k: v for k, v in json.loads(tokenizer_config.read_text()).items()
                                            if k != "tokenizer_class"}))  # fmt: skip  (then transformers reads config.json)
    out = convert_checkpoint(str(tmp_path / "authors"), tmp_path / "out")
    assert "custom code" not in "".join(capfd.readouterr())  # no trust_remote_code prompt
    model = load_model(out)
    assert model.config.layer_modes == expected
    assert load_tokenizer(out)("ab").input_ids == char_tokenizer()("ab").input_ids
    ids = torch.randint(0, TINY["vocab_size"], (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():  # the plainly written reference of the ladder equations, on their meaning of ladder_layers
        want = reference_logits(model, ids, config=model.config)
        assert (model(ids).logits - want).abs().max() <= 1e-5
        dense = LlamaForCausalLM.from_pretrained(tmp_path / "authors", config=LlamaConfig(**TINY)).eval()
        assert (dense(ids).logits - want).abs().max() > 1e-3  # the ladder layers really change the function


@pytest.mark.parametrize("bad", [7, -1, [0, 9], "2"])
def test_ladder_authors_format_with_bad_ladder_layers_is_one_line(bad, tmp_path: Path) -> None:
    import json

    from transformers import LlamaConfig, LlamaForCausalLM

    from tests.conftest import TINY

    LlamaForCausalLM(LlamaConfig(**TINY)).save_pretrained(tmp_path / "authors")
    config_path = tmp_path / "authors" / "config.json"
    config_path.write_text(json.dumps({**json.loads(config_path.read_text()), "model_type": "llamaLadder", "ladder_layers": bad}))
    with pytest.raises(LadderizeError, match="ladder_layers"):
        convert_checkpoint(str(tmp_path / "authors"), tmp_path / "out")


def test_a_saved_tokenizer_class_is_renamed_to_the_name_transformers4_reads(tmp_path):
    import json

    from ladderize.checkpoint.architectures import name_tokenizer_class_portably

    for written, expected in [("TokenizersBackend", "PreTrainedTokenizerFast"), ("LlamaTokenizer", "LlamaTokenizer")]:
        (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": written, "model_max_length": 8}))
        name_tokenizer_class_portably(tmp_path)
        assert json.loads((tmp_path / "tokenizer_config.json").read_text()) == {"tokenizer_class": expected, "model_max_length": 8}
    name_tokenizer_class_portably(tmp_path / "no-tokenizer-here")  # nothing to rename: no error
