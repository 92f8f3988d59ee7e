"""Greedy tokens and log-probs of checkpoints under vLLM, as JSON (run inside the vLLM venv).

    python -m ladderize.runtime.vllm.check '{"runs": [{"model": DIR, "tp": 2, "eager": true}], "prompts": [[1, 2, 3]],
                                        "max_tokens": 8}'

Prints one ``RESULT {json}`` line: per run, the greedy token ids and the log-prob of each chosen
token per prompt, whether vLLM compiled the model, the ladderize layout, and the seconds the
engine took to start and to generate. Runs share one process (the imports are paid once); each
run gets its own engine, shut down before the next. A TP=1 run asks for vLLM's single-process
executor; vLLM's CPU build still starts an engine and a worker process for it unless
``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (the tests set it: each started process pays vLLM's import).
A run that fails reports its error's last line instead of stopping the others. The tests
(tests/runtime/vllm/) and benchmarks/bench_vllm_layouts.py drive this script; it is also a quick way
to check a converted checkpoint by hand.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time


def cpu_threads_bind(tp: int) -> str:
    """One core per rank, round-robin over this process's cores (vLLM's CPU backend wants it set for TP > 1)."""
    cores = sorted(os.sched_getaffinity(0))
    return "|".join(str(cores[r % len(cores)]) for r in range(tp))


def run_one(spec: dict, prompts: list[list[int]], max_tokens: int) -> dict:
    from vllm import LLM, SamplingParams

    tp = int(spec.get("tp", 1))
    start = time.perf_counter()
    llm = LLM(
        model=spec["model"], tensor_parallel_size=tp, dtype=spec.get("dtype", "float32"), skip_tokenizer_init=True,
        enforce_eager=bool(spec.get("eager", True)), max_model_len=int(spec.get("max_model_len", 256)),
        max_num_seqs=max(len(prompts), 1), seed=0, disable_log_stats=True,
        distributed_executor_backend="mp" if tp > 1 else "uni", **spec.get("engine_args", {}),
    )
    try:
        ready = time.perf_counter()
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, detokenize=False, logprobs=0)
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        done = time.perf_counter()
        results = []
        for out in outputs:
            sample = out.outputs[0]
            ids = list(sample.token_ids)
            results.append({"tokens": ids, "logprobs": [step[t].logprob for t, step in zip(ids, sample.logprobs)]})
        model_config = llm.llm_engine.vllm_config.compilation_config
        timing = _decode_timing(llm, prompts, spec["timing"]) if spec.get("timing") else None
        return {
            "model": spec["model"], "tp": tp, "eager": bool(spec.get("eager", True)),
            "compiled": _compiled(llm), "compilation_mode": str(model_config.mode),
            "results": results, "startup_s": ready - start, "generate_s": done - ready,
            **({"timing": timing} if timing else {}),
        }
    finally:
        del llm
        gc.collect()


def _decode_timing(llm, prompts: list[list[int]], cfg: dict) -> dict:
    """Decode seconds per token by difference (``runtime/timing.py``: G tokens against 1, medians over repeats)."""
    from vllm import SamplingParams

    from ..timing import time_decode

    def run(n: int) -> float:
        params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, detokenize=False)
        start = time.perf_counter()
        llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        return time.perf_counter() - start

    timing = time_decode({"vllm": run}, int(cfg.get("gen", 64)), int(cfg.get("warmup", 1)), int(cfg.get("repeats", 3)))
    return {k: v for k, v in timing["vllm"].items() if k != "tokens"}


def _compiled(llm) -> bool:
    """Whether vLLM compiles the ladderize model: compilation on, and the plugin's ``enable_if`` agrees."""
    from vllm.config import CompilationMode

    from ladderize.runtime.vllm.model import compile_allowed

    config = llm.llm_engine.vllm_config
    return config.compilation_config.mode != CompilationMode.NONE and compile_allowed(config)


def main(argv: list[str]) -> int:
    args = json.loads(argv[1] if len(argv) > 1 else sys.stdin.read())
    # vLLM's CPU backend wants a thread binding for TP > 1: keep one from the environment ("nobind" lets the
    # OS place the ranks, best on a shared machine), else bind one core per rank for each run
    bind_from_env = "VLLM_CPU_OMP_THREADS_BIND" in os.environ
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    runs = []
    for spec in args["runs"]:
        if not bind_from_env:
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = cpu_threads_bind(int(spec.get("tp", 1)))
        try:
            runs.append(run_one(spec, args["prompts"], int(args.get("max_tokens", 8))))
        except Exception as exc:  # noqa: BLE001 - reported per run, as one line
            message = str(exc).strip().splitlines()
            runs.append({"model": spec["model"], "tp": spec.get("tp", 1), "error": f"{type(exc).__name__}: {message[-1] if message else ''}"})
    print("RESULT " + json.dumps({"runs": runs}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
