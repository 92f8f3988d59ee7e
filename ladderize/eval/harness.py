"""Evaluate a model with lm-eval: lm-eval's own ``HFLM`` wraps our model instance, unchanged.

``LadderLlamaForCausalLM`` is a real ``PreTrainedModel`` returning ``CausalLMOutputWithPast``,
so ``HFLM(pretrained=model)`` drives it exactly as it drives any transformers model; the
tasks come from lm-eval's registry plus the local task folder of ``local_tasks``.
The eval record (``evaluate_checkpoint``, a ``ladderize.records.EvalRecord`` as JSON) keeps lm-eval's
results dict unchanged under ``"results"`` and adds the model's layout, for ``ladderize report``.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib.metadata import version as package_version
from pathlib import Path
from typing import Any

from ..errors import LadderizeError, one_line
from .local_tasks import DEFAULT_CHUNK_CHARS, check_task_names, parse_task_list, plan_tasks, resolve_data_dir

log = logging.getLogger(__name__)

DEFAULT_BOOTSTRAP_ITERS = 1000  # lm-eval's CLI uses 100000; only standard errors depend on it


def load_tokenizer(path: Path | str):
    from ..model.checkpoint import load_tokenizer as load

    return load(path, "evaluation")


def evaluate_model(
    model,
    tokenizer,
    tasks: str | list[str],
    *,
    limit: int | float | None = None,
    batch_size: int = 8,
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
    ``loglikelihood_rolling``: one per window), with the tokens scored so far.
    """
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    from .lean_lm import LeanHFLM

    specs = parse_task_list(tasks)
    if limit is not None and limit <= 0:
        raise LadderizeError(f"--limit must be positive, got {limit}")
    if batch_size < 1:
        raise LadderizeError(f"--batch-size must be at least 1, got {batch_size}")
    plan = plan_tasks(specs, resolve_data_dir(data_dir), chunk_chars=chunk_chars)
    with tempfile.TemporaryDirectory(prefix="ladderize-tasks-") as folder:
        include = plan.write(Path(folder))
        manager = TaskManager(include_path=str(include) if include else None)
        check_task_names(plan, manager.all_tasks)
        loaded = _load_tasks(manager, plan.names)
        lm = LeanHFLM(pretrained=model, tokenizer=tokenizer, backend="causal", batch_size=batch_size, max_length=max_length,
                      progress=progress)
        with bootstrap_in_process(), quiet_git_probe():
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
            raise LadderizeError(
                f"cannot load the data of task {name!r}: {one_line(exc)} "
                f"(offline? local tasks read --data-dir; see 'ladderize eval --help')"
            ) from None
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
    batch_size: int = 8,
    data_dir: Path | str | None = None,
    max_length: int | None = None,
    dtype: str | None = None,
    bootstrap_iters: int = DEFAULT_BOOTSTRAP_ITERS,
    chunk_chars: int = DEFAULT_CHUNK_CHARS,
    progress: Callable[[str, int, int, int], None] | None = None,
    device: str = "cpu",
) -> dict[str, Any]:
    """Load a checkpoint, evaluate it with lm-eval, and return the eval record's JSON (see module docstring)."""
    from ..model.checkpoint import load_model, read_provenance
    from ..model import Layout
    from ..records import EvalRecord

    ckpt = Path(ckpt).expanduser().absolute()
    if not ckpt.is_dir():
        raise LadderizeError(f"{ckpt} is not a model checkpoint directory")
    specs = parse_task_list(tasks)
    plan_tasks(specs, resolve_data_dir(data_dir), chunk_chars=chunk_chars)  # bad task input fails before loading
    from ..model.placement import check_device

    check_device(device)  # TODO(eval): lm-eval runs on the CPU model; load on device once its batches follow it
    model = load_model(ckpt, dtype=dtype)
    tokenizer = load_tokenizer(ckpt)
    started = time.perf_counter()
    output = evaluate_model(
        model, tokenizer, specs, limit=limit, batch_size=batch_size, data_dir=data_dir,
        max_length=max_length, bootstrap_iters=bootstrap_iters, chunk_chars=chunk_chars, progress=progress,
    )  # fmt: skip
    layout = Layout.from_config(model.config)
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
        },
        results=output["results"],
    ).to_json()


def write_json(record: dict[str, Any], path: Path | str) -> Path:
    """Write a JSON record atomically (as lm-eval does, a NaN metric is written as NaN)."""
    from ..model.atomic import write_file_atomic

    return write_file_atomic(Path(path).expanduser().absolute(), json.dumps(record, indent=2, default=str) + "\n")


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


