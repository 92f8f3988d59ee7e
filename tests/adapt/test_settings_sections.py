"""The settings' typed sections: every setting's flat name in exactly one, each checked on its own, held as
``AdaptConfig``'s fields."""

from __future__ import annotations

from collections import Counter
from dataclasses import FrozenInstanceError, asdict, fields

import pytest

from ladderize.adapt.plan.config import FLAT_FIELDS, AdaptConfig, check_settings
from ladderize.adapt.plan.settings_sections import (SECTIONS, ObjectiveSettings, OptimizerSettings, ParallelismSettings,
                                               SavingSettings, ScopeSettings, SequentialSettings, TrainingSettings)
from ladderize.errors import LadderizeError

PROPERTIES = {ObjectiveSettings: "objective", ScopeSettings: "scope", SequentialSettings: "sequential",
              TrainingSettings: "training", SavingSettings: "saving", ParallelismSettings: "parallelism",
              OptimizerSettings: "optimizer"}


def _config(**settings) -> AdaptConfig:
    return AdaptConfig.from_flat(checkpoint="c", out="o", **settings)


def test_every_field_is_in_exactly_one_section_with_its_type():
    assert [f.default_factory for f in fields(AdaptConfig)] == list(SECTIONS)  # AdaptConfig holds the sections
    config_fields = {name: f.type for name, f in FLAT_FIELDS.items()}
    counts = Counter(f.name for kind in SECTIONS for f in fields(kind))
    assert set(counts) == set(config_fields)
    assert [name for name, n in counts.items() if n > 1] == []
    for kind in SECTIONS:
        for f in fields(kind):
            assert f.type == config_fields[f.name], (kind.__name__, f.name)
    assert set(PROPERTIES) == set(SECTIONS)


def test_properties_hand_out_the_fields_and_round_trip():
    config = _config(lr=1e-3, batch_size=8, local_schedule="sequential", epochs=3.0, shard="ddp", save_every=5,
                     teacher_states="/t", lora_rank=4, recipe={"stage": 1})
    assert config.optimizer.lr == 1e-3
    assert config.training.batch_size == 8
    assert config.sequential.runs and config.sequential.epochs == 3.0
    assert config.parallelism.shard == "ddp"
    assert config.saving.save_every == 5 and config.saving.recipe == {"stage": 1}
    assert config.objective.teacher_states == "/t"
    assert config.scope.lora_rank == 4
    sections = config.sections()
    assert [type(s) for s in sections] == list(SECTIONS)
    assert sections == tuple(getattr(config, PROPERTIES[kind]) for kind in SECTIONS)
    assert AdaptConfig.from_flat(**{k: v for s in sections for k, v in asdict(s).items()}) == config
    with pytest.raises(FrozenInstanceError):
        config.optimizer.lr = 1.0  # type: ignore[misc]


def test_the_fingerprint_is_the_flat_fields():
    config = _config(lr=2e-4)
    assert config.fingerprint()["lr"] == 2e-4
    assert not {"optimizer", "training", "objective"} & set(config.fingerprint())


# one bad value per section: refused by that section's check alone, with check_settings's message
MISTAKES = [
    (ObjectiveSettings, {"objectives": "bogus"}, "bogus"),
    (ObjectiveSettings, {"local_inputs": "zz"}, "must be one of"),
    (ObjectiveSettings, {"kd_divergence": "x"}, "unknown kd divergence 'x'"),
    (ObjectiveSettings, {"kd_top_k": -1}, "kd_top_k must be 0"),
    (ObjectiveSettings, {"kd_top_k": 5, "kd_divergence": "reverse"}, "does not apply to the reverse divergence"),
    (ScopeSettings, {"train": "x"}, "unknown --train scope 'x'"),
    (ScopeSettings, {"interpolate": 2.0}, r"interpolate must be in \(0, 1\]"),
    (ScopeSettings, {"interpolate": 0.5, "head_grouping": True}, "interpolate with head grouping is not supported"),
    (ScopeSettings, {"ema": 1.5}, r"ema must be in \[0, 1\)"),
    (ScopeSettings, {"ema": 0.5, "train": "lora"}, "ema with --train lora is not supported"),
    (SequentialSettings, {"local_schedule": "q"}, "unknown --local-schedule 'q'"),
    (SequentialSettings, {"states": "x"}, "unknown states setting 'x'"),
    (SequentialSettings, {"local_schedule": "sequential", "epochs": 0.0}, "epochs must be positive"),
    (SequentialSettings, {"local_schedule": "sequential", "epochs_ramp": 1.0}, r"epochs_ramp must be in \(-1, 1\)"),
    (SequentialSettings, {"local_schedule": "sequential", "window": 0}, "window must be at least 1"),
    (SequentialSettings, {"local_schedule": "sequential", "window": 2, "closed_form": True}, "does not combine with window > 1"),
    (SequentialSettings, {"window": 2}, "window groups the sequential stage's layers"),
    (SequentialSettings, {"epochs_ramp": 0.5}, "epochs_ramp shares the sequential stage's epochs"),
    (SequentialSettings, {"closed_form": True}, "closed_form refits each layer before the sequential training"),
    (TrainingSettings, {"tokens": 0}, "tokens must be at least 1, got 0"),
    (TrainingSettings, {"seq_len": 0}, "seq-len must be at least 2 .*, got 0"),
    (TrainingSettings, {"seq_len": 1}, "seq-len must be at least 2 .*, got 1"),
    (TrainingSettings, {"batch_size": 0}, "batch-size must be at least 1, got 0"),
    (TrainingSettings, {"grad_accum": 0}, "grad-accum must be at least 1, got 0"),
    (SavingSettings, {"save_every": 0}, "save-every must be at least 1, got 0"),
    (SavingSettings, {"save_minutes": 0.0}, "save-minutes must be positive, got 0"),
    (ParallelismSettings, {"shard": "x"}, "unknown --shard 'x'"),
    (ParallelismSettings, {"device": "zz"}, "unknown device 'zz'"),
    (ParallelismSettings, {"dtype": "q"}, "q"),
    (ParallelismSettings, {"mixed_precision": "x"}, "unknown --mixed-precision 'x'"),
    (OptimizerSettings, {"lr": 0.0}, "learning rate must be positive, got 0.0"),
]


@pytest.mark.parametrize("kind, settings, message", MISTAKES, ids=[f"{k.__name__}-{'-'.join(s)}" for k, s, _ in MISTAKES])
def test_each_section_refuses_its_own_mistakes_alone(kind, settings, message):
    config = _config(**settings)
    sections = dict(zip(SECTIONS, config.sections()))
    with pytest.raises(LadderizeError, match=message) as refused:
        sections[kind].check()
    for other, section in sections.items():
        if other is not kind:
            section.check()
    with pytest.raises(LadderizeError) as whole:
        check_settings(config)
    assert str(whole.value) == str(refused.value)


# the rules between sections: every section passes on its own, check_settings refuses the combination
CROSS = [
    ({"local_schedule": "sequential", "objectives": "kd"}, "trains with the local objective alone"),
    ({"local_schedule": "sequential", "train": "all"}, r"trains the converted layers \(--train converted\)"),
    ({"local_schedule": "sequential", "local_inputs": "stack"}, "keep the graph through the whole stack"),
    ({"local_schedule": "sequential", "interpolate": 0.5}, "interpolate applies to a joint stage"),
    ({"local_schedule": "sequential", "ema": 0.5}, "ema applies to a joint stage"),
    ({"local_schedule": "sequential", "mixed_precision": "fp16"}, "has no fp16 loss scaling"),
    ({"local_schedule": "sequential", "dtype": "float16"}, "trains in float32 or bfloat16"),
]


@pytest.mark.parametrize("settings, message", CROSS, ids=["-".join(s) for s, _ in CROSS])
def test_rules_between_sections_are_check_settings_own(settings, message):
    config = _config(**settings)
    for section in config.sections():
        section.check()
    with pytest.raises(LadderizeError, match=message):
        check_settings(config)


def test_a_steps_tokens_and_count_are_the_training_sections_own():
    """Tokens per step, a joint stage's steps and the whole sequences are derived once, by the training section, for
    the trainer, the plan, its price and the sequential schedule alike; no module derives them by hand."""
    import re
    from pathlib import Path

    from ladderize.adapt.plan.settings_sections import TrainingSettings

    training = TrainingSettings(tokens=1000, seq_len=32, batch_size=3)
    assert (training.tokens_per_step, training.steps, training.sequences) == (96, 11, 31)
    assert TrainingSettings(tokens=1, seq_len=32, batch_size=3).steps == 1
    adapt = Path(__file__).resolve().parents[2] / "ladderize" / "adapt"
    by_hand = [f"{file.name}:{number}" for file in sorted(adapt.rglob("*.py"))
               for number, line in enumerate(file.read_text().splitlines(), 1)
               if file.name != "settings_sections.py" and (
                   re.search(r"training\.(batch_size \* [a-z_.]*training\.seq_len|seq_len \* [a-z_.]*training\.batch_size)", line)
                   or re.search(r"training\.tokens / ", line) or re.search(r"training\.tokens // [a-z_.]*seq_len", line))]
    assert not by_hand, by_hand
