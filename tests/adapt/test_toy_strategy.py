"""A strategy added at test time as one file (``toy_strategy.py``: one ``StrategyEntry`` and its run class), touching
no product file: the entry's traits drive the rest.

The toy ``handavg`` (replicated, its gradients averaged by hand) must be a ``--shard`` value the command line lists,
be chosen only when asked for, be priced as a strategy that holds the whole weights (as DDP is), take the settings
that need them, and train with the clip that changes the result on one process and on 2 processes alike, as DDP
does. docs/architecture.md ("Adding a strategy") lists what a new strategy touches; this test is the check that
nothing else needs to.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ladderize.adapt.plan.budget import parse_budget
from ladderize.adapt.plan.adapt_plan import build_plan
from ladderize.adapt.plan.cost import JointMemory
from ladderize.adapt.plan.strategy_choice import REPLICATED, choose_strategy
from ladderize.errors import LadderizeError
from ladderize.adapt.plan.config import GivenSettings
from tests.adapt.test_cost import _config_only
from tests.adapt.test_multiprocess import launch_failure
from tests.adapt.test_strategy import typed
from tests.adapt.test_sharded import _common, _env, _losses, _torchrun, _updates_agree
from tests.adapt.toy_strategy import register_toy
from tests.cli_helpers import run_cli

TOY_FILE = Path(__file__).with_name("toy_strategy.py")
REPO = Path(__file__).resolve().parents[2]
STAGE = "kd:tokens=256,max_grad_norm=0.01,lr=1e-2,batch_size=2"


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch):
    return register_toy(monkeypatch)


def test_it_is_chosen_when_asked_for_and_takes_the_whole_weight_settings(toy):
    chosen = choose_strategy(typed(shard="handavg", ema=0.9), 8)
    assert chosen.entry is toy and chosen.kind == REPLICATED
    assert chosen.describe() == "replicated over 8 processes with hand-averaged gradients: --shard handavg"
    assert choose_strategy(typed(), 8).entry.name == "fsdp" and choose_strategy(typed(ema=0.9), 8).entry.name == "ddp"


def test_it_is_unknown_without_its_file():
    with pytest.raises(LadderizeError, match="unknown --shard 'handavg'; choose from auto, fsdp, ddp$"):
        choose_strategy(typed(shard="handavg"), 2)


def test_it_is_priced_from_its_traits(toy, tmp_path):
    """On 8 H100s it holds the whole student and teacher on every GPU, as DDP's stage is priced, and a refusal advises
    dropping it for the sharded strategy."""
    folder = _config_only(tmp_path, "llama-3.1-8b", 16)

    def kd(shard: str):
        plan = build_plan(folder, shared=GivenSettings.of({"seq_len": 2048, "shard": shard, "batch_size": 8}), budget=parse_budget("3B"),
                          launch="8xH100", priced_only=True)
        return plan.cost

    toy_cost, ddp_cost = kd("handavg"), kd("ddp")
    assert toy_cost.stages[-1].strategy.startswith("replicated over 8 processes with hand-averaged gradients")
    assert JointMemory(**toy_cost.stages[-1].memory).total == JointMemory(**ddp_cost.stages[-1].memory).total
    assert toy_cost.refusal is not None and "without --shard handavg (then sharded:" in toy_cost.refusal


def _run(command: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**_env(tmp_path), "PYTHONPATH": str(REPO)}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, launch_failure(done.stderr)
    return done


def test_the_command_line_lists_it(tmp_path):
    done = _run([sys.executable, str(TOY_FILE), "adapt", "--help"], tmp_path)
    assert "fsdp, ddp, handavg or auto" in " ".join(done.stdout.split())


def test_it_trains_on_one_and_two_processes_as_ddp_does(sharp_ladder, text_file, tmp_path, capsys, monkeypatch):
    """kd with a clip that changes the result, as ``python toy_strategy.py adapt --shard handavg`` and under
    ``torchrun --nproc_per_node 2``, against one process of ``--shard ddp``: losses within 1e-5 relative, each weight's
    update within 1e-3 of its norm (the sharded tests' bounds)."""
    args = ["adapt", str(sharp_ladder), None, *_common(text_file), "--stage", STAGE, "--shard", "handavg"]
    _run([sys.executable, str(TOY_FILE), *[str(tmp_path / "one") if a is None else a for a in args]], tmp_path)
    two = _run([*_torchrun(2), str(TOY_FILE), *[str(tmp_path / "two") if a is None else a for a in args]], tmp_path)
    assert "replicated over 2 processes with hand-averaged gradients" in two.stderr, two.stderr[-3000:]
    code, _, err = run_cli(["adapt", sharp_ladder, tmp_path / "ddp", *_common(text_file), "--stage", STAGE, "--shard", "ddp"],
                           capsys, monkeypatch)
    assert code == 0, err
    losses = _losses(tmp_path / "ddp")
    assert len(losses) == 4, losses
    for run in ("one", "two"):
        for a, b in zip(losses, _losses(tmp_path / run), strict=True):
            assert a == pytest.approx(b, rel=1e-5), run
        _updates_agree(tmp_path / "ddp", tmp_path / run, sharp_ladder, 1e-3)


@pytest.fixture(scope="module")
def sharp_ladder(tmp_path_factory) -> Path:
    from tests.adapt.conftest import convert
    from tests.adapt.test_multiprocess import sharp_dense

    root = tmp_path_factory.mktemp("toy-strategy")
    return convert(sharp_dense(root / "dense"), root / "ladder", ladder="1:4")
