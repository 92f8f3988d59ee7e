"""Compiled decoder layers (``adapt --compile``) and the fused AdamW: the same training as eager, within rounding."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from ladderize.adapt.train.compilation import adamw, compile_layers
from ladderize.adapt.plan.compile_policy import AUTO_MIN_BUDGET_S, ENV, eager_for_budget, inductor_options, resolve_compile, unavailable
from ladderize.adapt.plan.config import AdaptConfig
from ladderize.convert.residual_states import attention_kwargs
from ladderize.adapt.plan.budget import parse_budget
from ladderize.adapt.stage_run import adapt
from ladderize.checkpoint.io import load_model
from ladderize.errors import LadderizeError
from tests.adapt.conftest import convert
from tests.conftest import tiny_model
from tests.adapt.conftest import timed, typed

CPU = torch.device("cpu")
needs_compiler = pytest.mark.skipif(unavailable("cpu") is not None, reason=f"torch.compile cannot run here: {unavailable('cpu')}")


@pytest.fixture(scope="module")
def hybrid_dir(dense_dir, tmp_path_factory):
    """SPD at TP=3 on layer 1, dense layer 2 in between, ladder on layer 3: every layer kind."""
    return convert(dense_dir, tmp_path_factory.mktemp("hybrid") / "tiny-hybrid", ladder="3:4", spd="1:2", spd_tp_size=3)


def _captured() -> int:
    from torch._dynamo.utils import counters

    return counters["stats"]["calls_captured"]


def test_the_setting_resolves_by_its_rules(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    assert resolve_compile(False, CPU) is False
    with pytest.raises(LadderizeError, match="cannot run on meta here: not measured on meta"):
        resolve_compile(True, torch.device("meta"))
    assert resolve_compile(None, torch.device("meta")) is False
    assert resolve_compile(None, torch.device("cuda")) is False  # auto: not measured on CUDA; --compile asks for it
    monkeypatch.setenv(ENV, "off")
    assert resolve_compile(None, CPU) is False
    monkeypatch.setenv(ENV, "maybe")
    with pytest.raises(LadderizeError, match=r"LADDERIZE_COMPILE='maybe': use 1/on or 0/off"):
        resolve_compile(None, CPU)


@needs_compiler
def test_auto_compiles_on_a_cpu_with_a_compiler(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    assert resolve_compile(None, CPU) is True
    assert resolve_compile(True, CPU) is True


@needs_compiler
def test_auto_runs_a_short_wall_budget_eager(monkeypatch):
    """The compiler's waits (about a minute a stage on a cold cache) cost more than fused ops save in a short budget:
    on ladder 15-29 with a cold Inductor cache, a 20 s budget was refused as too short compiled (1.3 min), and fit eager."""
    monkeypatch.delenv(ENV, raising=False)
    assert AUTO_MIN_BUDGET_S == 1800.0  # the budget a compiled run was measured at against eager (docs/adapt-measurements.md)
    assert eager_for_budget(None, 20.0, CPU) and eager_for_budget(None, AUTO_MIN_BUDGET_S - 1, CPU)
    assert not eager_for_budget(None, AUTO_MIN_BUDGET_S, CPU)  # from 30 minutes on, auto compiles
    assert not eager_for_budget(True, 20.0, CPU)  # --compile is the user's to give, whatever the budget
    assert not eager_for_budget(False, 20.0, CPU)
    assert not eager_for_budget(None, 20.0, torch.device("cuda"))  # auto is eager there already: nothing to say


@needs_compiler
def test_a_short_wall_budget_plans_eager_stages_and_says_so(ladder_dir, text_file, monkeypatch):
    from ladderize.adapt.plan.budget import _eager_if_short
    from ladderize.adapt.plan.config import GivenSettings
    from ladderize.adapt.plan.stages import load_recipe, resolve_stages

    monkeypatch.delenv(ENV, raising=False)
    steps = resolve_stages(load_recipe("best"), str(ladder_dir),
                           GivenSettings.of({"data": str(text_file), "seq_len": 32, "batch_size": 2}))
    said: list[str] = []
    sized, record = timed(typed(steps), parse_budget("60s"), str(ladder_dir), said.append)
    assert [stage.step["compile"] for stage in sized] == [False, False] and record.pace.compiled is False
    assert said[0].startswith("budget 60 s: eager layers (auto compiles from 30.0 min on"), said
    # stages that ask for compile keep it, and nothing is said (the rule alone: compiling the pace would take a minute)
    asked, before = typed([{**step.step, "compile": True} for step in steps]), len(said)
    assert _eager_if_short(asked, parse_budget("5s"), "cpu", said.append) == asked and len(said) == before


def test_a_cpu_without_a_compiler_runs_eager_by_default_and_refuses_compile(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setenv("CXX", "no-such-compiler-here")
    unavailable.cache_clear()
    try:
        assert unavailable("cpu") == "no C++ compiler found (g++, c++, clang++ or $CXX)"
        assert resolve_compile(None, CPU) is False
        with pytest.raises(LadderizeError, match="no C\\+\\+ compiler found"):
            resolve_compile(True, CPU)
    finally:
        unavailable.cache_clear()


def test_fused_adamw_makes_the_loops_update():
    torch.manual_seed(0)
    weights = [torch.randn(7, 5), torch.randn(5)]
    runs = []
    for fused in (True, False):
        params = [torch.nn.Parameter(w.clone()) for w in weights]
        settings = dict(lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
        optimizer = adamw(params, **settings) if fused else torch.optim.AdamW(params, **settings)  # the loop's update
        assert optimizer.defaults["fused"] is (True if fused else None)
        for step in range(10):
            for param in params:
                param.grad = torch.sin(param.detach() * (step + 1))
            optimizer.step()
        runs.append(params)
    for fused, loop in zip(*runs):
        assert not torch.equal(fused, weights[0] if fused.dim() == 2 else weights[1])
        torch.testing.assert_close(fused, loop, rtol=1e-6, atol=1e-7)


@needs_compiler
def test_a_compiled_layer_computes_the_eager_layer_and_its_gradients():
    model = tiny_model(layer_modes=["spd", "dense", "ladder", "ladder"], spd_tp_size=3)
    kwargs = attention_kwargs(model, 2, 16, torch.float32)
    generator = torch.Generator().manual_seed(1)
    state = tuple(torch.randn(2, 16, model.config.hidden_size, generator=generator) for _ in range(2))
    for eager in model.model.layers[:3]:  # every kind: SPD, dense, ladder
        compiled = copy.deepcopy(eager)
        before = _captured()
        compile_layers([compiled], "cpu")
        results = []
        for layer in (eager, compiled):
            layer.requires_grad_(True)
            inputs = tuple(s.clone().requires_grad_(True) for s in state)
            out = layer(*inputs, **kwargs)
            sum((o * torch.cos(o)).sum() for o in out).backward()
            results.append([*out, *(i.grad for i in inputs), *(p.grad for p in layer.parameters())])
        assert _captured() > before  # the compiled layer ran through dynamo
        for mine, theirs in zip(*results):
            torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-5)


@needs_compiler
def test_graphs_compiled_for_cuda_pick_their_kernels_by_rule(monkeypatch):
    """On CUDA, Inductor times a reduction's candidate block sizes and keeps the fastest, and the block sizes set the
    order of its sums: the H100 GPU check saw a compiled stage's loss drift from eager 27 times further beside other
    load than alone. Graphs compiled for CUDA (the decoder layers and the kd loss) ask for Inductor's deterministic
    mode; a CPU's are Inductor's defaults. This torch knows the setting (it refuses a key it does not know), and a
    layer compiled with it computes the eager layer's output and gradients."""
    assert inductor_options("cuda") == inductor_options(torch.device("cuda", 0)) == {"deterministic": True}
    assert inductor_options(CPU) == {}
    seen = []
    real = torch.nn.Module.compile
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, **kw: (seen.append(kw), real(self, **kw))[1])
    model = tiny_model(layer_modes=["ladder", "dense"], num_hidden_layers=2)
    layers = copy.deepcopy(model.model.layers)
    compile_layers(layers, "cuda")
    compile_layers(copy.deepcopy(model.model.layers), CPU)
    assert seen == [{"dynamic": False, "options": {"deterministic": True}}] * 2 + [{"dynamic": False, "options": {}}] * 2
    kwargs = attention_kwargs(model, 1, 8, torch.float32)
    state = (torch.randn(1, 8, model.config.hidden_size), torch.randn(1, 8, model.config.hidden_size))
    for eager, compiled in zip(model.model.layers, layers):  # on the CPU, in the deterministic mode CUDA gets
        outs = []
        for layer in (eager, compiled):
            inputs = tuple(x.clone().requires_grad_(True) for x in state)
            out = layer(*inputs, **kwargs)
            sum(o.sum() for o in out).backward()
            outs.append([*out, *(x.grad for x in inputs)])
        for mine, theirs in zip(*outs):
            torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-5)


def _graphs_of_every_layer(modes: list[str], **config) -> int:
    """Run each layer of a tiny model of ``modes`` compiled, without gradient and with it: the graphs dynamo made
    (from an empty cache: the layers of an earlier test's model of the same sizes would share theirs)."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()

    model = tiny_model(layer_modes=modes, num_hidden_layers=len(modes), **config)
    compile_layers(model.model.layers, "cpu")
    kwargs = attention_kwargs(model, 1, 8, torch.float32)
    state = (torch.randn(1, 8, model.config.hidden_size), torch.randn(1, 8, model.config.hidden_size))
    before = counters["stats"]["unique_graphs"]
    for layer in model.model.layers:
        with torch.no_grad():
            layer(*state, **kwargs)
        layer.requires_grad_(True)
        layer(*state, **kwargs)[0].sum().backward()
    return counters["stats"]["unique_graphs"] - before


@needs_compiler
def test_layers_of_one_kind_share_their_graphs():
    """A layer's residual-stream slots are numbered from its own start (residual.layer_program), so 12 ladder layers
    are two graphs per grad mode, not twelve: the first layer (whose stale state is its input) and the rest."""
    assert _graphs_of_every_layer(["ladder"] * 12) == 4


@needs_compiler
def test_every_layer_of_a_mixed_model_runs_compiled():
    """Six kinds of layer by what they read (the first; dense, ladder and SPD after dense; SPD and ladder after SPD)
    x 2 grad modes are 12 graphs, past dynamo's default limit of 8, after which the rest would run eager without a
    word (it would count 8)."""
    modes = ["dense", "dense", "ladder", "ladder", "spd", "spd", "ladder", "dense", "spd", "ladder"]
    assert _graphs_of_every_layer(modes, spd_tp_size=3) == 12


def _run(checkpoint, out, text_file, **kw) -> tuple:
    settings = dict(checkpoint=str(checkpoint), out=str(out), data=str(text_file), tokens=32 * 8, seq_len=32,
                    batch_size=2, lr=3e-4, warmup_steps=1, dtype="float32")
    result = adapt(AdaptConfig.from_flat(**{**settings, **kw}))
    return result, load_model(out).state_dict()


STAGES = [dict(objectives="local", local_schedule="sequential", epochs=2), dict(objectives="kd", kd_temperature=2.0)]
STAGE_IDS = ["seq-local", "kd"]


@needs_compiler
@pytest.mark.parametrize("stage", STAGES, ids=STAGE_IDS)
def test_a_compiled_stage_trains_as_the_eager_one(stage, hybrid_dir, text_file, tmp_path):
    assert_compiled_trains_as_eager(hybrid_dir, text_file, tmp_path, stage)


@needs_compiler
def test_compiled_layers_train_sharded_as_eager(hybrid_dir, text_file, tmp_path):
    """The sharded path (FSDP2, one process) compiles each decoder layer before sharding it: kd trains as eager."""
    assert_compiled_trains_as_eager(hybrid_dir, text_file, tmp_path, STAGES[1], shard="fsdp", device="cpu")


def assert_compiled_trains_as_eager(hybrid_dir, text_file, tmp_path, stage: dict, **settings) -> None:
    """The stage run compiled (through dynamo) and eager: the same steps, losses within rounding, each weight's
    difference a small part of its update."""
    eager, eager_weights = _run(hybrid_dir, tmp_path / "eager", text_file, compile=False, **stage, **settings)
    before = _captured()
    compiled, compiled_weights = _run(hybrid_dir, tmp_path / "compiled", text_file, compile=True, **stage, **settings)
    assert _captured() > before
    assert compiled.steps == eager.steps
    key = "loss_local" if "local" in stage["objectives"] else "loss_total"
    eager_losses = [record[key] for record in eager.curve]
    # kd on this tiny model is ~1e-4 nats, a difference of log-softmaxes near log(128): float32 rounds it at ~1e-7
    assert [record[key] for record in compiled.curve] == pytest.approx(eager_losses, rel=1e-4, abs=1e-6)
    start = load_model(hybrid_dir).state_dict()
    assert any(not torch.equal(eager_weights[k], start[k]) for k in start)  # it trained
    # AdamW divides by the gradient's scale, so a rounding apart in the gradient moves a weight by up to the learning
    # rate, and the layer above trains on the states of the one below: compare each weight's difference to its
    # update (1.1e-3 of it at most on this model; a layer computing something else differs by the update's order)
    for name, tensor in eager_weights.items():
        assert (compiled_weights[name] - tensor).norm() <= 1e-2 * (tensor - start[name]).norm() + 1e-6, name


def test_the_pace_of_compiled_layers_counts_their_compile_time():
    from ladderize.adapt.plan.stage_clock import COMPILES_PER_STAGE, Pace, stage_seconds

    plain = Pace(device="cpu", precision="float32", tokens_per_call=1024, layer_forward=0.01, layer_train=0.03,
                 head_step=0.05, layer_read=0.001, layers=4, first_converted=2, last_converted=3, converted=2, measured_s=1.0)
    compiled = dataclasses.replace(plain, compiled=True, compile_s=7.0)
    for step in ({"tokens": 4096, "local_schedule": "sequential", "epochs": 2}, {"tokens": 4096}):
        assert stage_seconds(compiled, typed(step)) == pytest.approx(stage_seconds(plain, typed(step)) + COMPILES_PER_STAGE * 7.0)
    # each other kind of layer graph is traced once: 4 layers, 2 and 3 converted (kinds: the first layer 0, the dense
    # layer after it 1, the converted ones 2); a kind shared by the teacher and the student is one graph
    traced = dataclasses.replace(compiled, retrace_forward_s=0.5, retrace_train_s=3.0, teacher_kinds=(0, 1, 1, 1),
                                 student_kinds=(0, 1, 2, 2), converted_kinds=(2, 2))
    kd = {"tokens": 4096}
    assert stage_seconds(traced, typed(kd), stored_teacher=True) == stage_seconds(compiled, typed(kd), stored_teacher=True)
    assert stage_seconds(traced, typed(kd)) == pytest.approx(stage_seconds(compiled, typed(kd)) + 2 * 0.5)  # the teacher's 2 kinds
    assert stage_seconds(traced, typed({**kd, "train": "all"})) == pytest.approx(
        stage_seconds(compiled, typed({**kd, "train": "all"})) + 2 * 0.5 + 2 * 3.0)  # and the student's 2 below
    sequential = {"tokens": 4096, "local_schedule": "sequential", "epochs": 2}
    # without gradient: the teacher's 2 kinds (the student's converted one is the first one's, counted in compile_s)
    assert stage_seconds(traced, typed(sequential)) == pytest.approx(stage_seconds(compiled, typed(sequential)) + 2 * 0.5)
    mixed = dataclasses.replace(traced, student_kinds=(0, 1, 2, 3), converted_kinds=(2, 3))  # e.g. SPD, then ladder
    assert stage_seconds(mixed, typed(sequential)) == pytest.approx(stage_seconds(compiled, typed(sequential)) + 3 * 0.5 + 3.0)
    assert stage_seconds(dataclasses.replace(traced, compiled=False), typed(kd)) == stage_seconds(plain, typed(kd))


def test_the_pace_records_every_layers_graph_kind(ladder_dir):
    """The kinds come from the checkpoint's layout: the tiny ladder model's converted layers (2 and 3) share one
    kind, and the teacher's dense layers share the student's dense ones' (the first layer's, and the one after it)."""
    from ladderize.adapt.train.pace import measure

    pace = measure(str(ladder_dir), seq_len=8, batch_size=1, device="cpu", compile=False)
    assert (pace.teacher_kinds, pace.student_kinds, pace.converted_kinds) == ((0, 1, 1, 1), (0, 1, 2, 2), (2, 2))


def test_compile_is_a_setting_of_the_command_line_and_of_recipes():
    from ladderize.adapt.plan.stages import parse_stage

    assert parse_stage("kd:compile=false").settings.record() == {"compile": False}
    assert "compile" not in AdaptConfig.from_flat(checkpoint="c", out="o").fingerprint()


def test_the_frozen_head_cast_once_gives_autocasts_bits():
    from ladderize.adapt.objectives.losses import frozen_head

    torch.manual_seed(0)
    head, rows = torch.nn.Linear(16, 40, bias=False).requires_grad_(False), torch.randn(6, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(frozen_head(head)(rows), head(rows))
    assert frozen_head(head) is head  # no autocast: the head itself


@needs_compiler
@pytest.mark.parametrize("settings", [dict(), dict(divergence="reverse"), dict(top_k=5)], ids=["forward", "reverse", "top-k"])
def test_the_compiled_kd_loss_and_its_gradient_are_the_eager_ones(settings):
    from ladderize.adapt.objectives.losses import blockwise_kd

    generator = torch.Generator().manual_seed(0)
    student, teacher = (torch.randn(40, 50, generator=generator) * 3 for _ in range(2))
    results = []
    for compiled in (False, True):
        logits = student.clone().requires_grad_(True)
        loss = blockwise_kd(logits, lambda part: teacher[part], 2.0, compiled=compiled, **settings)
        loss.backward()
        results.append((loss.detach(), logits.grad))
    torch.testing.assert_close(results[1][0], results[0][0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(results[1][1], results[0][1], rtol=1e-5, atol=1e-7)
