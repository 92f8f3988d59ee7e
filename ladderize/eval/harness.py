"""Evaluate a model with lm-eval: lm-eval's own ``HFLM`` wraps our model instance, unchanged.

``LadderLlamaForCausalLM`` is a real ``PreTrainedModel`` returning ``CausalLMOutputWithPast``,
so ``HFLM(pretrained=model)`` drives it exactly as it drives any transformers model; the
tasks come from lm-eval's registry plus the local task folder of ``local_tasks``.

Placement, the lm-eval way: the checkpoint is loaded once by ``checkpoint/io.load_model`` on
the device of ``checkpoint/placement`` (``--device auto``: the accelerator when there is one) in
``placement.eval_dtype`` (``auto``: the checkpoint's own dtype, as lm-eval's ``dtype=auto``), and
HFLM is handed that model with its device, dtype and batch size (an int, ``auto`` or ``auto:N``,
as lm-eval's ``--batch_size``). Under ``accelerate launch``/``torchrun`` with several processes,
each process loads the model on its own device and HFLM takes lm-eval's data-parallel mode
(``join_data_parallel``): rank r scores documents r, r + W, ... and lm-eval gathers the
metrics on rank 0, which alone returns the results.

``evaluate_checkpoint`` runs the engine ``backends.EngineChoice`` names: HFLM as above, HFLM with a device map over
the node's GPUs (``parallelize``), or lm-eval's own ``VLLM`` with ladderize's vLLM plugin (``tensor_parallel_size``
ranks); ``evaluate_lm`` runs the same task plan on any of them, so their results compare directly.

The eval record (``evaluate_checkpoint``, a ``ladderize.records.EvalRecord`` as JSON) keeps lm-eval's
results dict unchanged under ``"results"`` and adds the model's layout, for ``ladderize report``.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from importlib.metadata import version as package_version
from pathlib import Path
from typing import Any

from ..errors import LadderizeError, one_line
from ..checkpoint.placement import this_launch
from .backends import EngineChoice
from .local_tasks import (DEFAULT_CHUNK_CHARS, LOCAL_TASKS, build_tasks, check_task_names, check_tasks, parse_task_list,
                          resolve_data_dir, where_data_goes)

log = logging.getLogger(__name__)

DEFAULT_BOOTSTRAP_ITERS = 1000  # lm-eval's CLI uses 100000; only standard errors depend on it


def parse_batch_size(value: int | str) -> int | str:
    """lm-eval's batch size: a positive int, ``auto`` or ``auto:N`` (re-detect N times); one line of error otherwise."""
    text = str(value).strip().lower()
    if text == "auto" or (text.startswith("auto:") and _positive_number(text[5:])):
        return text
    if text.isdigit() and int(text) >= 1:
        return int(text)
    raise LadderizeError(f"--batch-size must be a positive integer, auto or auto:N, got {value!r}")


def _positive_number(text: str) -> bool:
    try:
        return float(text) > 0
    except ValueError:
        return False


def join_data_parallel(lm) -> None:
    """Put an ``HFLM`` built around a model instance into lm-eval's data-parallel mode when several
    processes were launched (``WORLD_SIZE`` > 1): the rank, world size and Accelerator that HFLM
    sets itself when it loads a model under ``accelerate launch`` (it does not for an instance)."""
    if not this_launch().several:
        return
    from accelerate import Accelerator
    from accelerate.utils import InitProcessGroupKwargs

    accelerator = Accelerator(kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(weeks=52))],
                              cpu=lm.device.type == "cpu")  # as lm-eval's; gloo for a model on the CPU
    lm.accelerator = accelerator
    lm._rank, lm._world_size = accelerator.process_index, accelerator.num_processes


def load_tokenizer(path: Path | str):
    from ..checkpoint.io import load_tokenizer as load

    return load(path, "evaluation")


def evaluate_model(
    model,
    tokenizer,
    tasks: str | list[str],
    *,
    limit: int | float | None = None,
    batch_size: int | str = 8,
    data_dir: Path | str | None = None,
    max_length: int | None = None,
    bootstrap_iters: int = DEFAULT_BOOTSTRAP_ITERS,
    chunk_chars: int = DEFAULT_CHUNK_CHARS,
    seed: int = 1234,
    progress: Callable[[str, int, int, int], None] | None = None,
    log_samples: bool = False,
) -> dict[str, Any]:
    """Run lm-eval's ``simple_evaluate`` on ``model`` (any ``PreTrainedModel``); return lm-eval's output dict.

    ``log_samples`` keeps lm-eval's per-document records under ``output["samples"]`` (for paired comparisons).

    ``tasks`` are task specs (see ``local_tasks``). ``max_length`` caps HFLM's context (and
    so the rolling-perplexity window); by default HFLM reads it from the model config.
    The model runs in ``LeanHFLM`` (``lean_lm``): lm-eval's ``HFLM`` scoring each batch
    without keeping its full-vocabulary log-probs. ``progress(kind, done, total, tokens)``
    follows lm-eval's requests of each kind (``loglikelihood``: one per answer;
    ``loglikelihood_rolling``: one per window), with the tokens scored so far (under data
    parallelism: rank 0's share, on rank 0 only).

    The model stays where it is (its device and dtype are handed to HFLM). With several processes
    (module docstring) every rank calls this; rank 0 gets lm-eval's output, the others ``None``.
    """
    from .lean_lm import LeanHFLM

    parse_task_list(tasks)
    if limit is not None and limit <= 0:
        raise LadderizeError(f"--limit must be positive, got {limit}")
    batch_size = parse_batch_size(batch_size)
    lm = LeanHFLM(pretrained=model, tokenizer=tokenizer, backend="causal", batch_size=batch_size, max_length=max_length,
                  device=str(model.device), dtype=model.dtype, progress=progress)
    join_data_parallel(lm)
    return evaluate_lm(lm, tasks, limit=limit, data_dir=data_dir, bootstrap_iters=bootstrap_iters, chunk_chars=chunk_chars,
                       seed=seed, log_samples=log_samples)


def evaluate_lm(
    lm,
    tasks: str | list[str],
    *,
    limit: int | float | None = None,
    data_dir: Path | str | None = None,
    bootstrap_iters: int = DEFAULT_BOOTSTRAP_ITERS,
    chunk_chars: int = DEFAULT_CHUNK_CHARS,
    seed: int = 1234,
    log_samples: bool = False,
) -> dict[str, Any] | None:
    """Run lm-eval's ``simple_evaluate`` on an lm-eval model object (``HFLM``, ``VLLM``, ...) over the task specs;
    return lm-eval's output dict (``None`` on a data-parallel rank other than 0)."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    specs = parse_task_list(tasks)
    plan = build_tasks(specs, resolve_data_dir(data_dir), chunk_chars=chunk_chars)
    if lm.rank != 0 and hasattr(lm, "progress"):
        lm.progress = None
    with tempfile.TemporaryDirectory(prefix="ladderize-tasks-") as folder:
        include = plan.write(Path(folder))
        manager = TaskManager(include_path=str(include) if include else None)
        check_task_names(plan, manager.all_tasks)
        loaded = _load_tasks(manager, plan.names)
        with bootstrap_in_process(), quiet_git_probe(), quiet_prints():
            output = simple_evaluate(
                model=lm,
                tasks=loaded,
                task_manager=manager,
                limit=limit,
                bootstrap_iters=bootstrap_iters,
                log_samples=log_samples,
                random_seed=seed,
                numpy_random_seed=seed,
                torch_random_seed=seed,
                fewshot_random_seed=seed,
            )
    if output is None:
        if lm.rank != 0:
            return None
        raise LadderizeError("lm-eval returned no results")
    output["ladderize_sources"] = plan.sources
    return output


@contextmanager
def quiet_git_probe() -> Iterator[None]:
    """lm-eval records ``git describe --always`` of the working directory; outside a git checkout git prints
    ``fatal: not a git repository`` on stderr at every evaluation. The same value, with git's stderr dropped."""
    import subprocess

    import lm_eval.evaluator as evaluator
    from lm_eval.loggers.utils import get_commit_from_path

    def git_commit_hash() -> str | None:
        try:
            return subprocess.check_output(["git", "describe", "--always"], stderr=subprocess.DEVNULL).strip().decode()
        except (subprocess.CalledProcessError, OSError):
            return get_commit_from_path(os.getcwd())

    original = evaluator.get_git_commit_hash
    evaluator.get_git_commit_hash = git_commit_hash
    try:
        yield
    finally:
        evaluator.get_git_commit_hash = original


@contextmanager
def quiet_prints() -> Iterator[None]:
    """lm-eval's own ``print`` lines (``bootstrapping for stddev: ...``) kept off stdout while its loggers are quiet
    (``cli.options.quiet_libraries``, the default; ``--verbose`` shows them)."""
    import contextlib
    import io
    import logging

    if logging.getLogger("lm_eval").getEffectiveLevel() < logging.ERROR:
        yield
        return
    with contextlib.redirect_stdout(io.StringIO()):
        yield


@contextmanager
def bootstrap_in_process() -> Iterator[None]:
    """lm-eval's bootstrapped standard errors computed in this process, not in a forked ``Pool``.

    The pool forks the whole evaluating process (model, torch's threads), and a fork of a
    threaded process can hang: once in CI a worker stayed blocked on the pool's queue lock
    while ``Pool.terminate()`` waited for it. lm-eval's single-process path (its
    ``DISABLE_MULTIPROC``) draws the same replicates (``random.Random(i)`` per chunk of 1000),
    so the standard errors are identical. ``DISABLE_MULTIPROC`` set by the user is kept.
    """
    if "DISABLE_MULTIPROC" in os.environ:
        yield
        return
    os.environ["DISABLE_MULTIPROC"] = "1"
    try:
        yield
    finally:
        os.environ.pop("DISABLE_MULTIPROC", None)


def _load_tasks(manager, names: list[str]) -> list:
    """Build the task objects now, so that a task whose data is unreachable fails with one line."""
    objects: list = []
    for name in names:
        try:
            loaded = manager.load([name])
        except Exception as exc:
            hint = (where_data_goes(str(LOCAL_TASKS[name])) if name in LOCAL_TASKS
                    else "offline? local tasks read --data-dir; see 'ladderize eval --help'")
            raise LadderizeError(f"cannot load the data of task {name!r}: {one_line(exc)} ({hint})") from None
        if name in loaded["groups"]:
            objects.append(loaded["groups"][name])
        else:
            objects.extend(loaded["tasks"].values())
    return objects


def evaluate_checkpoint(
    ckpt: Path | str,
    tasks: str | list[str],
    *,
    limit: int | float | None = None,
    batch_size: int | str = 8,
    data_dir: Path | str | None = None,
    max_length: int | None = None,
    dtype: str | None = None,
    bootstrap_iters: int = DEFAULT_BOOTSTRAP_ITERS,
    chunk_chars: int = DEFAULT_CHUNK_CHARS,
    progress: Callable[[str, int, int, int], None] | None = None,
    device: str = "auto",
    engine: EngineChoice = EngineChoice(),
    seed: int = 1234,
) -> dict[str, Any] | None:
    """Evaluate a checkpoint with lm-eval on the engine ``engine`` says (``backends``) and return the eval record's
    JSON (module docstring).

    ``hf``: the checkpoint is loaded on ``device`` in ``dtype`` (``placement``: ``auto`` is the accelerator, and the
    checkpoint's own dtype) and handed to HFLM, or HFLM loads it over this node's GPUs (``parallelize``). ``vllm``:
    lm-eval's ``VLLM`` loads the folder with ``tensor_parallel_size`` ranks. Under several processes (``hf``) every
    rank evaluates its share; rank 0 returns the record, the others ``None``.
    """
    from ..checkpoint.io import read_provenance
    from ..model import Layout
    from ..checkpoint.placement import dtype_name
    from ..records import EvalRecord

    ckpt = Path(ckpt).expanduser().absolute()
    if not ckpt.is_dir():
        raise LadderizeError(f"{ckpt} is not a model checkpoint directory")
    specs = parse_task_list(tasks)
    batch_size = parse_batch_size(batch_size)
    if limit is not None and limit <= 0:
        raise LadderizeError(f"--limit must be positive, got {limit}")
    check_tasks(specs, data_dir, chunk_chars=chunk_chars)  # bad task input fails before loading
    lm, config, where = _build_lm(ckpt, engine, batch_size=batch_size, max_length=max_length, dtype=dtype,
                                  device=device, progress=progress, seed=seed)
    started = time.perf_counter()
    output = evaluate_lm(lm, specs, limit=limit, data_dir=data_dir, bootstrap_iters=bootstrap_iters,
                         chunk_chars=chunk_chars, seed=seed)
    if output is None:  # a rank other than 0 under data parallelism
        return None
    layout = Layout.from_config(config)
    provenance = read_provenance(ckpt)
    allreduces = layout.allreduces_per_token()
    return EvalRecord(
        checkpoint=str(ckpt),
        layout=layout.describe(),
        layout_ranges={**layout.ranges(), "spd_tp_size": layout.spd_tp_size},
        num_layers=layout.num_layers,
        layers_converted=len(layout.converted_layers),
        allreduces_per_decode_step=allreduces["total"],
        overlappable_allreduces_per_decode_step=allreduces["overlappable"],
        history=[step.get("step") for step in provenance.get("history", []) if isinstance(step, dict)],
        tasks=specs,
        limit=limit,
        batch_size=batch_size,
        max_length=max_length,
        device=where["device"],
        dtype=dtype_name(where["dtype"]),
        processes=where["processes"],
        backend=engine.backend,
        tensor_parallel_size=engine.tensor_parallel_size,
        parallelize=engine.parallelize,
        data=output.get("ladderize_sources", {}),
        eval_s=round(time.perf_counter() - started, 3),
        ladderize_version=_version("ladderize"),
        lm_eval={
            "version": _version("lm_eval"),
            "versions": output.get("versions", {}),
            "n-shot": output.get("n-shot", {}),
            "n-samples": output.get("n-samples", {}),
            "higher_is_better": output.get("higher_is_better", {}),
            "bootstrap_iters": bootstrap_iters,
            **({"vllm": _version("vllm")} if engine.backend == "vllm" else {}),
        },
        results=output["results"],
    ).to_json()


def _build_lm(ckpt: Path, engine: EngineChoice, *, batch_size: int | str, max_length: int | None, dtype: str | None,
              device: str, progress: Callable[[str, int, int, int], None] | None,
              seed: int) -> tuple[Any, Any, dict[str, Any]]:
    """The lm-eval model object for ``engine``, the checkpoint's config, and where it runs (device, dtype, processes)."""
    if engine.backend == "vllm":
        from .backends import build_vllm_lm, vllm_device, vllm_dtype

        lm = build_vllm_lm(ckpt, engine, dtype=dtype, batch_size=batch_size, max_length=max_length, seed=seed)
        where = {"device": vllm_device(), "dtype": vllm_dtype(lm, lm._config), "processes": engine.data_parallel_size}
        return lm, lm._config, where
    from .lean_lm import LeanHFLM

    if engine.parallelize:
        lm = LeanHFLM(pretrained=str(ckpt), backend="causal", batch_size=batch_size, max_length=max_length,
                      device="cuda", dtype=dtype or "auto", parallelize=True, progress=progress)
        devices = sorted({str(d) for d in getattr(lm.model, "hf_device_map", {}).values()})
        where = {"device": f"device map over {', '.join(devices)}", "dtype": lm.model.dtype, "processes": 1}
        return lm, lm.model.config, where
    from ..checkpoint.io import load_model
    from ..checkpoint.placement import eval_dtype, resolve_device

    target = resolve_device(device)
    model = load_model(ckpt, dtype=eval_dtype(dtype), device=target)
    lm = LeanHFLM(pretrained=model, tokenizer=load_tokenizer(ckpt), backend="causal", batch_size=batch_size,
                  max_length=max_length, device=str(model.device), dtype=model.dtype, progress=progress)
    join_data_parallel(lm)
    return lm, model.config, {"device": str(target), "dtype": model.dtype, "processes": this_launch().world}


def headline_metrics(results: dict[str, Any]) -> list[tuple[str, str, float]]:
    """``(task, metric, value)`` for every numeric metric of lm-eval's results (standard errors left out)."""
    rows = []
    for task, metrics in results.items():
        for key, value in metrics.items():
            metric, _, _filter = key.partition(",")
            if metric.endswith("_stderr") or metric in ("alias", "sample_len") or not isinstance(value, (int, float)):
                continue
            rows.append((task, metric, float(value)))
    return rows


def _version(package: str) -> str:
    try:
        return package_version(package)
    except Exception:
        return "unknown"


