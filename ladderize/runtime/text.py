"""Text in, text out on the tensor-parallel runtime: the pipeline behind ``ladderize generate``."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from .sampling import Sampling, check_sampling
from .generate import RuntimeOptions
from .launch import LaunchSpec


@dataclass
class GeneratedText:
    """The new tokens of one prompt, their text, and the wall time (start-up and prefill included)."""

    tokens: list[int]
    text: str
    seconds: float

    @property
    def wall_tokens_per_s(self) -> float:
        return len(self.tokens) / self.seconds if self.seconds > 0 else 0.0


def generate_text(
    checkpoint: str | Path,
    prompt: str,
    max_new_tokens: int = 32,
    launch: LaunchSpec = LaunchSpec(),
    sampling: Sampling = Sampling(),
    options: RuntimeOptions = RuntimeOptions(),
    schedule: str = "native",
    chat: bool = False,
) -> GeneratedText | None:
    """Tokenize ``prompt`` (in the chat template with ``chat``), generate on ``launch.tp`` ranks and decode.

    ``None`` on a torchrun rank other than 0 (rank 0 has the answer).
    """
    from ..checkpoint.architectures import read_config_json
    from ..checkpoint.io import load_tokenizer
    from .generate import generate

    check_sampling(sampling)
    read_config_json(checkpoint)  # a missing path or a non-checkpoint fails here, in one line (TP checks: the runtime)
    tokenizer = load_tokenizer(checkpoint, "generate")
    if chat:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True)
        ids = list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
    else:
        ids = tokenizer(prompt)["input_ids"]
    started = time.perf_counter()
    response = generate(checkpoint, [ids], max_new_tokens, launch, sampling, options, schedule)
    seconds = time.perf_counter() - started
    if response is None:
        return None
    tokens = response.tokens[0]
    return GeneratedText(tokens, tokenizer.decode(tokens, skip_special_tokens=True), seconds)
