"""``eval``'s task checks before lm-eval loads: task names read from lm-eval's task files as text, and data missing
offline answered with where the data goes and the slices a clone carries (issue 64 items 3 and 6)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.cli_helpers import error_lines, run_cli

REPO = Path(__file__).resolve().parents[2]


def test_task_names_read_as_text_hold_every_name_lm_eval_knows():
    """A name outside ``lm_eval_task_names`` is refused before lm-eval loads, so the set must hold all of lm-eval's."""
    from lm_eval.tasks import TaskManager

    from ladderize.eval.local_tasks import lm_eval_task_names

    names = lm_eval_task_names()
    missing = sorted(set(TaskManager().all_tasks) - names)
    assert missing == [], f"{len(missing)} lm-eval names the text scan misses, e.g. {missing[:10]}"
    assert "lambada_opneai" not in names and "lambada_openai" in names and "mmlu" in names


@pytest.fixture
def no_data_anywhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Offline, no data dir (flag, variable, cache or team folder) and no copy of any hub data set."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    for name in ("LADDERIZE_DATA_DIR", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_DATASETS_CACHE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr("ladderize.eval.local_tasks.default_data_dirs", lambda: [tmp_path / "cache-data"])
    return tmp_path


def _work_started(*args, **kwargs):
    raise AssertionError("the evaluation started before its data was checked")


@pytest.mark.parametrize("task, data_dir, where", [
    ("lambada_openai", None, "lambada_openai/lambada_test.jsonl"),  # lm-eval's hub definition, offline
    ("wikitext2_valid", None, "wikitext-2/valid.txt"),
    ("lambada_openai", "empty", "lambada_openai/lambada_test.jsonl"),  # a data dir without the file
])
def test_missing_offline_data_says_where_it_goes_and_offers_the_bundled_slice(
        task, data_dir, where, no_data_anywhere, tiny_llama_dir, capsys, monkeypatch):
    monkeypatch.setattr("ladderize.eval.harness.evaluate_checkpoint", _work_started)
    argv = ["eval", tiny_llama_dir, "--tasks", task]
    if data_dir is not None:
        (no_data_anywhere / data_dir).mkdir()
        argv += ["--data-dir", no_data_anywhere / data_dir]
    code, out, err = run_cli(argv, capsys, monkeypatch)
    lines = error_lines(err)
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error:"), err
    line = lines[0]
    assert f"put {where} in a folder named by --data-dir or $LADDERIZE_DATA_DIR" in line, line
    assert str(no_data_anywhere / "cache-data") in line  # the default place, named
    bundled = REPO / "tests" / "data"
    assert f"--data-dir {bundled} (a 100-passage LAMBADA slice" in line, line
    assert (bundled / "lambada_openai" / "lambada_test.jsonl").is_file() and (bundled / "wikitext-2" / "valid.txt").is_file()


def test_the_offered_slice_passes_the_checks(no_data_anywhere):
    """What the error line offers is a data dir the checks accept, offline, for both local tasks."""
    from ladderize.eval.local_tasks import bundled_data_dir, check_tasks

    plan = check_tasks(["lambada_openai", "wikitext2_valid"], bundled_data_dir())
    assert plan.sources["lambada_openai"] == str(REPO / "tests" / "data" / "lambada_openai" / "lambada_test.jsonl")
    assert plan.names == ["lambada_openai", "wikitext2_valid"]


def test_a_cached_hub_copy_is_not_refused_offline(no_data_anywhere):
    """lm-eval reads a hub data set from the Hugging Face cache offline: with a copy there, no refusal."""
    from ladderize.eval.local_tasks import check_tasks

    (no_data_anywhere / "hf" / "hub" / "datasets--EleutherAI--lambada_openai").mkdir(parents=True)
    assert check_tasks(["lambada_openai"], None).sources == {"lambada_openai": "lm-eval"}


def test_eval_turns_the_hub_off_unless_the_user_set_it(monkeypatch):
    """``eval``'s default: both offline variables set where neither is; a user's own setting (either) is kept."""
    import huggingface_hub.constants

    from ladderize.eval.local_tasks import OFFLINE_VARIABLES, default_offline

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", huggingface_hub.constants.HF_HUB_OFFLINE)
    for name in OFFLINE_VARIABLES:
        monkeypatch.setenv(name, "x")  # recorded, so that the test's own changes are undone
        monkeypatch.delenv(name)
    default_offline()
    assert [os.environ.get(name) for name in OFFLINE_VARIABLES] == ["1", "1"]
    assert huggingface_hub.constants.HF_HUB_OFFLINE is True  # already imported: turned off too
    for name in OFFLINE_VARIABLES:
        monkeypatch.delenv(name)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    default_offline()
    assert os.environ["HF_HUB_OFFLINE"] == "0" and "HF_DATASETS_OFFLINE" not in os.environ


def test_an_lm_eval_task_without_a_cached_copy_is_refused_offline(no_data_anywhere):
    """A tag (lambada: lambada_openai and lambada_standard) or task read from the hub, offline with no copy: one line
    naming the data sets, the offline tasks and --data-dir; with copies cached, no refusal."""
    from ladderize.errors import LadderizeError
    from ladderize.eval.local_tasks import check_tasks, lm_eval_task_datasets

    assert sorted(lm_eval_task_datasets("lambada")) == ["EleutherAI/lambada_openai", "cimec/lambada"]
    with pytest.raises(LadderizeError) as refused:
        check_tasks(["lambada"], None)
    line = str(refused.value)
    assert "task lambada reads" in line and "cimec/lambada" in line and "\n" not in line, line
    assert all(words in line for words in ("lambada_openai", "wikitext2_valid", "shakespeare", "ppl:FILE", "--data-dir"))
    for repo in ("EleutherAI--lambada_openai", "cimec--lambada"):
        (no_data_anywhere / "hf" / "hub" / f"datasets--{repo}").mkdir(parents=True)
    assert check_tasks(["lambada"], None).sources == {"lambada": "lm-eval"}
