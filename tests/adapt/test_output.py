"""adapt's OUT for sharing: the model card gains the adaptation record, the provenance keeps no absolute path."""

from __future__ import annotations

import json

from ladderize.adapt.plan.config import AdaptConfig
from ladderize.adapt.stage_run import adapt
from ladderize.checkpoint.architectures import PROVENANCE_FILE, read_provenance


def test_adapt_writes_its_run_into_the_card_and_relative_paths(ladder_dir, dense_dir, text_file, tmp_path):
    out = tmp_path / "adapted"
    adapt(AdaptConfig.from_flat(checkpoint=str(ladder_dir), out=str(out), data=str(text_file), objectives="local,kd",
                      tokens=32 * 2 * 2, seq_len=32, batch_size=2, lr=1e-3))  # fmt: skip
    raw = (out / PROVENANCE_FILE).read_text()
    assert '"/' not in raw, [line for line in raw.splitlines() if '"/' in line]  # no absolute path anywhere
    last = json.loads(raw)["history"][-1]
    assert last["step"] == "adapt" and last["from"].startswith("../") and last["data"].endswith("train.txt")
    record = read_provenance(out)
    assert record["history"][-1]["from"] == str(ladder_dir) and record["source"]["path"] == str(dense_dir)
    card = (out / "README.md").read_text()
    assert "| 2:4 | ladder |" in card and "## Adaptation" in card and "None: converted zero-shot" not in card
    assert "`ladderize adapt` on ladder 2:4" in card and "- objectives: " in card and "- steps: 2" in card
    assert "measured at the last step: " in card
