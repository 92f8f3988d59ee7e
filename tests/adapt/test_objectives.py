"""Each objective lowers its own loss; scopes train exactly the parameters they promise."""

from __future__ import annotations

import pytest
import torch

from ladderize.adapt.objectives import registry as objective_registry
from ladderize.adapt.objectives.losses import AdaptLoss, kd_loss
from ladderize.adapt.objectives.registry import logit_block_rows, parse_objectives
from ladderize.adapt.plan.config import AdaptConfig, validate_config
from ladderize.adapt.train.replicated import select_trainable
from ladderize.adapt.stage_run import adapt
from ladderize.adapt.train.lora import LoraSpec
from ladderize.checkpoint.io import load_model
from ladderize.errors import LadderizeError
from ladderize.model.layout import LayerMode
from tests.conftest import tiny_model


def _dense_and(modes, **kw):
    teacher = tiny_model(seed=0)
    student = tiny_model(seed=0, layer_modes=modes, **kw)
    student.load_state_dict(teacher.state_dict())
    return teacher, student


def _train(loss_module, params, steps=25, lr=3e-3):
    ids = torch.randint(3, 128, (4, 32), generator=torch.Generator().manual_seed(1))
    optimizer = torch.optim.Adam(params, lr=lr)
    first = loss_module(ids)["total"].item()
    for _ in range(steps):
        loss = loss_module(ids)["total"]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return first, loss_module(ids)["total"].item()


@pytest.mark.parametrize(
    "objective,modes,local_inputs",
    [
        ("local", ["dense", "dense", "ladder", "ladder"], "teacher"),
        ("local", ["dense", "dense", "ladder", "ladder"], "student"),
        ("local", ["dense", "spd", "spd", "spd"], "teacher"),
        ("kd", ["dense", "dense", "ladder", "ladder"], "teacher"),
        ("lm", ["dense", "dense", "ladder", "spd"], "teacher"),
        ("kd,local", ["dense", "spd", "ladder", "ladder"], "teacher"),
        ("kd,local", ["dense", "spd", "ladder", "ladder"], "stack"),
    ],
)
def test_each_objective_lowers_its_loss(objective, modes, local_inputs):
    torch.manual_seed(0)
    teacher, student = _dense_and(modes, spd_tp_size=3)
    params = select_trainable(student, "converted", LoraSpec())
    module = AdaptLoss(student, teacher, parse_objectives(objective), local_inputs, share_prefix=True)
    first, last = _train(module, params, lr={"lm": 3e-3, "kd": 1e-4}.get(objective, 3e-4))
    assert last < (0.7 if objective == "local" else 0.9) * first, (objective, first, last)


def test_local_loss_is_zero_for_an_unconverted_function():
    """SPD at TP=1 is exact, so its block-to-block error starts at zero."""
    teacher, student = _dense_and(["dense", "spd", "spd", "dense"], spd_tp_size=1)
    module = AdaptLoss(student, teacher, {"local": 1.0})
    assert module(torch.randint(3, 128, (2, 16)))["local"].item() < 1e-10


def test_kd_loss_is_zero_for_identical_logits():
    logits = torch.randn(2, 5, 11)
    assert kd_loss(logits, logits).abs().item() < 1e-6
    assert kd_loss(logits, logits, divergence="reverse").abs().item() < 1e-6


@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_kd_divergences_match_their_definitions(temperature):
    """forward: sum_v p_t (log p_t - log p_s); reverse: sum_v p_s (log p_s - log p_t); mean over tokens, times T^2."""
    gen = torch.Generator().manual_seed(3)
    student, teacher = torch.randn(2, 5, 11, generator=gen), torch.randn(2, 5, 11, generator=gen) * 3
    p_s = torch.softmax(student.double() / temperature, -1)
    p_t = torch.softmax(teacher.double() / temperature, -1)
    forward = (p_t * (p_t.log() - p_s.log())).sum(-1).mean() * temperature**2
    reverse = (p_s * (p_s.log() - p_t.log())).sum(-1).mean() * temperature**2
    assert abs(forward.item() - reverse.item()) > 0.1  # the two really differ on these logits
    assert kd_loss(student, teacher, temperature).item() == pytest.approx(forward.item(), rel=1e-5)
    assert kd_loss(student, teacher, temperature, "reverse").item() == pytest.approx(reverse.item(), rel=1e-5)


@pytest.mark.parametrize("temperature,top_k", [(1.0, 1), (2.0, 3), (1.0, 11)])
def test_top_k_kd_matches_its_definition(temperature, top_k):
    """sum over the teacher's top k of q (log q - log p_s), q the teacher's softmax over its top k alone and p_s the
    student's over the whole vocabulary; mean over tokens, times T^2. k = V is the full KL; k = 1 is cross-entropy
    on the teacher's greedy token."""
    gen = torch.Generator().manual_seed(5)
    student, teacher = torch.randn(2, 5, 11, generator=gen), torch.randn(2, 5, 11, generator=gen) * 3
    log_p_s = torch.log_softmax(student.double() / temperature, -1).reshape(-1, 11)
    expected = 0.0
    for row, teacher_row in enumerate(teacher.double().reshape(-1, 11) / temperature):
        kept = sorted(range(11), key=lambda v: -teacher_row[v].item())[:top_k]
        q = torch.softmax(teacher_row[kept], -1)
        expected += sum(q[i] * (q[i].log() - log_p_s[row, v]) for i, v in enumerate(kept))
    expected = expected / 10 * temperature**2
    assert kd_loss(student, teacher, temperature, top_k=top_k).item() == pytest.approx(expected.item(), rel=1e-5)
    if top_k == 1:
        greedy = teacher.reshape(-1, 11).argmax(-1)
        hard = torch.nn.functional.cross_entropy(student.reshape(-1, 11) / temperature, greedy)
        assert kd_loss(student, teacher, temperature, top_k=1).item() == pytest.approx(hard.item(), rel=1e-5)
    if top_k == 11:
        assert kd_loss(student, teacher, temperature, top_k=11).item() == pytest.approx(kd_loss(student, teacher, temperature).item(), rel=1e-6)
    else:
        assert abs(kd_loss(student, teacher, temperature, top_k=top_k).item() - kd_loss(student, teacher, temperature).item()) > 0.01


def test_top_k_kd_refuses_a_negative_count_and_the_reverse_divergence():
    teacher, student = _dense_and(["dense", "dense", "ladder", "ladder"])
    with pytest.raises(LadderizeError, match="kd_top_k must be 0"):
        AdaptLoss(student, teacher, {"kd": 1.0}, kd_top_k=-1)
    with pytest.raises(LadderizeError, match="does not apply to the reverse divergence"):
        AdaptLoss(student, teacher, {"kd": 1.0}, kd_divergence="reverse", kd_top_k=8)


def test_reverse_kd_lowers_its_loss_and_bad_divergence_is_refused():
    torch.manual_seed(0)
    teacher, student = _dense_and(["dense", "dense", "ladder", "ladder"])
    module = AdaptLoss(student, teacher, {"kd": 1.0}, share_prefix=True, kd_divergence="reverse")
    first, last = _train(module, select_trainable(student, "converted", LoraSpec()), lr=1e-4)
    assert last < 0.9 * first, (first, last)
    with pytest.raises(LadderizeError, match="kd divergence must be one of forward, reverse"):
        AdaptLoss(student, teacher, {"kd": 1.0}, kd_divergence="backward")


@pytest.mark.parametrize("temperature,divergence,top_k", [(1.0, "forward", 0), (2.0, "reverse", 0), (1.0, "forward", 5)])
def test_head_losses_in_blocks_equal_the_full_logits(temperature, divergence, top_k, monkeypatch):
    """lm and kd computed 16 tokens at a time (BlockwiseLoss) equal the whole-logit losses, values and gradients.

    Both sides are float32; they differ only in summation order (per-block sums, then the
    total), so they agree to a few float32 ulps of the loss, far inside 1e-5 relative.
    """
    torch.manual_seed(0)
    teacher, student = _dense_and(["dense", "ladder", "spd", "ladder"], spd_tp_size=3)
    with torch.no_grad():
        for param in student.parameters():
            param.add_(torch.randn_like(param) * 0.02)  # a student that differs from its teacher
    ids = torch.randint(3, 128, (3, 15), generator=torch.Generator().manual_seed(2))
    select_trainable(student, "all", LoraSpec())
    monkeypatch.setattr(objective_registry, "LOGIT_BLOCK_BYTES", 4 * student.config.vocab_size * 16)
    assert logit_block_rows(student.config.vocab_size) == 16  # 45 tokens: blocks of 16, 16 and 13
    module = AdaptLoss(student, teacher, {"lm": 1.0, "kd": 0.5}, kd_temperature=temperature, kd_divergence=divergence,
                       kd_top_k=top_k)
    losses = module(ids)
    losses["total"].backward()
    blocked = {name: param.grad.clone() for name, param in student.named_parameters()}
    student.zero_grad()

    logits = student(ids, use_cache=False).logits
    with torch.no_grad():
        teacher_logits = teacher(ids, use_cache=False).logits
    lm = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
    kd = kd_loss(logits, teacher_logits, temperature, divergence, top_k)
    (lm + 0.5 * kd).backward()
    assert losses["lm"].item() == pytest.approx(lm.item(), rel=1e-5)
    assert losses["kd"].item() == pytest.approx(kd.item(), rel=1e-5)
    assert kd.item() > 1e-3  # the kd term is really there
    for name, param in student.named_parameters():
        torch.testing.assert_close(blocked[name], param.grad, rtol=1e-5, atol=1e-7, msg=name)


def _perturbed(modes):
    teacher, student = _dense_and(modes, spd_tp_size=3)
    with torch.no_grad():
        for param in student.parameters():
            param.add_(torch.randn_like(param, generator=torch.Generator().manual_seed(param.numel())) * 0.02)
    select_trainable(student, "all", LoraSpec())
    return teacher, student


def _layer_outputs(model, ids):
    """Each layer's (residual, post-attention residual) leaving it, written out layer by layer."""
    residual = stale = model.model.embed_tokens(ids)
    kwargs = model.model.layer_kwargs(residual)
    outputs = []
    for layer in model.model.layers:
        residual, stale = layer(residual, stale, **kwargs)
        outputs.append((residual, stale))
    return residual, outputs


def test_deep_supervision_is_kd_plus_every_converted_layers_error_through_the_stack():
    """``local_inputs="stack"``, written out: the student's own states with the graph kept; a layer that all-reduces
    its attention is matched after each module (each error over the mean square of the teacher's module update), an
    SPD layer after the block; the mean over converted layers is added to kd of the same pass. Values and gradients."""
    modes = ["dense", "ladder", "spd", "ladder"]
    teacher, student = _perturbed(modes)
    ids = torch.randint(3, 128, (2, 12), generator=torch.Generator().manual_seed(3))
    module = AdaptLoss(student, teacher, {"kd": 1.0, "local": 0.5}, "stack")
    losses = module(ids)
    losses["total"].backward()
    stacked = {name: param.grad.clone() for name, param in student.named_parameters()}
    student.zero_grad()

    with torch.no_grad():
        t_final, t_outs = _layer_outputs(teacher, ids)
        t_ins = [(teacher.model.embed_tokens(ids),) * 2] + t_outs[:-1]
        teacher_logits = teacher.lm_head(teacher.model.norm(t_final))
    s_final, s_outs = _layer_outputs(student, ids)
    errors = []
    for index, mode in enumerate(modes):
        (s_res, s_mid), (t_res, t_mid), t_in = s_outs[index], t_outs[index], t_ins[index][0]
        if not LayerMode(mode).is_converted:
            continue
        if not LayerMode(mode).syncs_attention:  # SPD: the block
            errors.append(((s_res - t_res) ** 2).mean() / ((t_res - t_in) ** 2).mean())
        else:  # ladder: each module
            errors.append(((s_mid - t_mid) ** 2).mean() / ((t_mid - t_in) ** 2).mean()
                          + ((s_res - t_res) ** 2).mean() / ((t_res - t_mid) ** 2).mean())
    local = sum(errors) / len(errors)
    kd = kd_loss(student.lm_head(student.model.norm(s_final)), teacher_logits)
    (kd + 0.5 * local).backward()
    assert local.item() > 1e-3 and kd.item() > 1e-4  # both terms are really there
    assert losses["local"].item() == pytest.approx(local.item(), rel=1e-5)
    assert losses["kd"].item() == pytest.approx(kd.item(), rel=1e-5)
    for name, param in student.named_parameters():  # float32 sums in another order: within 1e-5 of the gradient's norm
        assert (stacked[name] - param.grad).norm() <= 1e-5 * param.grad.norm(), name


def test_deep_supervision_trains_lower_layers_by_the_errors_above_them():
    """The same local loss on the student's own states: with the graph cut between layers (``student``) a layer learns
    from its own error only; through the stack (``stack``) the lower converted layers also learn from the errors above."""
    teacher, student = _perturbed(["dense", "ladder", "ladder", "ladder"])
    ids = torch.randint(3, 128, (2, 12), generator=torch.Generator().manual_seed(4))
    grads, values = {}, {}
    for inputs in ("student", "stack"):
        student.zero_grad()
        loss = AdaptLoss(student, teacher, {"local": 1.0}, inputs, share_prefix=True)(ids)["total"]
        loss.backward()
        values[inputs] = loss.item()
        grads[inputs] = {name: param.grad.clone() for name, param in student.named_parameters() if param.grad is not None}
    assert values["stack"] == pytest.approx(values["student"], rel=1e-6)  # the same errors, the same forward
    top, lower = "model.layers.3.mlp.down_proj.weight", "model.layers.1.mlp.down_proj.weight"
    torch.testing.assert_close(grads["stack"][top], grads["student"][top], rtol=1e-5, atol=1e-8)
    assert (grads["stack"][lower] - grads["student"][lower]).norm() > 0.05 * grads["student"][lower].norm()
    assert "model.layers.0.mlp.down_proj.weight" not in grads["stack"]  # the frozen prefix is the teacher's states


def test_deep_supervision_is_refused_by_the_sequential_stage():
    with pytest.raises(LadderizeError, match="joint stage"):
        validate_config(AdaptConfig.from_flat(checkpoint="c", out="o", objectives="local", local_schedule="sequential",
                                    local_inputs="stack"))


def test_logit_blocks_fit_the_allocator_pool():
    assert logit_block_rows(49_152) == 128  # SmolLM2: 24 MiB of float32 logits per block
    assert logit_block_rows(128_256) == 49  # Llama 3
    assert logit_block_rows(10**9) == 16


def test_scopes_choose_converted_layers_only():
    model = tiny_model(layer_modes=["dense", "ladder", "dense", "spd"], spd_tp_size=3)
    params = select_trainable(model, "converted", LoraSpec())
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trained and all(n.startswith(("model.layers.1.", "model.layers.3.")) for n in trained)
    assert len(params) == len(trained)
    select_trainable(model, "all", LoraSpec())
    assert all(p.requires_grad for p in model.parameters())


def test_objective_spec_errors():
    assert parse_objectives("kd=0.5, local") == {"kd": 0.5, "local": 1.0}
    for bad in ("", "mse", "kd=x", "lm=-1"):
        with pytest.raises(LadderizeError):
            parse_objectives(bad)


@pytest.mark.parametrize("scope", ["converted", "lora", "all"])
def test_adapt_end_to_end_writes_a_converted_checkpoint(scope, ladder_dir, dense_dir, text_file, tmp_path):
    out = tmp_path / "adapted"
    result = adapt(
        AdaptConfig.from_flat(checkpoint=str(ladder_dir), out=str(out), data=str(text_file), objectives="local,kd",
                    train=scope, tokens=32 * 2 * 6, seq_len=32, batch_size=2, lr=1e-3, save_every=4)
    )
    assert result.steps == 6 and (out / "adapt_curve.json").is_file()
    model = load_model(out)
    assert model.layout.describe() == "ladder 2:4"
    from ladderize.checkpoint.io import read_provenance

    provenance = read_provenance(out)
    assert provenance["source"]["path"] == str(dense_dir)
    assert provenance["history"][-1]["step"] == "adapt" and provenance["history"][-1]["train"] == scope
    assert not any("lora" in name or "parametrizations" in name for name in model.state_dict())
    original = load_model(ladder_dir)
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, original.state_dict()[n])}
    if scope != "all":
        assert changed and all(n.startswith(("model.layers.2.", "model.layers.3.")) for n in changed)


@pytest.mark.parametrize("objective,kept", [("kd", ([1], [])), ("kd,local", ([1, 2, 3], [1, 2, 3])), ("lm,local", ([1, 2, 3], [1, 2, 3]))])
def test_the_teacher_keeps_only_the_states_its_objective_reads(objective, kept):
    """kd reads the state entering the first converted layer and the final stream: the teacher's pass keeps no state
    of the layers above; local compares every converted layer, so it keeps each one's input and output."""
    teacher, student = _dense_and(["dense", "ladder", "ladder", "ladder"])
    module = AdaptLoss(student, teacher, parse_objectives(objective), share_prefix=True)
    ids = torch.randint(3, 100, (2, 12), generator=torch.Generator().manual_seed(0))
    states = module._teacher_states(ids, want_final="kd" in objective)
    assert (sorted(states.inputs), sorted(states.outputs)) == kept
    assert (states.final is not None) == ("kd" in objective)
    module(ids)["total"].backward()  # the pass serves the loss it was kept for
