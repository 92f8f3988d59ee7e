"""``ladderize eval --backend vllm`` (lm-eval's VLLM with ladderize's plugin, vLLM's CPU build) gives HFLM's metrics.

The real SmolLM2-135M, converted by ``ladderize convert`` to dense, ladder 15:30 and a hybrid of all three modes
(SPD 0:3 for TP 3, dense 3:15, ladder 15:30). The vLLM side is the real CLI in .venv-vllm, every command in one process
(vLLM's import paid once; engine core in that process, a worker per rank at TP 3); the reference is the CLI's HFLM
path in this venv, on the same checkpoints, tasks, limit and context length, both in float32.

Cases: dense and ladder at TP 1 and 3, the hybrid at TP 3 (its ranks all-reduce dense, ladder and SPD layers alike),
and the hybrid at TP 1, refused in one line before vLLM starts (SPD layers converted for TP 3).

Tasks: LAMBADA (loglikelihood: ``acc`` and ``perplexity``, 8 documents) and a rolling perplexity over one 3,000-character
document of WikiText-2 at ``--max-length 512`` (two windows). eval starts vLLM's engine with two positions more than
``--max-length`` (the two lm-eval's VLLM keeps free), so both backends cut the same contexts and windows and every metric
is the same number up to float32 summation order: ``acc`` exactly, the perplexities to ``RTOL`` (far inside the 0.5%
required of perplexity tasks). Worst measured: LAMBADA perplexity 3.9e-6 relative (dense, TP 3), rolling perplexity
1.4e-6 (ladder and hybrid, TP 3). Time: about 4 minutes on a 2-core machine with another job beside it (vLLM imported
in the driver and in each TP 3 rank's worker).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .serving_helpers import finish_vllm_cli, removing_new_shm, start_vllm_cli

RTOL = 1e-4  # every perplexity: the same sums in float32, in another kernel order (measured: at most 2.8e-6)
LIMIT = "8"
MAX_LENGTH = "512"
BUNDLED = Path(__file__).resolve().parents[2] / "data"

CASES = [("dense", 1), ("ladder", 1), ("dense", 3), ("ladder", 3), ("hybrid", 3)]
LAYOUTS = {"dense": ["--layout", "dense"], "ladder": ["--ladder", "15:30"],
           "hybrid": ["--ladder", "15:30", "--spd", "0:3", "--spd-tp", "3"]}


def relative(a: float, b: float) -> float:
    return abs(a - b) / max(abs(a), abs(b), 1e-12)


@pytest.mark.slow
def test_vllm_eval_equals_hflm(vllm_venv, smollm2_dir, tmp_path, capsys, monkeypatch):
    from tests.cli_helpers import run_cli

    text = tmp_path / "wiki.txt"
    text.write_text((BUNDLED / "wikitext-2" / "valid.txt").read_text(encoding="utf-8")[:3000], encoding="utf-8")
    tasks = f"lambada_openai,ppl:{text}"
    common = ["--tasks", tasks, "--data-dir", BUNDLED, "--limit", LIMIT, "--max-length", MAX_LENGTH, "--dtype", "float32"]
    paths = {}
    for name, flags in LAYOUTS.items():
        paths[name] = tmp_path / name
        code, _, err = run_cli(["convert", smollm2_dir, paths[name], *flags], capsys, monkeypatch)
        assert code == 0, err
    commands = [["eval", paths[name], *common, "--backend", "vllm", "--tp", tp, "--eager", "--json", tmp_path / f"vllm-{name}-tp{tp}.json"]
                for name, tp in CASES]
    commands.append(["eval", paths["hybrid"], *common, "--backend", "vllm", "--tp", 1])  # refused before vLLM starts
    with removing_new_shm():
        process, environment = start_vllm_cli(commands)
        try:  # HFLM meanwhile, in this process
            for name in LAYOUTS:
                code, _, err = run_cli(["eval", paths[name], *common, "--json", tmp_path / f"hf-{name}.json"], capsys, monkeypatch)
                assert code == 0, err
        finally:
            codes, log = finish_vllm_cli(process, environment)
    assert codes == [0] * len(CASES) + [2], log[-6000:]
    refusal = [line for line in log.splitlines() if line.startswith("error:")]
    assert refusal == ["error: ladderize: SPD layers 0:3 were converted for TP=3; at tensor_parallel_size=1 each rank "
                       "would hold a different head group, which is a different model. Serve with "
                       "tensor_parallel_size=3 (--tp 3)"], log[-3000:]
    ppl_task = f"ppl_{text.stem}"
    for name, tp in CASES:
        hf = json.loads((tmp_path / f"hf-{name}.json").read_text())
        vllm = json.loads((tmp_path / f"vllm-{name}-tp{tp}.json").read_text())
        what = f"{name} at TP {tp}"
        assert (vllm["backend"], vllm["tensor_parallel_size"], vllm["layout"]) == ("vllm", tp, hf["layout"]), what
        assert vllm["lm_eval"]["n-samples"] == hf["lm_eval"]["n-samples"], what
        lambada_hf, lambada_vllm = hf["results"]["lambada_openai"], vllm["results"]["lambada_openai"]
        assert lambada_vllm["acc,none"] == lambada_hf["acc,none"], what
        worst = relative(lambada_vllm["perplexity,none"], lambada_hf["perplexity,none"])
        assert worst <= RTOL, f"{what}: LAMBADA perplexity differs by {worst:.2e} (relative)"
        rolling = 0.0
        for metric in ("word_perplexity,none", "byte_perplexity,none", "bits_per_byte,none"):
            got, want = vllm["results"][ppl_task][metric], hf["results"][ppl_task][metric]
            rolling = max(rolling, relative(got, want))
            assert relative(got, want) <= RTOL, f"{what}: {metric} {got} vs HFLM's {want}"
        print(f"{what}: LAMBADA perplexity {worst:.1e}, rolling perplexity {rolling:.1e} (relative to HFLM)")
