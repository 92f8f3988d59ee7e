"""Issue 26 item 3: every command that writes checks its output location before the work starts.

An unwritable location (a read-only mount, a parent that is a file) is one line and exit 2 before the
command's pipeline runs (the pipelines are replaced by a function that fails the test if called).
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import pytest

from tests.cli_helpers import error_lines, run_cli


def _unwritable_dirs(tmp_path: Path) -> list[Path]:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder\n")
    places = [blocker / "sub"]  # a parent that is a file: unwritable for everyone, root included
    if Path("/sys").is_dir() and _sysfs_rejects():
        places.append(Path("/sys/ladderize-unwritable"))  # sysfs refuses new files, also to root
    return places


def _sysfs_rejects() -> bool:
    import tempfile

    try:
        fd, probe = tempfile.mkstemp(dir="/sys", prefix=".ladderize-test-")
    except OSError:
        return True
    os.close(fd)
    os.unlink(probe)
    return False


# command -> (module, function the work starts in, argv builder)
COMMANDS = {
    "convert": ("ladderize.convert.pipeline", "convert_layout", lambda src, d: ["convert", src, d / "out"]),
    "pull": ("ladderize.convert.pull", "pull_model", lambda src, d: ["pull", "--out", d / "model"]),
    "eval": ("ladderize.eval.harness", "evaluate_checkpoint",
             lambda src, d: ["eval", src, "--tasks", "wikitext2_valid", "--json", d / "e.json"]),
    "report": ("ladderize.report", "write_report", lambda src, d: ["report", src / "config.json", "--out", d / "rep"]),
    "bench": ("ladderize.runtime.bench", "run_bench",
              lambda src, d: ["bench", "--synthetic", "tiny", "--tp", "1", "--json", d / "b.json"]),
    "predict": ("ladderize.predict.pipeline", "prepare_prediction",
                lambda src, d: ["predict", "--model", "llama-3.1-8b", "--compute", "roofline", "--json", d / "p.json"]),
    "predict-cache": ("ladderize.predict.pipeline", "prepare_prediction",
                      lambda src, d: ["predict", "--model", "llama-3.1-8b", "--device", "cpu", "--cache-dir", d / "cache"]),
    "sensitivity": ("ladderize.convert.sensitivity", "checkpoint_sensitivity",
                    lambda src, d: ["sensitivity", src, "--spd-tp", "3", "--json", d / "s.json"]),
    "sample": ("ladderize.adapt.teacher_text", "sample_text", lambda src, d: ["sample", src, d / "s.jsonl"]),
    "adapt": ("ladderize.adapt.entrance", "_adapt_checkpoint", lambda src, d: ["adapt", src, d / "adapted"]),
    "demo": ("ladderize.demo.pipeline", "run_demo", lambda src, d: ["demo", "--out", d / "demo"]),
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_unwritable_output_is_one_line_before_the_work(command, tmp_path, tiny_llama_dir, capsys, monkeypatch):
    module_name, function, argv = COMMANDS[command]
    module = importlib.import_module(module_name)

    def work_started(*args, **kwargs):
        raise AssertionError(f"{command} started its work before checking where it writes")

    monkeypatch.setattr(module, function, work_started)
    for place in _unwritable_dirs(tmp_path):
        code, out, err = run_cli(argv(tiny_llama_dir, place), capsys, monkeypatch)
        lines = error_lines(err)
        assert code == 2 and len(lines) == 1 and "Traceback" not in err, (place, err)
        assert "cannot write" in lines[0] and str(place) in lines[0]
        assert not place.exists()


def test_writable_check_accepts_new_nested_folders_and_leaves_nothing(tmp_path):
    from ladderize.errors import LadderizeError
    from ladderize.checkpoint.atomic import check_writable

    target = tmp_path / "new" / "deeper" / "out"
    assert check_writable(target) == target
    assert list(tmp_path.iterdir()) == []  # the probe is gone and no folder was made
    (tmp_path / "d").mkdir()
    with pytest.raises(LadderizeError, match="is a directory"):
        check_writable(tmp_path / "d", "--json file")


FILE_COMMANDS = {  # a file written when the command ends, in a folder that does not exist
    name: COMMANDS[name] for name in ("eval", "bench", "predict")
} | {
    "predict-profile": ("ladderize.predict.pipeline", "calibrate_from_options",
                        lambda src, d: ["predict", "--calibrate", "--model", "cpu-512", "--device", "cpu",
                                        "--profile", d / "profile.json"]),
}


@pytest.mark.parametrize("command", sorted(FILE_COMMANDS))
def test_a_file_in_a_missing_folder_is_one_line_before_the_work(command, tmp_path, tiny_llama_dir, capsys, monkeypatch):
    """``--json DIR/x.json`` (``--profile``) where DIR does not exist: refused at once, DIR not created."""
    import time

    module_name, function, argv = FILE_COMMANDS[command]

    def work_started(*args, **kwargs):
        raise AssertionError(f"{command} started its work before checking the folder it writes in")

    monkeypatch.setattr(importlib.import_module(module_name), function, work_started)
    missing = tmp_path / "missing" / "dir"
    started = time.perf_counter()
    code, out, err = run_cli(argv(tiny_llama_dir, missing), capsys, monkeypatch)
    lines = error_lines(err)
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("error: cannot write") and f"folder {missing} does not exist" in lines[0], lines
    assert time.perf_counter() - started < 30
    assert not (tmp_path / "missing").exists()


def test_file_target_check_accepts_an_existing_folder_and_leaves_nothing(tmp_path):
    from ladderize.checkpoint.atomic import check_file_target
    from ladderize.errors import LadderizeError

    assert check_file_target(None) is None
    assert check_file_target(tmp_path / "x.json", "--json file") == tmp_path / "x.json"
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(LadderizeError, match="folder .* does not exist"):
        check_file_target(tmp_path / "new" / "x.json", "--json file")
    assert list(tmp_path.iterdir()) == []
