"""The residual interpreter (``ladderize.model.residual``) against the equations written out plainly.

The parity tests check the three forward loops on real Llama kernels; this checks the interpreter
itself with toy kernels: every layout of dense, ladder and SPD layers (SPD with several shares on one
device, with biases), the final state against MISSION.md's recurrences, and when each all-reduce is
issued and waited on (a ladder module's all-reduce is waited on only after the next module's is issued).
"""

from __future__ import annotations

import itertools

import pytest
import torch

from ladderize.model.layout import LayerMode, ModuleKind, module_program
from ladderize.model.residual import COMPLETE, ProgramError, ResidualStream, layer_program, slots_before

D, SHARES = 5, 3
DENSE, LADDER, SPD = LayerMode.DENSE, LayerMode.LADDER, LayerMode.SPD


class Toy:
    """Toy kernels: module outputs are smooth nonlinear maps, so a wrong read or add changes the result."""

    def __init__(self, layers: int, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        w = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64) * 0.5  # noqa: E731
        self.attn = [[w(D, D) for _ in range(SHARES)] for _ in range(layers)]
        self.mlp_w = [[w(D, D) for _ in range(SHARES)] for _ in range(layers)]
        self.o_bias = [w(D) for _ in range(layers)]
        self.down_bias = [w(D) for _ in range(layers)]

    # plain functions of the equations (no ModuleOp)
    def y(self, layer, r, h):
        return torch.tanh(h @ self.attn[layer][r])

    def z(self, layer, r, h):
        return torch.sin(h @ self.mlp_w[layer][r])

    def f_attn(self, layer, h):  # the whole attention module: sum over ranks, plus its bias
        return sum(self.y(layer, r, h) for r in range(SHARES)) + self.o_bias[layer]

    def f_mlp(self, layer, h):
        return sum(self.z(layer, r, h) for r in range(SHARES)) + self.down_bias[layer]


class OneDevice:
    """``ModuleKernels`` holding every share on one device (as the HF model does)."""

    def __init__(self, toy: Toy):
        self.toy = toy

    def attention(self, op, h):
        return sum(self.toy.y(op.layer, r, h) for r in range(SHARES))

    def mlp(self, op, h):
        return sum(self.toy.z(op.layer, r, h) for r in range(SHARES))

    def bias(self, op):
        return self.toy.o_bias[op.layer] if op.kind is ModuleKind.ATTENTION else self.toy.down_bias[op.layer]

    def spd_attention(self, op, h):
        return [self.toy.y(op.layer, r, h) for r in range(SHARES)]

    def spd_mlp(self, op, h, share):
        return self.toy.z(op.layer, share, h)


def reference(toy: Toy, modes, r0: torch.Tensor) -> torch.Tensor:
    """MISSION.md: r_k = r_{k-1} + f_k(r_{k-1}) (dense), f_k(r_{k-2}) (ladder), r_{-1} = r_0; an SPD block on
    X = r_{k-1} records r_k = X and r_{k+1} = X + sum_r (Y_r + Z_r(X + Y_r + b_O)) + b_O + b_down."""
    r = [r0, r0]  # r[k + 1] = r_k
    for layer, mode in enumerate(modes):
        if mode is SPD:
            x = r[-1]
            shares = [toy.y(layer, i, x) + toy.z(layer, i, x + toy.y(layer, i, x) + toy.o_bias[layer]) for i in range(SHARES)]
            r += [x, x + sum(shares) + toy.o_bias[layer] + toy.down_bias[layer]]
            continue
        for f in (toy.f_attn, toy.f_mlp):
            source = r[-2] if mode is LADDER else r[-1]
            r.append(r[-1] + f(layer, source))
    return r[-1]


class Logged:
    """A ``Reduction`` that records when each all-reduce is issued and waited on (the sum is already complete)."""

    def __init__(self):
        self.events: list[tuple[str, int]] = []
        self.current = 0

    def start(self, partial, overlap):
        self.events.append(("start", self.current))
        return (self.current, partial)

    def wait(self, handle):
        self.events.append(("wait", handle[0]))
        return handle[1]


LAYOUTS = [modes for modes in itertools.product((DENSE, LADDER, SPD), repeat=3)]


@pytest.mark.parametrize("modes", LAYOUTS, ids=lambda m: "-".join(x.value for x in m))
def test_stream_matches_the_equations(modes):
    toy, kernels = Toy(len(modes), seed=len(modes)), None
    kernels = OneDevice(toy)
    r0 = torch.randn(2, 4, D, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    expected = reference(toy, modes, r0)
    program = module_program(modes)
    whole = ResidualStream(r0).run_all(program, kernels)
    torch.testing.assert_close(whole, expected, rtol=1e-12, atol=1e-12)
    # every all-reduce in flight (domino) and the stream rebuilt at each layer boundary (the HF layer call)
    forced = ResidualStream(r0)
    for op in program:
        forced.run(op, kernels, Logged(), overlap=True)
    torch.testing.assert_close(forced.resolve(), expected, rtol=1e-12, atol=1e-12)
    # the same, numbered as the HF layer numbers it: absolute (slots_before) and from each layer's start
    for numbering in ("absolute", "layer"):
        residual, stale = r0, r0
        for layer in range(len(modes)):
            if numbering == "layer":
                *ops, slots = layer_program(program, layer)
            else:
                ops, slots = program[2 * layer : 2 * layer + 2], slots_before(program, 2 * layer)
            stream = ResidualStream(residual, stale, slots)
            for op in ops:
                stream.run(op, kernels, COMPLETE)
            residual, stale = stream.resolve(), stream.prev
        torch.testing.assert_close(residual, expected, rtol=1e-12, atol=1e-12)


def test_layers_of_one_kind_read_the_same_numbers_from_their_start():
    """``layer_program``: every ladder layer after the first reads the same relative numbers (one compiled graph
    for all of them); the first differs (its stale state is its input) and so does a ladder layer after an SPD
    block (the SPD attention adds no state of its own), while each op keeps its own layer index."""
    program = module_program((LADDER,) * 4 + (SPD, LADDER))
    numbers = [(*((op.k, op.reads, op.allreduce) for op in ops), slots)
               for *ops, slots in (layer_program(program, layer) for layer in range(6))]
    assert numbers[1] == numbers[2] == numbers[3] != numbers[0]
    assert numbers[5] != numbers[1]
    assert [layer_program(program, layer)[0].layer for layer in range(6)] == list(range(6))


@pytest.mark.parametrize("modes", LAYOUTS, ids=lambda m: "-".join(x.value for x in m))
def test_allreduce_waits_follow_the_program(modes):
    """Module k's all-reduce is waited on before module k+1 computes unless ``overlaps_next``; then only
    after module k+1's own all-reduce is issued. SPD attentions issue none."""
    toy = Toy(len(modes))
    kernels, log = OneDevice(toy), Logged()
    program = module_program(modes)
    stream = ResidualStream(torch.ones(1, 1, D, dtype=torch.float64))
    for op in program:
        log.current = op.k
        stream.run(op, kernels, log)
    log.current = -1
    stream.resolve()
    issued = [k for what, k in log.events if what == "start"]
    assert issued == [op.k for op in program if op.allreduce]
    for op in program:
        if not op.allreduce:
            continue
        waited_at = log.events.index(("wait", op.k))
        after = [k for what, k in log.events[waited_at + 1 :] if what == "start"]
        nxt = next((o.k for o in program[op.k :] if o.allreduce), None)  # the next all-reduce after module k
        if op.overlaps_next:  # waited on after the next module's all-reduce is issued, and before the one after
            assert ("start", nxt) in log.events[:waited_at] and (not after or after[0] > nxt)
        elif nxt is not None:  # waited on before anything newer is issued
            assert after and after[0] == nxt


def test_out_of_order_reads_are_refused():
    program = module_program((LADDER, LADDER))
    kernels = OneDevice(Toy(2))
    stream = ResidualStream(torch.ones(1, 1, D, dtype=torch.float64))
    stream.run(program[0], kernels)
    with pytest.raises(ProgramError):
        stream.run(program[3], kernels)  # reads r_2, which does not exist yet
    spd = module_program((SPD,))
    with pytest.raises(ProgramError):
        ResidualStream(torch.ones(1, 1, D, dtype=torch.float64)).run(spd[1], kernels)  # SPD MLP without its attention
