"""Issue 26 item 6: SPD at TP 1 is exactly dense, so every command taking --spd refuses it in one line.

convert requires --spd-tp with --spd (or the sensitivity report's TP with --spd auto); bench and predict
default it from --tp and refuse a degree of 1, given or defaulted.
"""

from __future__ import annotations

import pytest

from tests.cli_helpers import error_lines, run_cli


def _one_error(stderr: str) -> str:
    lines = error_lines(stderr)
    assert len(lines) == 1 and lines[0].startswith("error:"), stderr
    return lines[0]


@pytest.mark.parametrize("extra, expected", [([], "--spd needs --spd-tp N"), (["--spd-tp", "1"], "exactly dense")])
def test_convert_spd_needs_a_tp_degree_above_one(extra, expected, tiny_llama_dir, tmp_path, capsys, monkeypatch):
    out = tmp_path / "spd"
    code, stdout, stderr = run_cli(["convert", tiny_llama_dir, out, "--spd", "0:3", *extra], capsys, monkeypatch)
    assert code == 2 and expected in _one_error(stderr) and "Traceback" not in stderr
    assert not out.exists()
    code, stdout, stderr = run_cli(["convert", tiny_llama_dir, out, "--spd", "0:3", "--spd-tp", "3"], capsys, monkeypatch)
    assert code == 0, stderr
    assert '"spd_tp_size": 3' in (out / "config.json").read_text()


def test_bench_and_predict_refuse_spd_at_tp_one(capsys, monkeypatch):
    for argv in (["bench", "--synthetic", "tiny", "--spd", "all", "--tp", "1", "--device", "cpu"],
                 ["predict", "--model", "llama-3.1-8b", "--spd", "16:32", "--tp", "1", "--compute", "roofline"],
                 ["predict", "--model", "llama-3.1-8b", "--spd", "16:32", "--tp", "1,8", "--spd-tp", "1", "--compute", "roofline"]):
        code, _, stderr = run_cli(argv, capsys, monkeypatch)
        assert code == 2 and "exactly dense" in _one_error(stderr), argv
    code, stdout, stderr = run_cli(["predict", "--model", "llama-3.1-8b", "--spd", "16:32", "--tp", "1,8",
                                    "--batch", "1", "--compute", "roofline"], capsys, monkeypatch)
    assert code == 0, stderr  # the SPD degree defaults to the largest --tp


def test_spd_tp_rule():
    from ladderize.model.layout import LayoutError, spd_tp_for

    assert spd_tp_for("none", None) == 1 and spd_tp_for(None, None, default=4) == 4
    assert spd_tp_for("0:3", 2) == 2 and spd_tp_for("all", None, default=8) == 8
    with pytest.raises(LayoutError, match="needs --spd-tp"):
        spd_tp_for("0:3", None)
    with pytest.raises(LayoutError, match=r"TP 1 \(the first --tp\)"):
        spd_tp_for("0:3", None, default=1, default_from="the first --tp")
