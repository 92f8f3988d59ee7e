"""peft LoRA: the adapter saved by ``adapt`` loads with ``PeftModel.from_pretrained`` and equals the merged checkpoint."""

from __future__ import annotations

import json

import pytest
import torch

from ladderize.adapt.plan.config import AdaptConfig
from ladderize.adapt.stage_run import adapt
from ladderize.checkpoint.io import load_model, read_provenance
from ladderize.errors import LadderizeError
from tests.adapt.conftest import convert


@pytest.mark.parametrize("layout", [{"ladder": "2:4"}, {"spd": "1:4", "spd_tp_size": 3}, {"ladder": "3:4", "spd": "1:3", "spd_tp_size": 3}],
                         ids=["ladder", "spd", "hybrid"])
def test_saved_adapter_loads_with_peft_and_equals_merged(layout, dense_dir, text_file, tmp_path):
    from peft import PeftModel

    base_dir = convert(dense_dir, tmp_path / "base", **layout)
    out = tmp_path / "adapted"
    adapt(AdaptConfig.from_flat(checkpoint=str(base_dir), out=str(out), data=str(text_file), objectives="kd", train="lora",
                      tokens=32 * 2 * 3, seq_len=32, batch_size=2, lr=2e-2, lora_rank=4, lora_alpha=8))
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in (out / "adapter").iterdir()}
    config = json.loads((out / "adapter" / "adapter_config.json").read_text())
    converted = load_model(base_dir).layout.converted_layers
    assert config["peft_type"] == "LORA" and config["r"] == 4 and sorted(config["layers_to_transform"]) == converted
    assert read_provenance(out)["history"][-1]["adapter"] == "adapter"

    ids = torch.randint(3, 100, (2, 20))
    base = load_model(base_dir).eval()
    with torch.no_grad():
        base_logits = base(ids).logits
        peft = PeftModel.from_pretrained(base, str(out / "adapter")).eval()
        adapted = peft(input_ids=ids).logits
        merged = load_model(out).eval()(ids).logits
    assert (adapted - base_logits).abs().max() > 1e-3  # the adapter trained and acts
    assert (adapted - merged).abs().max() <= 1e-5
    # only the converted layers changed in the merged checkpoint
    before, after = load_model(base_dir).state_dict(), load_model(out).state_dict()
    changed = {k.split(".")[2] for k in after if not torch.equal(after[k], before[k])}
    assert changed and {int(i) for i in changed} <= set(converted)


def test_lora_refuses_a_layout_without_converted_layers(dense_dir, text_file, tmp_path):
    with pytest.raises(LadderizeError, match="no converted layers"):
        adapt(AdaptConfig.from_flat(checkpoint=str(dense_dir), out=str(tmp_path / "o"), data=str(text_file), train="lora",
                          objectives="kd", teacher=str(dense_dir), tokens=64, seq_len=32, batch_size=2))
