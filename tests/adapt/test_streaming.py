"""The sequential schedule streamed one layer at a time: the same bits as in memory, states on disk, each layer written when done, exact resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from ladderize.adapt.plan.config import AdaptConfig
from ladderize.adapt.layers.layer_source import layer_file
from ladderize.adapt.stage_run import adapt
from ladderize.checkpoint.io import read_provenance
from tests.adapt.conftest import convert
from tests.cli_helpers import run_cli


@pytest.fixture(scope="module")
def hybrid_dir(dense_dir, tmp_path_factory):
    """SPD at TP=3 on layer 1, dense layer 2 in between (the student's own), ladder on layer 3."""
    return convert(dense_dir, tmp_path_factory.mktemp("hybrid") / "tiny-hybrid", ladder="3:4", spd="1:2", spd_tp_size=3)


def _config(checkpoint, out, text_file, **kw) -> AdaptConfig:
    # 9 sequences: the state chunks (4, 4, 1) and the batches (2) both have a ragged end
    settings = dict(checkpoint=str(checkpoint), out=str(out), data=str(text_file), objectives="local",
                    local_schedule="sequential", tokens=32 * 9, seq_len=32, batch_size=2, epochs=2, lr=3e-3, warmup_steps=1)
    return AdaptConfig.from_flat(**{**settings, **kw})


def _tensors(path: Path) -> dict[str, torch.Tensor]:
    tensors = {}
    for file in sorted(path.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as handle:
            tensors.update({name: handle.get_tensor(name) for name in handle.keys()})
    return tensors


def assert_same_checkpoint(a: Path, b: Path) -> None:
    """Every tensor equal bit for bit (names, dtypes, values), and the same config."""
    ta, tb = _tensors(a), _tensors(b)
    assert ta.keys() == tb.keys()
    for name in ta:
        assert ta[name].dtype == tb[name].dtype and torch.equal(ta[name], tb[name]), name
    config_a, config_b = (json.loads((p / "config.json").read_text()) for p in (a, b))
    assert config_a == config_b


@pytest.mark.parametrize("layout", ["hybrid", "ladder"])
def test_streamed_output_equals_the_in_memory_output_bit_for_bit(layout, hybrid_dir, ladder_dir, text_file, tmp_path):
    checkpoint = {"hybrid": hybrid_dir, "ladder": ladder_dir}[layout]
    streamed = adapt(_config(checkpoint, tmp_path / "streamed", text_file))
    resident = adapt(_config(checkpoint, tmp_path / "resident", text_file, stream_layers=False))
    assert [r["loss_local"] for r in streamed.curve] == [r["loss_local"] for r in resident.curve]
    assert_same_checkpoint(tmp_path / "streamed", tmp_path / "resident")
    files = {p.name for p in (tmp_path / "streamed").iterdir()}
    assert files == {p.name for p in (tmp_path / "resident").iterdir()}, files
    record_a, record_b = (read_provenance(tmp_path / name)["history"][-1] for name in ("streamed", "resident"))
    differ = {"at", "train_s", "final_loss", "throughput"}  # times (and the pace measured from them)
    assert {k: v for k, v in record_a.items() if k not in differ} == {k: v for k, v in record_b.items() if k not in differ}
    pace_a, pace_b = record_a["throughput"], record_b["throughput"]
    assert pace_a["model_flops_per_token"] == pace_b["model_flops_per_token"] and pace_a["processes"] == pace_b["processes"]
    # the layers that were trained changed, the others are the checkpoint's
    before, after = _tensors(checkpoint), _tensors(tmp_path / "streamed")
    changed = {n for n in after if not torch.equal(after[n], before[n].float())}
    trained = {"hybrid": ("model.layers.1.", "model.layers.3."), "ladder": ("model.layers.2.", "model.layers.3.")}[layout]
    assert changed and all(n.startswith(trained) for n in changed)
    assert not (tmp_path / "streamed.adapt-run").exists()


def test_one_layer_at_a_time_and_each_written_when_done(hybrid_dir, text_file, tmp_path):
    seen = []
    run = tmp_path / "out.adapt-run"

    def progress(info, model) -> None:
        loaded = {n.split(".")[2] for n, p in model.named_parameters() if not p.is_meta}
        written = sorted(p.name for p in (run / "state").glob("layer-*.safetensors")) if (run / "state").is_dir() else []
        seen.append((info.layer, loaded, written))

    adapt(_config(hybrid_dir, tmp_path / "out", text_file), progress=progress)
    for layer, loaded, written in seen:
        assert loaded == {str(layer)}  # the student holds the weights of the layer in training, nothing else
        assert written == ([] if layer == 1 else ["layer-00001.safetensors"])  # layer 1 was written before layer 3 began


def test_states_on_disk_equal_states_in_memory(hybrid_dir, text_file, tmp_path, capsys, monkeypatch):
    base = ["adapt", hybrid_dir, None, "--data", text_file, "--objective", "local", "--local-schedule", "sequential",
            "--tokens", 32 * 9, "--seq-len", 32, "--batch-size", 2, "--epochs", 2, "--lr", 3e-3]
    maps = []
    import ladderize.adapt.sequential.layer_training as sequential

    train_layer = sequential.train_layer

    def spying(*args, **kwargs):  # the real train_layer; records where the states live while it runs
        maps.append(Path("/proc/self/maps").read_text())
        return train_layer(*args, **kwargs)

    monkeypatch.setattr("ladderize.adapt.sequential.sequential_run.train_layer", spying)
    for name, extra in (("memory", []), ("disk", ["--states-on-disk"])):
        args = [tmp_path / name if a is None else a for a in base]
        code, stdout, stderr = run_cli(args + extra, capsys, monkeypatch)
        assert code == 0, stderr
    on_disk = [m.count(".calibration-state-") for m in maps]
    assert on_disk[:2] == [0, 0] and all(n >= 4 for n in on_disk[2:]), on_disk  # mapped (and already unlinked) files
    assert_same_checkpoint(tmp_path / "memory", tmp_path / "disk")
    assert not (tmp_path / "disk.adapt-run").exists()  # no state file is left behind


def test_kill_and_resume_within_and_between_layers_is_bit_identical(hybrid_dir, text_file, tmp_path):
    whole = adapt(_config(hybrid_dir, tmp_path / "whole", text_file))
    per_layer = whole.steps // 2
    within = _config(hybrid_dir, tmp_path / "within", text_file)
    partial = adapt(within, stop_after_steps=per_layer + 3)  # killed inside layer 3; layer 1 was written
    assert partial.steps == per_layer + 3 and not (tmp_path / "within").exists()
    resumed = adapt(within, resume=True)
    assert resumed.resumed_from_step == per_layer and resumed.steps == whole.steps
    assert [r["loss_local"] for r in resumed.curve] == [r["loss_local"] for r in whole.curve]
    assert_same_checkpoint(tmp_path / "whole", tmp_path / "within")

    between = _config(hybrid_dir, tmp_path / "between", text_file)
    partial = adapt(between, stop_after_steps=per_layer)  # killed once layer 1 is written, before layer 3 starts
    state = tmp_path / "between.adapt-run" / "state"
    assert partial.steps == per_layer and layer_file(state, 1).is_file() and not layer_file(state, 3).exists()
    resumed = adapt(_config(hybrid_dir, tmp_path / "between", text_file, stream_layers=False), resume=True)  # in memory this time
    assert resumed.resumed_from_step == per_layer
    assert_same_checkpoint(tmp_path / "whole", tmp_path / "between")


def test_head_grouping_runs_the_sequential_schedule_in_memory(spd_dir, dense_dir, text_file, tmp_path):
    messages = []
    adapt(_config(spd_dir, tmp_path / "grouped", text_file, head_grouping=True, tokens=32 * 4, epochs=1), on_message=messages.append)
    assert any("head grouping needs the student and the teacher whole" in m for m in messages)
    assert json.loads((tmp_path / "grouped" / "config.json").read_text())["spd_head_order"] is not None
