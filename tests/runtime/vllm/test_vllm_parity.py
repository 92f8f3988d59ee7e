"""vLLM (CPU build, .venv-vllm) serves ladderize checkpoints exactly: greedy tokens and log-probs equal ladderize's HF model.

Every case is one vLLM engine started by ``ladderize.runtime.vllm.check`` in a subprocess of the vLLM venv
(engine core in that process, ``VLLM_ENABLE_V1_MULTIPROCESSING=0``; at TP > 1 one worker process per rank);
the reference is ``LadderLlamaForCausalLM`` in this venv, on the same checkpoint. SPD checkpoints are
converted for the TP degree they are served at (SPD's function depends on it), so the TP=1 cases use
``spd_tp_size=1`` and the TP=2 cases ``spd_tp_size=2``; the hybrid has a non-identity SPD head order,
which the plugin must honour by permuting heads at load time.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from .serving_helpers import LAYOUTS, PROMPTS, hf_greedy, vllm_greedy, write_checkpoint

MAX_TOKENS = 6
# float32 on both sides; the all-reduce sums the ranks' partials in another order than the HF model's loop
LOGPROB_ATOL = 5e-5


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[tuple[str, int], Path]:
    """(layout name, SPD degree) -> checkpoint: one set of weights, four layouts, SPD converted for TP 1 and 2."""
    root = tmp_path_factory.mktemp("serve")
    paths = {}
    for spd_tp in (1, 2):
        for name in LAYOUTS:
            if name in ("dense", "ladder") and spd_tp == 2:
                paths[(name, 2)] = paths[(name, 1)]
                continue
            paths[(name, spd_tp)] = write_checkpoint(root / f"tp{spd_tp}", name, spd_tp_size=spd_tp)
    return paths


def assert_same(vllm_run: dict, reference: list[dict], what: str) -> None:
    assert "error" not in vllm_run, f"{what}: {vllm_run.get('error')}"
    for got, want in zip(vllm_run["results"], reference, strict=True):
        assert got["tokens"] == want["tokens"], f"{what}: greedy tokens differ"
        worst = max(abs(a - b) for a, b in zip(got["logprobs"], want["logprobs"], strict=True))
        assert worst <= LOGPROB_ATOL, f"{what}: log-probs differ by {worst:.2e}"
        assert all(math.isfinite(x) for x in got["logprobs"])


@pytest.mark.parametrize("tp", [1, 2])
def test_eager_equals_hf(vllm_venv, checkpoints, tp):
    # every layout at TP=1 (in the driver's process: cheap); at TP=2 (a worker process per rank and engine) all but
    # the all-ladder one, whose ladder-after-ladder flow with real all-reduces the hybrid's layers 4-5 cover
    names = list(LAYOUTS) if tp == 1 else [name for name in LAYOUTS if name != "ladder"]
    runs = [{"model": str(checkpoints[(name, tp)]), "tp": tp, "eager": True} for name in names]
    if tp == 1:  # an SPD checkpoint converted for another TP degree is refused with one line, as by ladderize's runtime
        runs.append({"model": str(checkpoints[("hybrid", 2)]), "tp": tp, "eager": True})
    results, log = vllm_greedy(runs, PROMPTS, MAX_TOKENS)
    for name, run in zip(names, results):
        assert_same(run, hf_greedy(checkpoints[(name, tp)], PROMPTS, MAX_TOKENS), f"{name} at TP={tp}")
    if tp == 1:
        refusal = results[-1]
        assert refusal.get("error", "").startswith("SPDDegreeError: ladderize: SPD layers 0:1,3:4 were converted for "
                                                   "TP=2; at tensor_parallel_size=1"), refusal
        assert "Serve with tensor_parallel_size=2" in refusal["error"]
    assert "run synchronously" in log  # the plugin says how it communicates


def test_compiled_path_equals_eager_or_is_off(vllm_venv, checkpoints):
    """Compiled runs (vLLM's default) must equal the HF model, or the plugin must not compile them.

    The dense layout compiles and must match. Layouts with ladder layers are compiled only while
    ``COMPILED_LADDER_VALIDATED`` is set, and then they must match too (ladder at TP=1, the hybrid of
    all modes at TP=2), so the flag cannot be on while the compiled ladder flow is wrong. With the
    flag off, the plugin must say at start that ladder layers run eager, and the eager output must match.
    """
    cases = [("dense", 1), ("ladder", 1), ("hybrid", 2)]
    runs = [{"model": str(checkpoints[(name, tp)]), "tp": tp, "eager": False} for name, tp in cases]
    results, log = vllm_greedy(runs, PROMPTS, MAX_TOKENS)
    for (name, tp), run in zip(cases, results):
        assert "error" not in run, run
        if name == "dense":
            assert run["compiled"] is True, run
        elif not run["compiled"]:
            assert "ladder layers run eager" in log
        assert_same(run, hf_greedy(checkpoints[(name, tp)], PROMPTS, MAX_TOKENS),
                    f"{name} at TP={tp} ({'compiled' if run['compiled'] else 'eager fallback'})")
    # every rank of every compiled model said so at start
    assert log.count("torch.compile on") == sum(tp for (_, tp), run in zip(cases, results) if run["compiled"])


SMOLLM2_PROMPTS = [[1, 4093, 28, 2683, 314, 260, 2009, 282, 4649, 30], [1, 504, 3458, 314]]
# 30 float32 layers, three ranks' partial sums per all-reduce
SMOLLM2_LOGPROB_ATOL = 2e-4


@pytest.mark.slow
def test_smollm2_tp3_equals_hf(vllm_venv, smollm2_dir, tmp_path, capsys, monkeypatch):
    """The real SmolLM2-135M, converted by ``ladderize convert`` to a hybrid of all three modes, decoded at TP=3
    (dense, ladder and the hybrid at TP 3 give HFLM's log-likelihoods in ``test_vllm_eval.py``)."""
    from tests.cli_helpers import run_cli

    layouts = {"hybrid": ["--ladder", "15:30", "--spd", "0:3", "--spd-tp", "3"]}
    paths = {}
    for name, flags in layouts.items():
        paths[name] = tmp_path / name
        code, _, err = run_cli(["convert", smollm2_dir, paths[name], *flags], capsys, monkeypatch)
        assert code == 0, err
    runs = [{"model": str(paths[name]), "tp": 3, "eager": True, "max_model_len": 64} for name in layouts]
    results, _ = vllm_greedy(runs, SMOLLM2_PROMPTS, MAX_TOKENS)
    for name, run in zip(layouts, results):
        assert "error" not in run, f"{name}: {run.get('error')}"
        want = hf_greedy(paths[name], SMOLLM2_PROMPTS, MAX_TOKENS)
        for got, ref in zip(run["results"], want, strict=True):
            assert got["tokens"] == ref["tokens"], f"SmolLM2 {name} at TP=3: greedy tokens differ"
            worst = max(abs(a - b) for a, b in zip(got["logprobs"], ref["logprobs"], strict=True))
            assert worst <= SMOLLM2_LOGPROB_ATOL, f"SmolLM2 {name} at TP=3: log-probs differ by {worst:.2e}"
