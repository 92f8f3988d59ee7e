"""save_pretrained / from_pretrained round trips, Auto-class registration and tied embeddings."""

from __future__ import annotations

import json

import torch
import transformers
from tests.conftest import tiny_model
from transformers import LlamaConfig, LlamaForCausalLM

import ladderize
from ladderize.model import LadderLlamaConfig, LadderLlamaForCausalLM, LayerMode

from .helpers import ATOL, logits, logits_without_ladderize, max_diff, token_ids

HYBRID_WITH_ORDER = dict(
    layer_modes=["ladder", "spd", "dense", "spd"],
    spd_tp_size=3,
    spd_head_order=[None, [2, 0, 1], None, [1, 2, 0]],
)


def test_round_trip_is_exact_and_keeps_the_layout(tmp_path):
    model = tiny_model(**HYBRID_WITH_ORDER)
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model_type"] == "ladder_llama"
    assert saved["layer_modes"] == HYBRID_WITH_ORDER["layer_modes"]

    loaded = LadderLlamaForCausalLM.from_pretrained(tmp_path).eval()
    assert loaded.config.layer_modes == HYBRID_WITH_ORDER["layer_modes"]
    assert loaded.config.spd_tp_size == 3
    assert loaded.config.spd_head_order == HYBRID_WITH_ORDER["spd_head_order"]
    assert loaded.layout == model.layout
    assert [layer.mode for layer in loaded.model.layers] == [LayerMode(m) for m in HYBRID_WITH_ORDER["layer_modes"]]

    ids = token_ids()
    assert torch.equal(logits(loaded, ids), logits(model, ids))
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name


def test_auto_model_resolves_after_import(tmp_path):
    assert ladderize.LadderLlamaForCausalLM is LadderLlamaForCausalLM  # `import ladderize` registered the Auto classes
    model = tiny_model(**HYBRID_WITH_ORDER)
    model.save_pretrained(tmp_path)
    assert isinstance(transformers.AutoConfig.from_pretrained(tmp_path), LadderLlamaConfig)
    auto = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(auto) is LadderLlamaForCausalLM
    ids = token_ids()
    assert torch.equal(logits(auto, ids), logits(model, ids))


def test_tied_embeddings_survive_a_round_trip(tmp_path):
    model = tiny_model(tie_word_embeddings=True, layer_modes=["dense", "ladder", "ladder", "spd"], spd_tp_size=3)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    model.save_pretrained(tmp_path)
    loaded = LadderLlamaForCausalLM.from_pretrained(tmp_path).eval()
    assert loaded.config.tie_word_embeddings
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight
    ids = token_ids()
    assert torch.equal(logits(loaded, ids), logits(model, ids))
    with torch.no_grad():  # still one tensor: editing the embedding moves the head
        loaded.model.embed_tokens.weight[5] += 1.0
    assert torch.equal(loaded.lm_head.weight[5], loaded.model.embed_tokens.weight[5])


def test_dense_llama_checkpoint_loads_unchanged(tiny_llama_dir):
    """Parameter names are Llama's: a plain checkpoint loads into any layout with no missing keys."""
    base = LlamaConfig.from_pretrained(tiny_llama_dir).to_dict()
    config = LadderLlamaConfig(**{**base, "layer_modes": ["dense", "dense", "ladder", "ladder"]})
    model, info = LadderLlamaForCausalLM.from_pretrained(tiny_llama_dir, config=config, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    llama = LlamaForCausalLM.from_pretrained(tiny_llama_dir).eval()
    for name, tensor in llama.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor), name
    dense = LadderLlamaForCausalLM.from_pretrained(tiny_llama_dir, config=LadderLlamaConfig(**base)).eval()
    ids = token_ids()
    assert max_diff(logits(dense, ids), logits(llama, ids)) <= ATOL


CODE_FILES = ("configuration_ladder_llama.py", "modeling_ladder_llama.py", "layout.py", "residual.py", "block.py")


def test_saving_through_the_registered_class_writes_a_checkpoint_that_loads_without_ladderize(tmp_path):
    """``import ladderize`` + Auto classes load ladderize's own class; its saves (save_pretrained, and
    so push_to_hub / Trainer.save_model / peft's merged model) carry the code files auto_map names."""
    tiny_model(**HYBRID_WITH_ORDER).save_pretrained(tmp_path / "first")
    auto = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "first").eval()
    assert type(auto) is LadderLlamaForCausalLM
    for name in CODE_FILES:  # as a plain from-scratch save wrote them
        (tmp_path / "first" / name).unlink()
    auto.save_pretrained(tmp_path / "saved")
    assert all((tmp_path / "saved" / name).is_file() for name in CODE_FILES)
    assert json.loads((tmp_path / "saved" / "config.json").read_text())["auto_map"]["AutoConfig"] == (
        "configuration_ladder_llama.LadderLlamaConfig"
    )
    ids = token_ids()
    remote = logits_without_ladderize(tmp_path / "saved", ids, tmp_path)
    assert max_diff(remote, logits(auto, ids)) <= ATOL


def test_a_merged_peft_model_saves_loadable_code(tmp_path):
    from peft import LoraConfig, get_peft_model

    model = tiny_model(layer_modes=["dense", "ladder", "ladder", "dense"])
    peft_model = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    merged = peft_model.merge_and_unload().eval()
    merged.save_pretrained(tmp_path / "merged")
    assert all((tmp_path / "merged" / name).is_file() for name in CODE_FILES)
    ids = token_ids(batch=1)
    assert max_diff(logits_without_ladderize(tmp_path / "merged", ids, tmp_path), logits(merged, ids)) <= ATOL


def _converted(tiny_llama_dir, tmp_path):
    from ladderize.convert.conversion import convert_checkpoint

    return convert_checkpoint(str(tiny_llama_dir), tmp_path / "converted", ladder="2:")


def test_save_pretrained_of_a_loaded_checkpoint_keeps_its_card_and_provenance(tiny_llama_dir, tmp_path):
    from ladderize.checkpoint.io import read_provenance

    converted = _converted(tiny_llama_dir, tmp_path)
    model = transformers.AutoModelForCausalLM.from_pretrained(converted)
    model.save_pretrained(tmp_path / "elsewhere" / "saved")
    saved = tmp_path / "elsewhere" / "saved"
    card = (saved / "README.md").read_text()
    assert "- ladderize" in card and "ladder" in card and "# saved" in card, card[:400]
    assert "automatically generated" not in card
    # the provenance travels, its relative paths rebased on the new folder: it still names the same source
    assert read_provenance(saved)["source"] == read_provenance(converted)["source"]
    assert json.loads((saved / "ladderize.json").read_text()) != json.loads((converted / "ladderize.json").read_text())


def test_push_to_hub_uploads_ladderizes_card_not_the_template(tiny_llama_dir, tmp_path, monkeypatch):
    """The hub is out of reach here: its two endpoints are replaced by ones that record what would be sent."""
    import huggingface_hub
    from huggingface_hub.errors import EntryNotFoundError

    model = transformers.AutoModelForCausalLM.from_pretrained(_converted(tiny_llama_dir, tmp_path))
    uploaded: dict[str, bytes] = {}

    def create_repo(self, repo_id, **kwargs):
        return huggingface_hub.RepoUrl(f"https://huggingface.co/{repo_id}")

    def create_commit(self, repo_id, operations, **kwargs):
        for op in operations:
            uploaded[op.path_in_repo] = open(op.path_or_fileobj, "rb").read()

    def no_card(*args, **kwargs):
        raise EntryNotFoundError("no README.md yet")

    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", create_repo)
    monkeypatch.setattr(huggingface_hub.HfApi, "create_commit", create_commit)
    monkeypatch.setattr(huggingface_hub.ModelCard, "load", classmethod(lambda cls, *a, **k: no_card()))
    model.push_to_hub("someone/tiny-ladder")
    assert {"config.json", "README.md", "ladderize.json", "modeling_ladder_llama.py"} <= set(uploaded)
    card = uploaded["README.md"].decode()
    assert "- ladderize" in card and "automatically generated" not in card, card[:400]
