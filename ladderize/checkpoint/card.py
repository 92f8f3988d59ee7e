"""The model card (``README.md``) that ``write_checkpoint`` puts in every checkpoint it writes.

What the hub shows and what a user needs: the layout (a table of layer ranges), the source, each
adaptation run with its measured results, how to load the folder with and without ladderize, and
the vLLM command. Built from the config and the provenance as the checkpoint records it (paths
already relative, ``architectures.portable_paths``).
"""

from __future__ import annotations

from itertools import groupby
from typing import Any

from ..model.configuration_ladder_llama import TRANSFORMERS_REQUIREMENT
from ..model.layout import LayerMode, Layout, format_layer_ranges

CARD_FILE = "README.md"
ADAPT_FIELDS = ("objectives", "local_schedule", "train", "data", "tokens", "steps", "seq_len", "train_s", "precision", "interpolate", "ema")


def model_card(config: Any, provenance: dict[str, Any] | None, name: str) -> str:
    """The card of a checkpoint folder called ``name`` (``config``: a LadderLlamaConfig, or a plain LlamaConfig)."""
    provenance = provenance or {}
    custom = getattr(config, "model_type", "") == "ladder_llama"
    layout = Layout.from_config(config) if custom else None
    source = provenance.get("source") or {}
    front = ["---", "library_name: transformers", "tags:", "- ladderize"]
    if custom:
        front += [f"- {mode.traits.card_tag}" for mode in LayerMode.converted_modes() if mode.traits.card_tag and layout.layers(mode)]
    if source.get("kind") == "hub":
        front += [f"base_model: {source.get('spec')}"]
    lines = [*front, "---", "", f"# {name}", ""]
    lines += _layout_section(layout, config) if custom else ["A plain Llama checkpoint (`model_type: llama`, no custom code), written by ladderize.", ""]
    lines += _source_section(provenance)
    lines += _adapt_section(provenance) if custom or provenance.get("history") else []
    lines += _load_section(name, custom)
    if custom:
        lines += _vllm_section(name, layout)
    return "\n".join(lines).rstrip() + "\n"


def _layout_section(layout: Layout, config: Any) -> list[str]:
    allreduces = layout.allreduces_per_token()
    lines = [
        f"Layout **{layout.describe()}** of a {layout.num_layers}-layer Llama, written by ladderize "
        "(Ladder Residual / Sync-Point Drop layouts for tensor parallelism).",
        "",
        "| layers | mode | what it means |",
        "| --- | --- | --- |",
    ]
    start = 0
    for mode, run in groupby(layout.modes):
        count = len(list(run))
        label = f"{mode.value} (TP {layout.spd_tp_size})" if mode.traits.tp_dependent else mode.value
        meaning = mode.traits.card_meaning.format(tp=layout.spd_tp_size)
        lines.append(f"| {format_layer_ranges(list(range(start, start + count)))} | {label} | {meaning} |")
        start += count
    lines += ["", f"All-reduces per token under tensor parallelism: {allreduces['total']} "
                  f"({allreduces['overlappable']} overlappable by ladder layers).", ""]  # fmt: skip
    if layout.spd_head_order:
        lines += ["SPD head groups follow `spd_head_order` in config.json (head grouping).", ""]
    return lines


def _source_section(provenance: dict[str, Any]) -> list[str]:
    source, registry = provenance.get("source") or {}, provenance.get("registry")
    if not source and not registry:
        return []
    lines = ["## Source", ""]
    if source:
        lines.append(f"- {source.get('architecture', 'model')} from `{source.get('spec') or source.get('path')}` ({source.get('kind', 'local')})")
    if registry:
        lines.append(f"- fetched as `{registry.get('package')}=={registry.get('version')}` from PyPI ({registry.get('member')})")
    if provenance.get("ladderize_version"):
        lines.append(f"- ladderize {provenance['ladderize_version']}; `ladderize.json` holds the full record (hashes of the source files)")
    return [*lines, ""]


def _adapt_section(provenance: dict[str, Any]) -> list[str]:
    runs = [step for step in provenance.get("history", []) if isinstance(step, dict) and step.get("step") == "adapt"]
    if not runs:
        return ["## Adaptation", "", "None: converted zero-shot. Ladder and SPD layers change the function; "
                "`ladderize adapt` retrains them (see ladderize's docs/adapt.md).", ""]  # fmt: skip
    lines = ["## Adaptation", ""]
    for number, run in enumerate(runs, 1):
        recipe = run.get("recipe") or {}
        stage = f" (recipe `{recipe.get('name')}`, stage {recipe.get('stage')})" if recipe else ""
        lines += [f"{number}. `ladderize adapt` on {run.get('layout', '?')}{stage}, {run.get('at', '')}:", ""]
        lines += [f"   - {key}: {run[key]}" for key in ADAPT_FIELDS if run.get(key) is not None]
        final = run.get("final_loss")
        if isinstance(final, dict):
            measured = ", ".join(f"{key} {value:.4g}" if isinstance(value, float) else f"{key} {value}" for key, value in final.items())
            lines.append(f"   - measured at the last step: {measured}")
        lines.append("")
    return lines


def _load_section(name: str, custom: bool) -> list[str]:
    if not custom:
        return ["## Load", "", "```python", "from transformers import AutoModelForCausalLM, AutoTokenizer", "",
                f'model = AutoModelForCausalLM.from_pretrained("{name}")',
                f'tokenizer = AutoTokenizer.from_pretrained("{name}")', "```", ""]  # fmt: skip
    return [
        "## Load",
        "",
        f"Needs {TRANSFORMERS_REQUIREMENT} (an older transformers refuses the config in one line).",
        "",
        "With ladderize installed (`pip install ladderize`; it registers `ladder_llama` with transformers):",
        "",
        "```python",
        "import ladderize  # noqa: F401",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        "",
        f'model = AutoModelForCausalLM.from_pretrained("{name}")',
        f'tokenizer = AutoTokenizer.from_pretrained("{name}")',
        "```",
        "",
        "Without ladderize: the modeling code travels in this folder (`auto_map` in config.json).",
        "",
        "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        "",
        f'model = AutoModelForCausalLM.from_pretrained("{name}", trust_remote_code=True)',
        f'tokenizer = AutoTokenizer.from_pretrained("{name}", trust_remote_code=True)',
        "```",
        "",
        "(Pass `trust_remote_code=True` to the tokenizer too: it reads the config, which is custom code; without "
        "the argument transformers asks whether to run it, and with `False` it reads the config as a generic one "
        "and warns of a model type mismatch. The tokenizer itself is a standard one.)",
        "",
    ]


def _vllm_section(name: str, layout: Layout) -> list[str]:
    tp = layout.spd_tp_size if layout.tp_dependent_layers else 2
    spd = f" SPD layers serve only at `--tensor-parallel-size {tp}`, the degree they were converted for." if layout.tp_dependent_layers else ""
    return [
        "## Serve with vLLM",
        "",
        f'`pip install "ladderize[vllm]"` (its vLLM plugin registers the model; no `--trust-remote-code`).{spd}',
        "",
        "```console",
        f"vllm serve {name} --tensor-parallel-size {tp}",
        "```",
        "",
    ]
