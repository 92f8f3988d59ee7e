"""``ladderize predict`` end to end through Typer."""

from __future__ import annotations

import json
import sys

import pytest
from typer.testing import CliRunner

from ladderize import cli

runner = CliRunner()


def test_help_documents_every_option():
    result = runner.invoke(cli.app, ["predict", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for option in ("--model", "--tp", "--batch", "--prompt", "--gen", "--interconnect", "--layout", "--ladder", "--spd",
                   "--spd-tp", "--compute", "--gpu", "--schedules", "--domino-chunks", "--json", "--cache-dir",
                   "--show-modules", "--calibrate", "--profile", "--force"):
        assert option in result.output
    command = next(c for c in cli.app.registered_commands if c.name == "predict")
    import inspect

    for parameter in inspect.signature(command.callback).parameters.values():
        assert parameter.default.help, parameter.name


def test_roofline_prediction_writes_json(tmp_path):
    out = tmp_path / "p.json"
    result = runner.invoke(cli.app, ["predict", "--model", "llama-3.1-70b", "--tp", "1,8", "--batch", "1", "--compute",
                                     "roofline", "--ladder", "40:80", "--json", str(out)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "ladder 40:80" in result.output and "upper-bound" in result.output
    data = json.loads(out.read_text())
    assert {r["schedule"] for r in data["rows"]} == {"dense", "ladder", "spd", "domino", "upper-bound", "layout"}
    assert data["interconnect"]["name"] == "h100-nvlink" and data["compute"]["on_gpu"] is False


def test_measured_prediction_on_a_tiny_config(tmp_path):
    """``--compute measured`` on a CPU runs against a CPU fabric (a profile naming no GPU), with its warning.

    Domino is left out: it prices batch-1 chunks against the upper bound's batch-2 modules, timed apart, and on a
    loaded CPU (CI's other worker, a demo beside it) those timings can put it 1.47x under the bound, which predict
    refuses as noise (``check_upper_bound``); every schedule kept here is priced from the same module timings as
    the bound."""
    config = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 8,
              "num_key_value_heads": 4, "vocab_size": 128}
    (tmp_path / "config.json").write_text(json.dumps(config))
    fabric = tmp_path / "cpu-shm.json"
    fabric.write_text(json.dumps({"algorithm": "ring", "launch_s": 5e-6, "latency_s": 2e-6, "bus_bytes_per_s": 5e9,
                                  "overlap_slowdown": 0.0}))
    result = runner.invoke(cli.app, ["predict", "--model", str(tmp_path), "--tp", "2", "--batch", "2", "--prompt",
                                     "16", "--gen", "8", "--cache-dir", str(tmp_path / "cache"), "--show-modules",
                                     "--interconnect", str(fabric), "--compute", "measured", "--device", "cpu",
                                     "--schedules", "dense,ladder,spd,upper-bound"],
                           env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "a CPU, not a GPU" in result.output and "this CPU's" in result.output
    assert (tmp_path / "cache" / "measurements.json").is_file()


def test_no_gpu_here_defaults_to_the_fabrics_gpu_model(tmp_path, capsys, monkeypatch):
    """Issue 35: no --compute, a GPU fabric and no GPU here: the fabric's fitted GPU model, said on the compute line
    (it was CPU timings against NVLink: every speed-up 1.000x); --compute measured there is refused in one line."""
    from tests.cli_helpers import run_cli

    monkeypatch.setattr("ladderize.predict.pipeline.local_gpu_name", lambda device="auto": None)
    code, out, err = run_cli(["predict", "--model", "llama-3.1-70b", "--tp", "8", "--batch", "1,4,16,64",
                              "--interconnect", "h100-nvlink", "--ladder", "all", "--schedules", "ladder",
                              "--json", tmp_path / "p.json"], capsys, monkeypatch)
    assert code == 0, err
    compute = next(line for line in out.splitlines() if line.startswith("compute:"))
    assert "roofline" in compute and "the default without a local GPU" in compute
    ladder = [r for r in json.loads((tmp_path / "p.json").read_text())["rows"] if r["schedule"] == "ladder"]
    assert len(ladder) == 4 and all(r["e2e_speedup_vs_dense"] > 1.1 and r["prefill_speedup_vs_dense"] > 1.05
                                    for r in ladder)
    code, out, err = run_cli(["predict", "--model", "llama-3.1-8b", "--tp", "8", "--batch", "1", "--compute", "measured"],
                             capsys, monkeypatch)
    assert code == 2 and err.count("error:") == 1 and "GPU fabric" in err


def test_layout_from_a_checkpoint_folder(tmp_path):
    from tests.conftest import tiny_config

    tiny_config(num_attention_heads=8, num_key_value_heads=4, hidden_size=64, intermediate_size=128,
                layer_modes=["dense", "dense", "ladder", "ladder"]).save_pretrained(tmp_path)
    out = tmp_path / "p.json"
    result = runner.invoke(cli.app, ["predict", "--layout", str(tmp_path), "--tp", "2", "--batch", "1", "--compute",
                                     "roofline", "--schedules", "layout", "--json", str(out)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())["rows"]
    assert [r["layout"] for r in rows] == ["dense", "ladder 2:4"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--model", "llama-9"], "unknown model"),
        (["--model", "llama-3.1-8b", "--interconnect", "smoke-signals"], "unknown interconnect"),
        (["--model", "llama-3.1-8b", "--tp", "3"], "does not divide"),
        (["--model", "llama-3.1-8b", "--ladder", "40:80"], "outside the model"),
        (["--tp", "2"], "--model is required"),
    ],
)
def test_user_errors_exit_2_with_one_line(monkeypatch, capsys, args, message):
    monkeypatch.setattr(sys, "argv", ["ladderize", "predict", "--compute", "roofline", *args])
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("error:") == 1


def test_an_interconnect_alias_names_the_profile_it_stands_for(capsys, monkeypatch):
    """Issue 26 item 12: ``--interconnect nvlink`` was taken as h100-nvlink without a word."""
    from tests.cli_helpers import run_cli

    code, out, err = run_cli(["predict", "--model", "llama-3.1-8b", "--tp", "8", "--batch", "1", "--interconnect", "nvlink",
                              "--compute", "roofline"], capsys, monkeypatch)
    assert code == 0, err
    header = next(line for line in out.splitlines() if line.startswith("interconnect:"))
    assert header.startswith("interconnect: h100-nvlink:") and "'nvlink' is an alias of h100-nvlink" in " ".join(out.split())
    code, out, err = run_cli(["predict", "--model", "llama-3.1-8b", "--tp", "8", "--batch", "1", "--interconnect", "h100-nvlink",
                              "--compute", "roofline"], capsys, monkeypatch)
    assert code == 0 and "alias" not in out


def test_gpu_node_prediction_prices_a_checkpoints_layout_on_the_fabrics_gpu(tmp_path):
    """The call the demo can make for 'what would this layout give on a GPU node' (issue 37 item 5)."""
    from ladderize.predict.pipeline import gpu_node_prediction
    from tests.conftest import tiny_config

    tiny_config(num_attention_heads=8, num_key_value_heads=4, hidden_size=64, intermediate_size=128,
                layer_modes=["dense", "dense", "ladder", "ladder"]).save_pretrained(tmp_path)
    result = gpu_node_prediction(tmp_path, (2,), (1, 4), prompt=32, gen=8)
    assert {r.schedule for r in result.rows} == {"dense", "layout", "upper-bound"}
    assert "roofline" in result.compute_label and "gpt-fast" in result.compute_label
    layout = [r for r in result.rows if r.schedule == "layout"]
    assert all(1.0 < r.e2e_speedup_vs_dense for r in layout)


def test_measured_is_the_default_only_on_the_fabrics_own_gpu(monkeypatch):
    """Issue 35: ``measured`` stays for the case where the profile's GPU is the local one."""
    from ladderize.predict import pipeline as plan
    from ladderize.predict.interconnect import PROFILES

    nvlink = PROFILES["h100-nvlink"]
    monkeypatch.setattr(plan, "local_gpu_name", lambda device="auto": "NVIDIA H100 80GB HBM3")
    assert plan.resolve_compute(None, "auto", nvlink) == ("measured", "")
    monkeypatch.setattr(plan, "local_gpu_name", lambda device="auto": "NVIDIA A100-SXM4-80GB")
    mode, why = plan.resolve_compute(None, "auto", nvlink)
    assert mode == "roofline" and "A100" in why and "H100" in why
    assert plan.resolve_compute("measured", "auto", nvlink) == ("measured", "")  # asked for: the A100's timings
