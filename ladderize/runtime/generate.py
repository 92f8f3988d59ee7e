"""Text generation (and teacher-forced scoring) on the tensor-parallel runtime.

``generate(...)`` serves one prompt batch; ``run_requests(...)`` serves several requests
(possibly several checkpoints) inside one process group, which keeps the start-up cost of
spawning ranks to one per call. Everything is validated in the calling process first, so
a bad degree or an SPD mismatch is one readable line, not a traceback from a rank.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..checkpoint.placement import runtime_dtype
from ..errors import LadderizeError
from .decode import Decoder, Sampling, generate_on_rank
from ..checkpoint.io import load_config
from ..checkpoint.shapes import ModelShape
from .tp_check import validate_tp
from .engine import RankModel
from .kernels import LinearKernel, resolve_kernel
from .launch import LaunchSpec, RankContext, check_machine, run_ranks
from .plan import Schedule, build_plan, domino_chunks_for
from .tp_slicing import SafetensorsSource
from .weights import load_rank_weights

@dataclass(frozen=True)
class RuntimeOptions:
    """Everything about *how* to run that is not the launch itself."""

    dtype: str = "auto"
    allow_spd_mismatch: bool = False
    domino_chunks: int = 2
    cuda_graphs: bool = False  # GPU only: capture each decode step in a CUDA graph
    compile: bool = False  # torch.compile the whole decode step (decode.compiled_decode_step); prefill stays eager
    static_decode: bool = False  # shape-static decode path without graphs (testing the graph path on CPU)
    linear: str = "auto"  # kernel of the linears: auto, gemv, onednn or aten (see kernels.py)


@dataclass(frozen=True)
class Request:
    """One batch of prompts for one checkpoint.

    ``max_new_tokens`` > 0 generates; ``score_pieces`` (lengths summing to the prompt length)
    instead returns teacher-forced logits of every prompt position, fed to the runtime as a
    prefill of the first piece followed by cached extensions of the others.
    """

    checkpoint: str
    input_ids: tuple[tuple[int, ...], ...]
    max_new_tokens: int = 0
    score_pieces: tuple[int, ...] | None = None
    schedule: str = "native"
    sampling: Sampling = Sampling()
    stop_on_eos: bool = True


@dataclass
class Response:
    tokens: list[list[int]] = field(default_factory=list)  # new tokens per row
    logits: np.ndarray | None = None  # [B, S, V] float32 when scored
    allreduces_per_forward: int = 0
    plan: str = ""


def eos_token_ids(path: str | Path, config: Any) -> tuple[int, ...]:
    """EOS ids as ``generate`` uses them: generation_config.json first, then config.json."""
    value = None
    generation = Path(path) / "generation_config.json"
    if generation.is_file():
        value = json.loads(generation.read_text()).get("eos_token_id")
    if value is None:
        value = getattr(config, "eos_token_id", None)
    if value is None:
        return ()
    return tuple(value) if isinstance(value, (list, tuple)) else (int(value),)


def _check_request(request: Request, spec: LaunchSpec, options: RuntimeOptions) -> None:
    config = load_config(request.checkpoint)
    layout = config.layout
    schedule = Schedule.parse(request.schedule)
    native = schedule is Schedule.NATIVE
    validate_tp(ModelShape.from_config(config), layout, spec.tp, options.allow_spd_mismatch or not native)
    rows = request.input_ids
    if not rows or not rows[0]:
        raise LadderizeError("the prompt is empty")
    if len({len(r) for r in rows}) != 1:
        raise LadderizeError("all prompts of a batch must have the same number of tokens")
    if request.score_pieces is not None and sum(request.score_pieces) != len(rows[0]):
        raise LadderizeError("score_pieces must add up to the prompt length")
    if options.cuda_graphs and spec.device_type != "cuda":
        raise LadderizeError("--cuda-graphs needs a CUDA device")
    resolve_linear(options, spec.device_type)


def resolve_linear(options: RuntimeOptions, device_type: str) -> LinearKernel:
    """The linear kernel the ranks will use; refuses, in one line, one they could not run."""
    device, dtype = torch.device(device_type), runtime_dtype(options.dtype, device_type)
    return resolve_kernel(options.linear, device, dtype, compiled=options.compile)


def _serve(context: RankContext, requests: tuple[Request, ...], options: RuntimeOptions) -> list[Response]:
    dtype = runtime_dtype(options.dtype, context.device)
    models: dict[str, tuple[RankModel, Any, Any]] = {}
    responses = []
    for request in requests:
        if request.checkpoint not in models:
            config = load_config(request.checkpoint)
            layout = config.layout
            dims = ModelShape.from_config(config)
            weights = load_rank_weights(
                SafetensorsSource(request.checkpoint), dims, layout, context.world_size, context.rank, dtype, context.device
            )
            model = RankModel(weights, config, context.comm, compile_modules=options.compile, linear=options.linear)
            models[request.checkpoint] = (model, config, layout)
        model, config, layout = models[request.checkpoint]
        ids = torch.tensor(request.input_ids, dtype=torch.long, device=context.device)
        batch, prompt_len = ids.shape
        plan = build_plan(layout, request.schedule, domino_chunks_for(batch, options.domino_chunks))
        decoder = Decoder(
            model, plan, batch, prompt_len + request.max_new_tokens + 1,
            cuda_graphs=options.cuda_graphs, static=options.static_decode, compiled=options.compile,
        )
        response = Response(allreduces_per_forward=plan.allreduces_per_forward, plan=plan.describe())
        if request.score_pieces is not None:
            pieces, position = [], 0
            for length in request.score_pieces:
                chunk = ids[:, position : position + length]
                if position == 0:
                    pieces.append(decoder.prefill(chunk, last_only=False))
                else:
                    pieces.append(decoder.extend(chunk, position, last_only=False))
                position += length
            response.logits = torch.cat(pieces, dim=1).float().cpu().numpy()
        else:
            eos = eos_token_ids(request.checkpoint, config) if request.stop_on_eos else ()
            pad = getattr(config, "pad_token_id", None)
            pad = pad if pad is not None else (eos[0] if eos else 0)
            tokens = generate_on_rank(decoder, ids, request.max_new_tokens, request.sampling, eos, pad)
            response.tokens = tokens.cpu().tolist()
        responses.append(response)
    return responses


def run_requests(
    requests: list[Request], spec: LaunchSpec = LaunchSpec(), options: RuntimeOptions = RuntimeOptions()
) -> list[Response] | None:
    """Serve ``requests`` on ``spec.tp`` ranks (one process group for all); rank 0's responses.

    Under torchrun only rank 0 gets the responses; the other ranks get ``None``.
    """
    check_machine(spec)
    for request in requests:
        _check_request(request, spec, options)
    return run_ranks(functools.partial(_serve, requests=tuple(requests), options=options), spec)


def generate(
    checkpoint: str | Path,
    input_ids: list[list[int]],
    max_new_tokens: int,
    spec: LaunchSpec = LaunchSpec(),
    sampling: Sampling = Sampling(),
    options: RuntimeOptions = RuntimeOptions(),
    schedule: str = "native",
) -> Response | None:
    """Generate up to ``max_new_tokens`` for each prompt row (greedy unless ``sampling`` says otherwise)."""
    if max_new_tokens < 1:
        raise LadderizeError(f"--max-new-tokens must be at least 1, got {max_new_tokens}")
    request = Request(str(checkpoint), tuple(tuple(int(t) for t in row) for row in input_ids), max_new_tokens,
                      schedule=schedule, sampling=sampling)
    responses = run_requests([request], spec, options)
    return None if responses is None else responses[0]


def score(
    checkpoint: str | Path,
    input_ids: list[list[int]],
    spec: LaunchSpec = LaunchSpec(),
    pieces: tuple[int, ...] | None = None,
    options: RuntimeOptions = RuntimeOptions(),
) -> np.ndarray | None:
    """Teacher-forced logits [B, S, V] of ``input_ids``, computed with prefill + cached decode pieces."""
    rows = tuple(tuple(int(t) for t in row) for row in input_ids)
    request = Request(str(checkpoint), rows, score_pieces=pieces or (len(rows[0]),))
    responses = run_requests([request], spec, options)
    return None if responses is None else responses[0].logits


__all__ = ["Request", "Response", "RuntimeOptions", "generate", "resolve_linear", "run_requests", "score"]
