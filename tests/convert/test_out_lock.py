"""convert takes OUT's lock, the one adapt takes: a second run into a held OUT is refused at once, naming the holder;
an OUT whose parent folder is missing is made, as ``save_pretrained`` and ``mkdir -p`` do."""

from __future__ import annotations

import time
from pathlib import Path

from ladderize.adapt.plan.inputs import run_folder
from ladderize.adapt.run_lock import holding_run
from tests.cli_helpers import run_cli


def test_a_second_convert_into_a_held_out_is_refused_at_once(tiny_llama_dir: Path, tmp_path: Path, capsys,
                                                             monkeypatch) -> None:
    out = tmp_path / "out"
    with holding_run(run_folder(out), out):  # a live run (this process) holds OUT
        began = time.perf_counter()
        code, _, err = run_cli(["convert", tiny_llama_dir, out, "--ladder", "2:4"], capsys, monkeypatch)
        took = time.perf_counter() - began
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and "is in use: a ladderize run holds" in errors[0], err
    assert "process" in errors[0] and took < 5
    assert not out.exists()
    code, _, err = run_cli(["convert", tiny_llama_dir, out, "--ladder", "2:4"], capsys, monkeypatch)
    assert code == 0, err  # released: the next run takes it
    assert not (tmp_path / "out.adapt-run.lock").exists()


def test_convert_makes_a_missing_parent_folder(tiny_llama_dir: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    out = tmp_path / "new" / "deeper" / "out"
    code, _, err = run_cli(["convert", tiny_llama_dir, out, "--ladder", "2:4"], capsys, monkeypatch)
    assert code == 0, err
    assert (out / "config.json").is_file()
    assert sorted(path.name for path in out.parent.iterdir()) == ["out"]
