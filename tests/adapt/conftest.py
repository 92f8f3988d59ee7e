"""Fixtures for adaptation tests: a tiny dense checkpoint with a character tokenizer, its conversions, text."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.conftest import TINY, char_tokenizer  # noqa: F401  (re-exported for the tests here)

TEXT = (
    "Now is the winter of our discontent made glorious summer by this sun of York; "
    "and all the clouds that lour'd upon our house in the deep bosom of the ocean buried. "
    "Now are our brows bound with victorious wreaths, our bruised arms hung up for monuments. "
)


@pytest.fixture(scope="session")
def dense_dir(tmp_path_factory) -> Path:
    """A tiny trained-looking dense Llama checkpoint (random weights) with a tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**TINY))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
    path = tmp_path_factory.mktemp("dense") / "tiny-dense"
    model.save_pretrained(path)
    char_tokenizer().save_pretrained(path)
    return path


def convert(dense_dir: Path, out: Path, **layout) -> Path:
    from ladderize.convert.conversion import convert_checkpoint

    return convert_checkpoint(str(dense_dir), out, **layout)


@pytest.fixture(scope="session")
def ladder_dir(dense_dir, tmp_path_factory) -> Path:
    return convert(dense_dir, tmp_path_factory.mktemp("ladder") / "tiny-ladder", ladder="2:4")


@pytest.fixture(scope="session")
def spd_dir(dense_dir, tmp_path_factory) -> Path:
    return convert(dense_dir, tmp_path_factory.mktemp("spd") / "tiny-spd", spd="1:4", spd_tp_size=3)


@pytest.fixture(scope="session")
def text_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "train.txt"
    path.write_text(TEXT * 40)
    return path


def plan_and_run(recipe, checkpoint, out, *, shared=None, budget=None, **options):
    """``run_recipe`` on the plan ``plan_adapt`` makes of ``recipe`` and ``shared`` on ``checkpoint`` (``budget``
    sizes it; a resumed run keeps the sizes it recorded), with ``options`` as ``RunOptions``' fields; the plan's
    messages go to ``on_message`` and its clock is the run's."""
    import time

    from ladderize.adapt.entrance import AdaptRequest, plan_adapt
    from ladderize.adapt.recipe_run import RunOptions, run_recipe

    began = time.perf_counter()
    request = AdaptRequest.of(str(checkpoint), str(out), recipe=recipe, budget=budget, run_dir=options.get("run_dir"),
                           resume=options.get("resume", False), began=began, **(shared or {}))
    plan = plan_adapt(request, say=options.get("on_message") or (lambda _m: None))
    return run_recipe(plan, out, RunOptions(began=began, **options))


def typed(steps):
    """Hand-built stage dicts (flat setting names, with ``stage`` and ``name`` where given) as the typed stages the
    planning takes: a list of them from a list, one from a dict (a typed stage stays as it is)."""
    from ladderize.adapt.plan.config import GivenSettings
    from ladderize.adapt.plan.planned_stage import PlannedStage

    def one(step, number):
        if isinstance(step, PlannedStage):
            return step
        settings = GivenSettings.of({k: v for k, v in step.items() if k not in ("stage", "name")})
        return PlannedStage.of(int(step.get("stage", number)), str(step.get("name", "stage")), settings)

    if isinstance(steps, dict):
        return one(steps, 1)
    return [one(step, number) for number, step in enumerate(steps, 1)]


def timed(stages, budget, checkpoint, say=lambda _line: None):
    """``budget.size_recipe`` as a run sizes: this device's pace timed where the sizing asks for it
    (``entrance.with_timed_pace``)."""
    from ladderize.adapt.entrance import with_timed_pace
    from ladderize.adapt.plan.budget import size_recipe

    return with_timed_pace(lambda pace, heard: size_recipe(stages, budget, checkpoint, say=heard, pace=pace), say)


def steps_of(stages):
    """Typed stages as the dicts ``recipe.json`` records (``PlannedStage.step``)."""
    return [stage.step for stage in stages]
