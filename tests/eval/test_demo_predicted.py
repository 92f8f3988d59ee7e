"""The demo's report shows, beside the CPU bench's speed-ups, what ``ladderize predict`` gives for the same layout on a
GPU node, labelled as predicted (issue 37 item 5)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ladderize.demo.pipeline import QUICK, predicted_speedups
from ladderize.records import EvalRecord
from ladderize.report import write_report


@pytest.fixture
def ladder_ckpt(tiny_llama_dir: Path, tmp_path: Path) -> Path:
    from ladderize.convert.conversion import convert_checkpoint

    return convert_checkpoint(str(tiny_llama_dir), tmp_path / "ladder", ladder="2:4")


def test_predicted_speedups_come_from_predict_for_the_same_layout(ladder_ckpt: Path) -> None:
    predicted = predicted_speedups({"ladder": ladder_ckpt}, QUICK)
    assert "h100-nvlink" in predicted.label and "roofline" in predicted.label
    assert set(predicted.speedups) == {"ladder 2:4"}
    assert set(predicted.speedups["ladder 2:4"]) == {(QUICK.tp, b) for b in QUICK.bench_batches}
    assert all(value > 0 for value in predicted.speedups["ladder 2:4"].values())


def test_report_shows_the_predicted_column_labelled(ladder_ckpt: Path, tmp_path: Path) -> None:
    record = EvalRecord(checkpoint=str(ladder_ckpt), layout="ladder 2:4", layout_ranges={}, num_layers=4, layers_converted=2,
                        allreduces_per_decode_step=8, overlappable_allreduces_per_decode_step=4, history=["convert"],
                        lm_eval={}, results={"shakespeare": {"word_perplexity,none": 30.0}})
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "ladder.json").write_text(json.dumps(record.to_json()))
    predicted = predicted_speedups({"ladder": ladder_ckpt}, QUICK)
    written = write_report([tmp_path / "runs"], tmp_path / "report", predicted=predicted)
    text = written["markdown"].read_text()
    value = predicted.speedups["ladder 2:4"][(QUICK.tp, 1)]
    assert f"predicted decode speed-up TP{QUICK.tp} b1" in text and f"{value:.2f}x" in text
    assert "a model, not a measurement" in text and predicted.label in text
    assert f"predicted_decode_speedup_vs_dense/tp{QUICK.tp}/batch1" in written["csv"].read_text()
