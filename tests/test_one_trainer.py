"""adapt has one joint trainer: one training loop for the joint stages, one place that starts the process group, one
place that chooses the strategy, and one format for a joint stage's training state (a distributed checkpoint)."""

from __future__ import annotations

import ast
from pathlib import Path

ADAPT = Path(__file__).resolve().parents[1] / "ladderize" / "adapt"


def _calls(name: str) -> dict[str, list[str]]:
    """The functions of ladderize/adapt that call ``name`` (an attribute or a plain name), by file; a method as
    ``Class.method``."""
    found: dict[str, list[str]] = {}
    for file in sorted(ADAPT.rglob("*.py")):
        tree = ast.parse(file.read_text(), str(file))
        owners = {id(item): f"{node.name}." for node in ast.walk(tree) if isinstance(node, ast.ClassDef)
                  for item in node.body}
        for function in ast.walk(tree):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(function):
                if isinstance(node, ast.Call):
                    callee = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
                    if callee == name:
                        found.setdefault(file.name, []).append(owners.get(id(function), "") + function.name)
    return {file: sorted(set(names)) for file, names in found.items()}


def test_one_joint_training_loop():
    """The joint stages' loop (its learning-rate schedule and its optimizer step) is ``trainer.Trainer``'s; the
    sequential stage's is its own (one layer at a time)."""
    assert _calls("LambdaLR") == {"trainer.py": ["Trainer.__init__"], "layer_training.py": ["train_layer"]}
    # the one step stack: the joint loop's, the sequential stage's layers' and the timed step of a wall budget's pace
    assert _calls("OptimizerStep") == {"trainer.py": ["Trainer.__init__"], "layer_training.py": ["train_layer"],
                                       "pace.py": ["measure"]}


def test_one_watch_over_the_steps_of_both_stage_kinds():
    """Signals, saves and deadlines: both stage kinds hold their steps' interrupts, vote on them, keep the save clock
    and read the deadline through one ``step_watch.StepWatch`` (the joint loop's ``Trainer.train``, the sequential
    stage's ``_train_layers``), and no other module makes any of the four."""
    assert _calls("holding_interrupts") == {"step_watch.py": ["StepWatch.holding"]}
    for name in ("InterruptVote", "SaveClock", "Deadline"):
        assert set(_calls(name)) == {"step_watch.py"}, (name, _calls(name))
    assert _calls("StepWatch") == {"trainer.py": ["Trainer.train"], "sequential_run.py": ["_train_layers"]}
    for method in ("holding", "after_step", "saved", "time_up"):
        assert {"trainer.py", "sequential_run.py"} <= set(_calls(method)), method


def test_one_step_stack_under_every_strategy():
    """The runs of the strategies wrap their model and average its gradients; the precision, the loss scaling, the
    clip and the optimizer step are one stack (``optimizer_step.OptimizerStep``) that none of them rewrites, and the
    sequential stage's layers clip and step through it too."""
    runs = {"replicated.py", "sharded.py"}
    for name in ("step", "backward", "clip_grads_with_norm_", "GradScaler", "ShardedGradScaler", "autocast"):
        assert not runs & set(_calls(name)), name
    assert set(_calls("clip_grad_norm_")) | set(_calls("clip_grads_with_norm_")) == {"optimizer_step.py"}


def test_one_process_group_start():
    assert _calls("init_process_group") == {"process_group.py": ["start"]}
    assert "PartialState" not in {call for file in ADAPT.rglob("*.py") for call in _names(file)}


def test_one_strategy_choice():
    """The run (``trainer``) and the pricing (``cost``) read ``choose_strategy``; nothing else asks whether to shard."""
    callers = _calls("choose_strategy")
    assert {"trainer.py", "cost.py"} <= set(callers), callers
    for file in ADAPT.rglob("*.py"):
        assert 'shard != "ddp"' not in file.read_text(), file.name


def test_one_joint_state_format():
    """A joint stage's state is saved in one place, as a distributed checkpoint; Accelerate's ``save_state`` and
    ``load_state`` are not used."""
    saving = {file.name for file in ADAPT.rglob("*.py") if "dcp.save(" in file.read_text()}
    assert saving == {"training_state.py"}
    assert "save_joint_state" in _calls("save")["training_state.py"]
    assert not _calls("save_state") and not _calls("load_state")


def _names(file: Path) -> set[str]:
    """The plain names ``file`` uses and the names it imports."""
    tree = ast.parse(file.read_text())
    used = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    return used | {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for alias in node.names}
