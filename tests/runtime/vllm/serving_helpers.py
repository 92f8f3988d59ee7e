"""Synthetic checkpoints, ladderize's HF reference and the vLLM driver for the serving tests."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from ladderize.model import LadderLlamaConfig, LadderLlamaForCausalLM

REPO = Path(__file__).resolve().parents[3]
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"

# vLLM's CPU attention wants a head size it has kernels for (32); 4 query heads over 2 KV heads split for TP 1 and 2.
SERVE_SHAPE = dict(
    vocab_size=256,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=6,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    initializer_range=0.08,  # peaked next-token distributions: no near-ties for greedy decoding to flip on
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)

# One set of weights, four layouts of it (6 layers). The hybrid has every mode and every transition:
# SPD -> dense -> ladder, SPD directly before ladder, and a non-identity SPD head order.
LAYOUTS = {
    "dense": dict(layer_modes=["dense"] * 6),
    "ladder": dict(layer_modes=["ladder"] * 6),
    "spd": dict(layer_modes=["spd"] * 6, spd_tp_size=2),
    "hybrid": dict(
        layer_modes=["spd", "dense", "ladder", "spd", "ladder", "ladder"],
        spd_tp_size=2,
        spd_head_order=[[1, 0], None, None, [1, 0], None, None],
    ),
}
PROMPTS = [[5, 17, 99, 3, 42, 7, 200, 11], [1, 250, 64, 64, 9]]


def write_checkpoint(root: Path, name: str, seed: int = 0, **overrides) -> Path:
    """A random ladderize checkpoint of SERVE_SHAPE with the layout ``LAYOUTS[name]`` (same weights for every name)."""
    config = LadderLlamaConfig(**{**SERVE_SHAPE, **LAYOUTS[name], **overrides})
    torch.manual_seed(seed)
    model = LadderLlamaForCausalLM(config).eval()
    with torch.no_grad():
        for pname, param in model.named_parameters():
            if "norm" in pname:
                param.uniform_(0.5, 1.5)
    out = root / name
    model.save_pretrained(out)
    return out


def hf_greedy(path: Path, prompts: list[list[int]], max_tokens: int) -> list[dict]:
    """ladderize's HF model: greedy tokens and the log-prob of each chosen token, at SPD's own TP degree."""
    model = LadderLlamaForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    results = []
    with torch.no_grad():
        for prompt in prompts:
            ids = torch.tensor([prompt])
            out = model.generate(ids, max_new_tokens=max_tokens, do_sample=False, min_new_tokens=max_tokens,
                                 output_logits=True, return_dict_in_generate=True, pad_token_id=0, eos_token_id=None)
            tokens = out.sequences[0, len(prompt):].tolist()
            logprobs = [torch.log_softmax(step[0].double(), -1)[t].item() for step, t in zip(out.logits, tokens)]
            results.append({"tokens": tokens, "logprobs": logprobs})
    return results


SHM = Path("/dev/shm")


@contextlib.contextmanager
def removing_new_shm(marker: str = "cpushm"):
    """Remove the shared-memory files with ``marker`` in their name that appeared in ``/dev/shm`` meanwhile: vLLM's CPU
    all-reduce (``vllm_dist_*-cpushm*``, 4 MB a rank) never unlinks its segments, and 18 were left per suite run."""
    before = set(os.listdir(SHM)) if SHM.is_dir() else set()
    try:
        yield
    finally:
        if SHM.is_dir():
            for name in set(os.listdir(SHM)) - before:
                if marker in name:
                    (SHM / name).unlink(missing_ok=True)


def vllm_env(extra: dict | None = None) -> dict:
    """The vLLM subprocess's environment: no venv leakage, vLLM's own log level, one OpenMP thread per rank, a private compile cache, and the
    engine in the driver's own process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: at TP=1 no process is started, at TP > 1
    only the ranks' workers; each started process pays vLLM's ~15 s import, most of these tests' time).

    vLLM keys its compile cache on the model path, not its contents; a fresh cache per run keeps a
    reused temporary path from loading a graph compiled for another layout.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env.pop("VLLM_LOGGING_LEVEL", None)  # vLLM's own level: the tests read the plugin's INFO lines
    env["VLLM_CACHE_ROOT"] = tempfile.mkdtemp(prefix="ladderize-vllm-cache-")
    env.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", VLLM_CPU_KVCACHE_SPACE="1",
               VLLM_ENABLE_V1_MULTIPROCESSING="0", OMP_NUM_THREADS="1",
               VLLM_CPU_OMP_THREADS_BIND="nobind")  # correctness runs: let the OS place ranks on a shared machine
    env.update(extra or {})
    return env


def vllm_greedy(runs: list[dict], prompts: list[list[int]], max_tokens: int, timeout: int = 900,
                env: dict | None = None) -> tuple[list[dict], str]:
    """Run ladderize.runtime.vllm.check in .venv-vllm; return its runs and the captured log."""
    payload = json.dumps({"runs": runs, "prompts": prompts, "max_tokens": max_tokens})
    environment = vllm_env(env)
    try:
        with removing_new_shm():
            done = subprocess.run([str(VLLM_PYTHON), "-m", "ladderize.runtime.vllm.check", payload], cwd=REPO, env=environment,
                                  capture_output=True, text=True, timeout=timeout)
    finally:
        shutil.rmtree(environment["VLLM_CACHE_ROOT"], ignore_errors=True)  # the private compile cache (was left in /tmp)
    log = done.stdout + done.stderr
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])["runs"], log
    raise AssertionError(f"the vLLM driver printed no result (exit {done.returncode}):\n{log[-4000:]}")


# Runs each argv list through ladderize's real CLI entry point in one process (vLLM's import is paid once); prints
# ``EXIT <code>`` after each. Executed under a module name other than ``__main__``, so ``main`` treats itself as called.
CLI_DRIVER = """
import json, sys
from ladderize.cli import main
for args in json.loads(sys.argv[1]):
    sys.argv = ["ladderize", *args]
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    print(f"EXIT {code}", flush=True)
"""


def start_vllm_cli(commands: list[list[str]], env: dict | None = None) -> tuple[subprocess.Popen, dict]:
    """Start ``ladderize`` commands (argv lists) in .venv-vllm, one process for all (``CLI_DRIVER``); returns the
    process and its environment (``vllm_env``), for ``finish_vllm_cli``."""
    environment = vllm_env(env)
    code = f"exec(compile({CLI_DRIVER!r}, 'cli_driver', 'exec'), {{'__name__': 'cli_driver'}})"
    process = subprocess.Popen([str(VLLM_PYTHON), "-c", code, json.dumps([list(map(str, c)) for c in commands])],
                               cwd=REPO, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return process, environment


def finish_vllm_cli(process: subprocess.Popen, environment: dict, timeout: int = 900) -> tuple[list[int], str]:
    """Wait for ``start_vllm_cli``'s process; return each command's exit code and the whole log."""
    try:
        log, _ = process.communicate(timeout=timeout)
    finally:
        process.kill()
        shutil.rmtree(environment["VLLM_CACHE_ROOT"], ignore_errors=True)
    codes = [int(line.split()[1]) for line in log.splitlines() if line.startswith("EXIT ")]
    return codes, log
