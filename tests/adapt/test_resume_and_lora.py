"""A resumed run is bit-identical to an uninterrupted one; a LoRA merge equals the unmerged model."""

from __future__ import annotations

import pytest
import torch

from ladderize.adapt.train.lora import LoraSpec, add_lora, merge_lora
from ladderize.adapt.plan.config import AdaptConfig
from ladderize.adapt.stage_run import adapt
from ladderize.checkpoint.io import load_model
from ladderize.errors import LadderizeError
from tests.conftest import tiny_model


@pytest.mark.parametrize("scope,objectives", [("converted", "local,lm"), ("lora", "kd")])
def test_resume_after_interruption_is_bit_identical(scope, objectives, spd_dir, text_file, tmp_path):
    common = dict(checkpoint=str(spd_dir), data=str(text_file), objectives=objectives, train=scope,
                  tokens=32 * 2 * 7, seq_len=32, batch_size=2, lr=1e-3, save_every=2)
    whole = adapt(AdaptConfig.from_flat(out=str(tmp_path / "whole"), **common))
    interrupted = AdaptConfig.from_flat(out=str(tmp_path / "resumed"), **common)
    partial = adapt(interrupted, stop_after_steps=5)  # "killed" during step 6; the last state is step 4
    assert partial.steps == 5 and not (tmp_path / "resumed").exists()
    with pytest.raises(LadderizeError, match="--resume"):
        adapt(interrupted)
    resumed = adapt(interrupted, resume=True)
    assert resumed.resumed_from_step == 4 and resumed.steps == whole.steps == 7
    assert [r["loss_total"] for r in resumed.curve] == [r["loss_total"] for r in whole.curve]
    a, b = load_model(tmp_path / "whole").state_dict(), load_model(tmp_path / "resumed").state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_resume_of_a_tied_model_trained_whole_is_bit_identical(text_file, tmp_path):
    """The resume state (a distributed checkpoint) holds a tensor shared by two names (the tied embedding and LM head
    of SmolLM2-like models): training every parameter and resuming must still give the same model, still tied."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from tests.adapt.conftest import convert
    from tests.conftest import TINY, char_tokenizer

    torch.manual_seed(3)
    LlamaForCausalLM(LlamaConfig(**{**TINY, "tie_word_embeddings": True})).save_pretrained(tmp_path / "dense")
    char_tokenizer().save_pretrained(tmp_path / "dense")
    ladder = convert(tmp_path / "dense", tmp_path / "ladder", ladder="2:4")
    common = dict(checkpoint=str(ladder), data=str(text_file), objectives="kd,lm", train="all",
                  tokens=32 * 2 * 5, seq_len=32, batch_size=2, lr=1e-3, save_every=2)
    whole = adapt(AdaptConfig.from_flat(out=str(tmp_path / "whole"), **common))
    interrupted = AdaptConfig.from_flat(out=str(tmp_path / "resumed"), **common)
    adapt(interrupted, stop_after_steps=3)  # the last state is step 2
    assert (tmp_path / "resumed.adapt-run" / "state" / "dcp" / ".metadata").is_file()
    resumed = adapt(interrupted, resume=True)
    assert resumed.resumed_from_step == 2 and [r["loss_total"] for r in resumed.curve] == [r["loss_total"] for r in whole.curve]
    a, b = load_model(tmp_path / "whole").state_dict(), load_model(tmp_path / "resumed").state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert torch.equal(b["model.embed_tokens.weight"], b["lm_head.weight"])  # still tied after training


def test_resume_refuses_changed_settings(ladder_dir, text_file, tmp_path):
    common = dict(checkpoint=str(ladder_dir), out=str(tmp_path / "o"), data=str(text_file), tokens=32 * 2 * 3, seq_len=32, batch_size=2, save_every=1)
    adapt(AdaptConfig.from_flat(**common), stop_after_steps=2)
    with pytest.raises(LadderizeError, match="lr"):
        adapt(AdaptConfig.from_flat(**{**common, "lr": 1e-2}), resume=True)


def test_resume_reads_a_state_saved_before_a_setting_was_added(tmp_path):
    """A run started before ``kd_divergence`` existed had its default: resuming it with the default is the same run."""
    from ladderize.adapt.train.training_state import check_fingerprint

    config = AdaptConfig.from_flat(checkpoint="c", out="o", objectives="kd")
    saved = {"fingerprint": {k: v for k, v in config.fingerprint().items() if k != "kd_divergence"}}
    check_fingerprint(saved, config, tmp_path)
    with pytest.raises(LadderizeError, match="started with different kd_divergence$"):
        check_fingerprint(saved, AdaptConfig.from_flat(checkpoint="c", out="o", objectives="kd", kd_divergence="reverse"), tmp_path)
    with pytest.raises(LadderizeError, match="started with different lr, tokens$"):
        check_fingerprint(saved, AdaptConfig.from_flat(checkpoint="c", out="o", objectives="kd", lr=1.0, tokens=7), tmp_path)


@pytest.mark.parametrize("modes", [["dense", "ladder", "ladder", "dense"], ["dense", "spd", "dense", "spd"]])
def test_lora_merge_equals_unmerged_model(modes):
    model = tiny_model(layer_modes=modes, spd_tp_size=3)
    ids = torch.randint(3, 128, (2, 24))
    before = model(ids).logits
    peft_model, adapters = add_lora(model, model.layout.converted_layers, LoraSpec(rank=4, alpha=8))
    assert torch.allclose(model(ids).logits, before)  # B starts at zero: exactly the converted model
    with torch.no_grad():
        for param in adapters:
            param.normal_(0, 0.1)
    unmerged = model(ids).logits
    assert (unmerged - before).abs().max() > 1e-3  # the adapters act, SPD's per-rank weight slices included
    model = merge_lora(peft_model)
    assert not any("lora" in name or "base_layer" in name for name in model.state_dict())
    assert torch.allclose(model(ids).logits, unmerged, atol=1e-5)
