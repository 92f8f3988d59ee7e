"""No absolute machine path in the package, the scripts or the tests: data dirs come from flags, env or the cache."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# home and work folders of this and other machines; built from parts so this file does not match itself
PATTERN = re.compile("|".join(re.escape(p) for p in ("/" + "work/", "/" + "root/", "/" + "home/", "/" + "Users/")))
SUFFIXES = {".py", ".sh", ".c", ".yaml", ".yml", ".toml", ".json", ".cfg", ".txt", ".md"}


def _files():
    for folder in ("ladderize", "scripts", "tests"):
        for path in sorted((REPO / folder).rglob("*")):
            if path.is_file() and path.suffix in SUFFIXES and "__pycache__" not in path.parts and "data" not in path.relative_to(REPO).parts[1:2]:
                yield path


def test_no_absolute_machine_paths():
    files = list(_files())
    assert any(p.name == "perplexity.py" for p in files) and any(p.name == "test.sh" for p in files)
    hits = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for path in files
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
        if PATTERN.search(line)
    ]
    assert hits == []


def test_data_dir_comes_from_flag_env_or_cache(tmp_path, monkeypatch):
    import pytest

    from ladderize.errors import LadderizeError
    from ladderize.eval.local_tasks import default_data_dirs, require_data_dir, resolve_data_dir

    monkeypatch.setenv("LADDERIZE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("LADDERIZE_DATA_DIR", raising=False)
    assert default_data_dirs()[0] == tmp_path / "home" / "data"
    explicit = tmp_path / "explicit"
    explicit.mkdir()
    assert resolve_data_dir(explicit) == explicit
    env = tmp_path / "env"
    env.mkdir()
    monkeypatch.setenv("LADDERIZE_DATA_DIR", str(env))
    assert resolve_data_dir(None) == env and resolve_data_dir(explicit) == explicit
    monkeypatch.setenv("LADDERIZE_DATA_DIR", str(tmp_path / "missing"))
    with pytest.raises(LadderizeError, match="does not exist"):
        resolve_data_dir(None)
    monkeypatch.delenv("LADDERIZE_DATA_DIR")
    (tmp_path / "home" / "data").mkdir(parents=True)
    assert resolve_data_dir(None) == tmp_path / "home" / "data"
    # nothing anywhere: one line naming the flag, the variable and the cache
    monkeypatch.setattr("ladderize.eval.local_tasks.default_data_dirs", lambda: [tmp_path / "nowhere"])
    with pytest.raises(LadderizeError) as excinfo:
        require_data_dir(None)
    message = str(excinfo.value)
    assert "\n" not in message and "--data-dir" in message and "LADDERIZE_DATA_DIR" in message and "nowhere" in message
