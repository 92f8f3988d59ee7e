"""Calibration text sampled from the dense teacher itself (data-free calibration, as in LLM-QAT).

``sample_text`` prompts a dense checkpoint with narrative-fiction openers (``stories``, built
in) or the lines of a file, samples a continuation of each, and writes ``{"text": prompt + " " +
continuation}`` records as JSONL, which ``adapt --data FILE.jsonl`` reads.

Records go to ``OUT.partial``, one batch at a time (flushed), and the file becomes ``OUT`` by a
rename once complete. Batch ``i`` samples with torch seeded from ``(seed, i)``, and the prompts
are a fixed sequence drawn from ``random.Random(seed)``, so a run resumed from ``OUT.partial``
writes the same bytes as an uninterrupted one. ``OUT.partial.json`` holds the run's settings
(a resume must match them) and the tokens and seconds of each written batch; ``OUT.json``
records the provenance of the finished file.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import LadderizeError

if TYPE_CHECKING:
    import torch

STORIES = "stories"
# Narrative openers: {a} and {b} are two characters, {p} a place.
STORY_OPENERS = (
    "{a} stood at the edge of {p} and waited until the last light had gone before calling for {b}.",
    "“You promised me you would never come back here,” {a} said, without turning to face {b}.",
    "Nobody in {p} remembered the winter {b} disappeared, nobody except {a}.",
    "{b} had rehearsed the apology all the way to {p}, but when {a} opened the door, the words were gone.",
    "The telegram arrived on a Tuesday, and by Thursday {a} and {b} were on a train to {p}.",
    "“Do you hear that?” {b} whispered. {a} lifted the lantern and peered into the dark of {p}.",
    "It was {a} who noticed first that the clocks in {p} had all stopped at the same minute.",
    "{b} kept the key in a matchbox for eleven years, and never told {a} which door it opened.",
    "The rain had not let up for three days when {a} finally found the courage to visit {b} at {p}.",
    "“If we leave tonight,” {a} said, folding the map, “we can reach {p} before anyone knows we are gone.”",
    "{a} had always believed that {p} was the safest place in the world, until the night {b} came home bleeding.",
    "The last thing {b} expected to find in {p} was a photograph of {a}, taken fifty years before either of them was born.",
    "For a long moment neither of them spoke; then {b} set down the cup and asked {a} the question that had kept them both awake.",
    "{a} counted the steps from the gate to the old well in {p}, exactly as {b} had described, and began to dig.",
    "“Tell me again how it happened,” said {b}, and {a}, staring out at {p}, started the story from the beginning.",
    "Everyone at {p} agreed that {a} was a liar, which is why nobody listened when {a} swore that {b} was still alive.",
)
STORY_NAMES = (
    "Eleanor", "Thomas", "Margaret", "Samuel", "Clara", "Jonah", "Isabel", "Arthur",
    "Rosa", "Daniel", "Helen", "Felix", "Agnes", "Walter", "Nora", "Elias",
)
STORY_PLACES = (
    "the lighthouse", "the harbour", "the old mill", "the orchard", "the station", "the abbey",
    "the marsh", "the boarding house", "the village square", "the frozen lake", "the mountain pass", "the library",
)


@dataclass(frozen=True)
class SampleSettings:
    """What determines the records: a resume must use the same settings."""

    source: str
    prompts: str
    prompts_sha256: str | None
    sequences: int
    new_tokens: int
    batch_size: int
    temperature: float
    top_p: float
    seed: int
    device: str = "cpu"  # the device type sampled on: CUDA's random streams differ from the CPU's
    dtype: str = "float32"  # the teacher's dtype (``auto``: the checkpoint's own, on CUDA)


@dataclass
class SampleResult:
    """A finished sample: where it is, how much was generated, and how long it took."""

    out: Path
    records: int
    tokens_generated: int
    seconds: float
    resumed_records: int


def partial_path(out: Path) -> Path:
    """``OUT.partial``: the records of an unfinished run."""
    return out.with_name(out.name + ".partial")


def story_prompts(count: int, seed: int) -> list[str]:
    """``count`` narrative openers with names and places from ``random.Random(seed)`` (each a prefix of the next count)."""
    rng = random.Random(seed)
    prompts = []
    for _ in range(count):
        template = rng.choice(STORY_OPENERS)
        a, b = rng.sample(STORY_NAMES, 2)
        prompts.append(template.format(a=a, b=b, p=rng.choice(STORY_PLACES)))
    return prompts


def file_prompts(path: Path, count: int) -> list[str]:
    """``count`` prompts from a file's non-empty lines, cycled."""
    try:
        lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except UnicodeDecodeError:
        raise LadderizeError(f"prompts file {path} is not UTF-8 text") from None
    if not lines:
        raise LadderizeError(f"prompts file {path} has no non-empty lines")
    return [lines[i % len(lines)] for i in range(count)]


def make_prompts(spec: str, count: int, seed: int) -> list[str]:
    """The prompts of ``--prompts``: ``stories`` (built in) or a file with one prompt per line."""
    if spec == STORIES:
        return story_prompts(count, seed)
    path = Path(spec).expanduser()
    if not path.is_file():
        raise LadderizeError(f"--prompts must be '{STORIES}' or a file with one prompt per line; {spec} is neither")
    return file_prompts(path, count)


def check_dense_source(source: str) -> Path:
    """The path of a dense checkpoint directory, or one line: missing, not a checkpoint, or converted."""
    from ..checkpoint.io import load_config

    path = Path(source).expanduser()
    config = load_config(path)  # one line for a missing path, a file, no config.json, an unknown architecture
    if config.layout.converted_layers:
        raise LadderizeError(
            f"{source} is a converted checkpoint (layout {config.layout.describe()}); sample from its dense source"
        )
    return path.absolute()


def check_output(out: Path, force: bool, resume: bool) -> None:
    """Refuse to replace ``out`` without ``force``, or to start over on an interrupted run without ``--resume``."""
    if out.exists() and not force:
        raise LadderizeError(f"output {out} already exists; pass --force to replace it")
    if out.exists() and out.is_dir():
        raise LadderizeError(f"output {out} is a directory; sample writes one JSONL file")
    partial = partial_path(out)
    if partial.exists() and not (resume or force):
        raise LadderizeError(f"{partial} holds an interrupted run; pass --resume to continue it or --force to start over")


def _settings_file(out: Path) -> Path:
    return out.with_name(out.name + ".partial.json")


def _resume_point(out: Path, settings: SampleSettings) -> list[dict[str, float]]:
    """The batches of ``OUT.partial`` to keep (their tokens and seconds); truncate the file after them."""
    partial, sidecar = partial_path(out), _settings_file(out)
    if not partial.exists():
        return []
    try:
        state = json.loads(sidecar.read_text())
    except (OSError, ValueError):
        raise LadderizeError(f"{sidecar} is missing or unreadable; pass --force to start over") from None
    for name, value in asdict(settings).items():
        if state.get("settings", {}).get(name) != value:
            flag = "SOURCE" if name == "source" else "--" + name.replace("_", "-").removesuffix("-sha256")
            raise LadderizeError(
                f"{partial} was written with {name} {state.get('settings', {}).get(name)!r}, not {value!r} ({flag}); "
                "pass the same settings, or --force to start over"
            )
    data = partial.read_bytes()
    complete = data.count(b"\n")  # a trailing line without its newline is incomplete
    batches = min(complete // settings.batch_size, len(state.get("batches", [])))
    keep = batches * settings.batch_size
    end = 0
    for _ in range(keep):
        end = data.index(b"\n", end) + 1
    with partial.open("r+b") as handle:
        handle.truncate(end)
    return state["batches"][:batches]


def _write_state(out: Path, settings: SampleSettings, batches: list[dict[str, float]]) -> None:
    from ..checkpoint.atomic import write_file_atomic

    write_file_atomic(_settings_file(out), json.dumps({"settings": asdict(settings), "batches": batches}, indent=1) + "\n")


def _generated_tokens(new_ids, eos_ids: set[int]) -> int:
    """Tokens sampled per row up to and including its first EOS, summed (the padding after it is not counted)."""
    total = 0
    for row in new_ids.tolist():
        stop = next((i for i, token in enumerate(row) if token in eos_ids), None)
        total += len(row) if stop is None else stop + 1
    return total


def sample_batch(model, tokenizer, prompts: list[str], settings: SampleSettings, index: int) -> tuple[list[str], int]:
    """Sample a continuation of each prompt (torch seeded from ``(seed, index)``); return the texts and tokens generated."""
    import torch

    batch = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
    eos = model.generation_config.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos_ids, default=0)
    devices = [model.device.index or 0] if model.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), torch.inference_mode():
        torch.manual_seed(settings.seed * 1_000_003 + index)
        output = model.generate(
            **batch, do_sample=True, temperature=settings.temperature, top_p=settings.top_p, top_k=0,
            max_new_tokens=settings.new_tokens, pad_token_id=pad,
        )
    new_ids = output[:, batch["input_ids"].shape[1]:]
    continuations = tokenizer.batch_decode(new_ids, skip_special_tokens=True)
    texts = [f"{prompt} {continuation.lstrip()}".rstrip() for prompt, continuation in zip(prompts, continuations)]
    return texts, _generated_tokens(new_ids, eos_ids)


def load_teacher_for_sampling(path: Path, device: torch.device, dtype: torch.dtype | None):
    """The dense model (through the one loader ``load_model``) on ``device`` in ``dtype`` (``None``: the checkpoint's
    own), both as ``sample_text`` resolved them, and its tokenizer, padding on the left."""
    from ..checkpoint.io import load_model, load_tokenizer

    tokenizer = load_tokenizer(path, "sample")
    tokenizer.padding_side = "left"
    return load_model(path, dtype=dtype, device=device), tokenizer


def sample_text(
    source: str,
    out: Path | str,
    *,
    prompts: str = STORIES,
    sequences: int = 200,
    new_tokens: int = 512,
    batch_size: int = 40,
    temperature: float = 1.0,
    top_p: float = 0.95,
    seed: int = 0,
    force: bool = False,
    resume: bool = False,
    progress: Callable[[int, int, int], None] | None = None,
    on_message: Callable[[str], None] | None = None,
    device: str = "auto",
    dtype: str | None = None,
) -> SampleResult:
    """Sample ``sequences`` records from the dense checkpoint ``source`` into the JSONL file ``out`` (see the module docstring).

    ``progress(records_done, sequences, tokens_generated)`` follows the progress.
    """
    from ..checkpoint.placement import dtype_name, inference_dtype, resolve_device

    target = resolve_device(device)  # the teacher samples there (one line of error for CUDA without one)
    torch_dtype = inference_dtype(dtype, target)
    for name, value in (("--sequences", sequences), ("--new-tokens", new_tokens), ("--batch-size", batch_size)):
        if value < 1:
            raise LadderizeError(f"{name} must be at least 1, got {value}")
    if temperature <= 0:
        raise LadderizeError(f"--temperature must be positive, got {temperature}")
    if not 0 < top_p <= 1:
        raise LadderizeError(f"--top-p must be in (0, 1], got {top_p}")
    out = Path(out).expanduser().absolute()
    check_output(out, force, resume)
    path = check_dense_source(source)
    texts = make_prompts(prompts, sequences, seed)
    if prompts != STORIES:  # a file: recorded by absolute path and content
        prompts_file = Path(prompts).expanduser().absolute()
        prompts, prompts_sha256 = str(prompts_file), hashlib.sha256(prompts_file.read_bytes()).hexdigest()
    else:
        prompts_sha256 = None
    settings = SampleSettings(str(path), prompts, prompts_sha256, sequences, new_tokens, batch_size, temperature, top_p, seed,
                              target.type, "auto" if torch_dtype is None else dtype_name(torch_dtype))
    partial = partial_path(out)
    if force and not resume:
        partial.unlink(missing_ok=True)
    batches = _resume_point(out, settings) if resume else []
    done = resumed = min(len(batches) * batch_size, sequences)
    if done and on_message:
        on_message(f"resuming {partial} at {done}/{sequences} records")
    if on_message:  # every check passed: say how much is coming (the defaults take hours on a CPU)
        cpu = " (on a CPU at a few tokens/s per sequence that takes hours: lower --sequences or --new-tokens)" if target.type == "cpu" else ""
        on_message(f"sampling up to {(sequences - done) * new_tokens:,} tokens ({sequences - done} records x up to {new_tokens}) "
                   f"in batches of {batch_size}{cpu}; the first batch's speed gives the ETA")
    model, tokenizer = load_teacher_for_sampling(path, target, torch_dtype)
    out.parent.mkdir(parents=True, exist_ok=True)
    _write_state(out, settings, batches)
    tokens = sum(int(b["tokens"]) for b in batches)
    if progress:
        progress(done, sequences, tokens)
    with partial.open("ab") as handle:
        for index in range(len(batches), -(-sequences // batch_size)):
            started = time.perf_counter()
            chunk = texts[index * batch_size:(index + 1) * batch_size]
            records, generated = sample_batch(model, tokenizer, chunk, settings, index)
            handle.write("".join(json.dumps({"text": text}, ensure_ascii=False) + "\n" for text in records).encode("utf-8"))
            handle.flush()
            os.fsync(handle.fileno())
            batches.append({"tokens": generated, "seconds": round(time.perf_counter() - started, 3)})
            _write_state(out, settings, batches)
            done, tokens = done + len(chunk), tokens + generated
            if progress:
                progress(done, sequences, tokens)
    seconds = sum(float(b["seconds"]) for b in batches)
    if out.exists() and not force:  # someone created it meanwhile
        raise LadderizeError(f"output {out} already exists; pass --force to replace it")
    _finish(out, settings, tokens, seconds)
    return SampleResult(out, sequences, tokens, seconds, resumed_records=resumed)


def _finish(out: Path, settings: SampleSettings, tokens: int, seconds: float) -> None:
    """Write the provenance ``OUT.json``, rename ``OUT.partial`` to ``OUT`` and drop the settings sidecar."""
    from ..checkpoint.atomic import move_file_atomic, write_file_atomic

    provenance: dict[str, Any] = {**asdict(settings), "records": settings.sequences, "tokens_generated": tokens,
                                  "seconds": round(seconds, 3)}
    write_file_atomic(out.with_name(out.name + ".json"), json.dumps(provenance, indent=2) + "\n")
    move_file_atomic(partial_path(out), out)
    _settings_file(out).unlink(missing_ok=True)
