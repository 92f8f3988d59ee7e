"""Small helpers shared by the model tests (inputs, layouts, comparisons)."""

from __future__ import annotations

import torch

ATOL = 1e-4  # fp32 parity tolerance: max abs difference of logits

# Named layouts for the 4-layer tiny model. SPD at TP 3 uses the TINY shape (6 heads, 3 KV heads).
DENSE = dict(layer_modes=["dense"] * 4)
LADDER = dict(layer_modes=["ladder"] * 4)
LADDER_UPPER = dict(layer_modes=["dense", "dense", "ladder", "ladder"])  # dense -> ladder transition
LADDER_LOWER = dict(layer_modes=["ladder", "ladder", "dense", "dense"])  # ladder -> dense transition
SPD_TP3 = dict(layer_modes=["spd"] * 4, spd_tp_size=3)
HYBRID = dict(layer_modes=["dense", "ladder", "spd", "ladder"], spd_tp_size=3)


def token_ids(batch: int = 2, seq: int = 10, seed: int = 1, vocab: int = 128) -> torch.Tensor:
    """Random token ids that avoid the special ids 0 (pad), 1 (bos) and 2 (eos)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (batch, seq), generator=generator)


def left_padded(ids: torch.Tensor, pads: list[int], pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad row i with ``pads[i]`` pad tokens (overwriting its first tokens); return (ids, mask)."""
    ids, mask = ids.clone(), torch.ones_like(ids)
    for row, count in enumerate(pads):
        ids[row, :count] = pad_id
        mask[row, :count] = 0
    return ids, mask


def positions_from_mask(mask: torch.Tensor) -> torch.Tensor:
    """Position ids as HF generate builds them for left padding: cumsum(mask) - 1, pads set to 1."""
    return (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 1)


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


@torch.no_grad()
def logits(model, ids: torch.Tensor, **kwargs) -> torch.Tensor:
    return model(ids, use_cache=False, **kwargs).logits


def logits_without_ladderize(folder, ids: torch.Tensor, workdir, python: str | None = None, remote: bool = True):
    """Logits of ``folder`` loaded by ``AutoModelForCausalLM`` in a fresh process where ``import ladderize``
    fails: through ``auto_map`` + ``trust_remote_code`` (``remote``), or as a plain Llama.
    ``python``: another interpreter (e.g. the transformers-4 venv); its failure raises ``CalledProcessError``
    with its output."""
    import subprocess
    import sys
    from pathlib import Path

    workdir = Path(workdir)
    torch.save(ids, workdir / "ids.pt")
    script = f"""
import sys
sys.modules["ladderize"] = None  # no ladderize in this process, whatever is installed
import torch
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained({str(folder)!r}, trust_remote_code={remote}).eval()
assert type(model).__module__.startswith("transformers_modules") == {remote}, type(model).__module__
with torch.no_grad():
    torch.save(model(torch.load({str(workdir / 'ids.pt')!r})).logits, {str(workdir / 'logits.pt')!r})
"""
    env = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(workdir / "hf"), "PATH": "/usr/bin:/bin"}
    subprocess.run([python or sys.executable, "-c", script], check=True, env=env, timeout=300, cwd=workdir,
                   capture_output=True, text=True)
    return torch.load(workdir / "logits.pt")
