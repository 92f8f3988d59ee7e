"""Option groups shared by the commands of ``ladderize.cli``, each defined once.

- layout: one ``--<mode> RANGES`` per converted mode of the mode table (``--ladder``, ``--spd``; ``mode_options``, which
  hands the command one mapping of mode to ranges; convert adds ``auto`` and ``--<mode>-budget``) and ``--spd-tp``, the
  degree of the TP-dependent modes (convert, bench, predict; sensitivity ranks with ``--spd-tp``)
- placement: ``--device``, ``--dtype`` (every command that computes), checked early by ``check_placement``
- numbers: every int/float option's range, one table (``NUMBER_RANGES``), checked as the option is parsed (``check_ranges``)
- output: ``--json`` has two meanings only: a flag that prints JSON on stdout instead of the human
  output (inspect, generate), or a FILE the command's JSON record is written to (bench, predict,
  sensitivity, eval); ``--force`` (replace OUT) and ``--out`` (where results go).
- help panels: ``--help`` groups each command's options by purpose (``rich_help_panel``). Typer prints its own
  "Options" panel first: it holds the few options most runs set (those given no panel) and ``--help``; the panels
  below (``LAYOUT``, ``DEVICE``, ...) follow in the order the command first names them. Each option's help is one or
  two lines; the details are in docs/.

Importing this module imports neither torch nor transformers (``ladderize --help`` stays fast).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer

from ..checkpoint.atomic import write_json  # noqa: F401  (opts.write_json: the one JSON record writer)
from ..checkpoint.placement import DEVICE_HELP, DTYPE_HELP

RANGES = "'16:32', '-8:', a single layer '5', '0:4,10', 'all' or 'none'"
AUTO = " 'auto': within --{name}-budget."

# ``--help`` panels, by purpose (see the module docstring)
LAYOUT = "Layout"
SYNTHETIC_LAYOUT = "Layout (with --synthetic)"
INSTEAD_OF_LAYOUT = "Layout (instead of --layout)"
DATA = "Data"
STAGES = "Stages"
TRAINING = "Training"
SAMPLING = "Sampling"
MEASURE = "Measurement"
DEVICE = "Device"
RUNTIME = "Runtime"
SCALE = "Scale (multi-GPU)"
AUTO_LAYOUT = "Auto layout and head grouping"
COMPUTE = "Compute model"
CALIBRATION = "Calibration"
SCHEDULES = "Schedules"
OUTPUT = "Output"
RUN_STATE = "Run state"


class ModeOptions:
    """A command with one ``--<mode> RANGES`` option per converted mode of the mode table (``model.layout.MODE_TRAITS``,
    in table order; help: the row's ``option_help``), and with ``budgets`` one ``--<mode>-budget`` each, handed to it
    as one mapping: ``ranges`` (mode name to the given ranges) and ``budgets`` (mode name to the budget).

    Typer reads a command's parameters from ``inspect.signature``: ``__signature__`` here is the command's own with
    ``ranges`` (and ``budgets``) replaced by the modes' options, built when Typer asks (when the CLI runs), so a mode
    registered in the table gets its options with no file of the CLI touched.
    """

    def __init__(self, command: Callable[..., Any], default: str | None, note: str, later_note: str | None, auto: bool,
                 budgets: bool, panel: str | None):
        self.__wrapped__ = command
        self.__name__, self.__qualname__ = command.__name__, command.__qualname__
        self.__module__, self.__doc__ = command.__module__, command.__doc__
        self._settings = (default, note, note if later_note is None else later_note, auto)
        self._budgets, self._panel = budgets, panel

    @staticmethod
    def _modes() -> tuple[str, ...]:
        from ..model.layout import LayerMode

        return tuple(mode.value for mode in LayerMode.converted_modes())

    def _mode_parameters(self) -> dict[str, tuple[Any, Any]]:
        """``{parameter: (annotation, OptionInfo)}`` of the table's modes as it is now (ranges, then budgets; a
        budget's range is checked as it is parsed, like ``check_ranges``'s)."""
        from typing import Optional

        from ..model.layout import LayerMode

        default, note, later_note, auto = self._settings
        kind = str if default is not None else Optional[str]
        made = {}
        for number, name in enumerate(self._modes()):
            extra = AUTO.format(name=name) if auto and number == 0 else ""  # the others: "same syntax"
            text = f": {RANGES}.{extra}{note}" if number == 0 else f", same syntax.{extra}{later_note}"
            made[name] = (kind, typer.Option(default, f"--{name}", help=LayerMode(name).option_help + text,
                                             rich_help_panel=self._panel))
        for name in self._modes() if self._budgets else ():
            flag = f"--{name}-budget"
            made[f"{name}_budget"] = (Optional[float], typer.Option(
                None, flag, help=f"With --{name} auto: {LayerMode(name).budget_help}.", callback=_range_check(flag, BUDGET),
                rich_help_panel=AUTO_LAYOUT))
        return made

    @property
    def __signature__(self) -> inspect.Signature:
        own = inspect.signature(self.__wrapped__, eval_str=True)
        options = self._mode_parameters()
        parameters = []
        for parameter in own.parameters.values():
            if parameter.name == "ranges":
                parameters += [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=info, annotation=kind)
                               for name, (kind, info) in options.items() if not name.endswith("_budget")]
            elif parameter.name == "budgets":
                parameters += [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=info, annotation=kind)
                               for name, (kind, info) in options.items() if name.endswith("_budget")]
            else:
                parameters.append(parameter.replace(kind=inspect.Parameter.KEYWORD_ONLY))
        return own.replace(parameters=parameters)

    @property
    def __annotations__(self) -> dict[str, Any]:  # typing.get_type_hints reads these
        return {name: parameter.annotation for name, parameter in self.__signature__.parameters.items()}

    def __call__(self, **kwargs: Any) -> Any:
        modes = self._modes()
        ranges = {name: kwargs.pop(name, None) for name in modes}
        if self._budgets:
            kwargs["budgets"] = {name: kwargs.pop(f"{name}_budget", None) for name in modes}
        return self.__wrapped__(ranges=ranges, **kwargs)


def mode_options(default: str | None = None, note: str = "", later_note: str | None = None, auto: bool = False,
                 budgets: bool = False, panel: str | None = LAYOUT) -> Callable[[Callable[..., Any]], ModeOptions]:
    """Decorate a command taking ``ranges`` (and, with ``budgets``, ``budgets``) with the modes' options (``ModeOptions``).

    ``default``: each ``--<mode>``'s (``None``: not given); ``note``: the end of the first mode's help, ``later_note``
    of the others' (default ``note``); ``auto``: the ranges may be ``auto`` (convert: with ``--<mode>-budget``);
    ``panel``: the ranges' ``--help`` panel (``None``: the first; the budgets are in ``AUTO_LAYOUT``)."""
    def decorate(command: Callable[..., Any]) -> ModeOptions:
        return ModeOptions(command, default, note, later_note, auto, budgets, panel)

    return decorate


def spd_tp_option(note: str = "", panel: str | None = LAYOUT) -> Any:
    """``--spd-tp N``: the TP degree SPD layers are defined for (``None``: the command's default)."""
    return typer.Option(None, "--spd-tp", help=f"Tensor-parallel degree the SPD layers are defined for{note}.",
                        rich_help_panel=panel)


DEVICE_OPTION: Any = typer.Option("auto", "--device", help=DEVICE_HELP, rich_help_panel=DEVICE)
DTYPE_OPTION: Any = typer.Option("auto", "--dtype", help=DTYPE_HELP, rich_help_panel=DEVICE)

# the runtime's (generate, bench)
BACKEND_OPTION: Any = typer.Option("auto", help="auto (gloo on CPU, nccl on CUDA), gloo or nccl.", rich_help_panel=RUNTIME)
COMM_OPTION: Any = typer.Option(
    "auto", "--comm", help="All-reduce path: auto, shm (ranks on one host), gloo or nccl (CUDA).", rich_help_panel=RUNTIME,
)
OVERSUBSCRIBE_OPTION: Any = typer.Option(False, "--oversubscribe", help="Allow more ranks than CPU cores.",
                                         rich_help_panel=RUNTIME)
ALLOW_SPD_MISMATCH_OPTION: Any = typer.Option(
    False, "--allow-spd-mismatch", help="Run SPD layers at another TP degree than they were converted for.",
    rich_help_panel=RUNTIME,
)
CUDA_GRAPHS_OPTION: Any = typer.Option(False, "--cuda-graphs", help="GPU: capture each decode step in a CUDA graph.",
                                       rich_help_panel=RUNTIME)
COMPILE_OPTION: Any = typer.Option(
    False, "--compile", help="torch.compile the decode step (bf16 not bit-identical to eager; fp32 is).",
    rich_help_panel=RUNTIME,
)
LINEAR_OPTION: Any = typer.Option("auto", "--linear", help="Linear kernel: auto, gemv, onednn or aten.",
                                  rich_help_panel=RUNTIME)

JSON_PRINT_OPTION: Any = typer.Option(False, "--json", help="Print JSON on stdout instead of the human-readable output.")


def json_file_option(required: bool = False, what: str = "the JSON record", panel: str | None = OUTPUT) -> Any:
    """``--json FILE``: write the command's JSON record to FILE."""
    return typer.Option(... if required else None, "--json", help=f"Write {what} to this JSON file.",
                        rich_help_panel=panel)


def force_option(help: str = "Replace OUT if it exists.", panel: str | None = OUTPUT) -> Any:
    return typer.Option(False, "--force", help=help, rich_help_panel=panel)


def out_option(default: Path | None, help: str, required: bool = False, panel: str | None = OUTPUT) -> Any:
    return typer.Option(... if required else default, "--out", help=help, rich_help_panel=panel)


def check_placement(device: str, dtype: str | None, resolve: bool = True) -> tuple[str, str | None]:
    """``--device``/``--dtype`` checked before any work: a typo is one line at once (no torch); with ``resolve``,
    a CUDA device where there is none is one line too: without torch where the machine surely has none (no NVIDIA
    driver: ``runtime.host.no_cuda_here``), else torch is asked (its import alone, nothing heavier). Returns the device
    spec and dtype name."""
    from ..checkpoint.placement import check_device, check_dtype

    device_spec, dtype_name = check_device(device), check_dtype(dtype)
    if resolve and device_spec.startswith("cuda"):
        from ..checkpoint.placement import no_cuda_line, resolve_device
        from ..errors import LadderizeError
        from ..runtime.host import no_cuda_here

        if no_cuda_here():
            raise LadderizeError(no_cuda_line(device_spec))

        resolve_device(device_spec)
    return device_spec, dtype_name


def check_checkpoint(path: Path | str) -> Any:
    """A checkpoint folder's config, read and checked before any heavy import (no torch): not found, not a
    checkpoint, an unsupported architecture or a layout its heads cannot hold is one line at once.
    Returns its ``checkpoint.architectures.ConfigHeader`` (shape and layout)."""
    from ..checkpoint.architectures import read_config_header

    return read_config_header(path)


def check_weights(path: Path | str) -> None:
    """A checkpoint folder's safetensors headers read (no data, no torch): missing, truncated or corrupt weights are one
    line in under a second, not after torch and the model load."""
    from ..convert.inspect import count_parameters

    count_parameters(Path(path).expanduser())


def check_layout_option(layout: str | None, ranges: dict[str, str | None]) -> None:
    """``convert --layout``: ``dense`` only (a copy with no layer converted), and not beside ``--<mode>`` ranges."""
    from ..errors import LadderizeError
    from ..model.layout import mode_flags

    if layout is None:
        return
    if layout.strip().lower() != "dense":
        raise LadderizeError(f"--layout {layout!r}: convert takes --layout dense only (a copy with no layer converted); "
                             f"name the layers to convert with {mode_flags(', ')}")
    given = [f"--{name} {spec}" for name, spec in ranges.items() if (spec or "none") != "none"]
    if given:
        raise LadderizeError(f"--layout dense converts no layer; it does not go with {', '.join(given)}")


def check_layout_of_source(src: str, ranges: dict[str, str | None], spd_tp: int | None, dense: bool = False) -> None:
    """``convert``'s ``--<mode>`` ranges and ``--spd-tp`` against a local source's config, before torch loads: a range
    that does not parse, lies outside the model or overlaps, and a TP-dependent degree its heads cannot split, are one
    line. (``auto`` layouts, GGUF files and hub ids are checked by the conversion.)

    No ranges (none given, or all ``none``) convert no layer: a converted local source keeps its own layout, and any
    other source is refused in one line naming the layout options unless ``dense`` (``--layout dense``) asks for the
    unconverted copy on purpose."""
    from ..convert.sources import check_source as kind_of
    from ..errors import LadderizeError
    from ..model.layout import Layout, mode_flags, tp_degree_for

    if "auto" in ranges.values():
        return
    local = kind_of(src) == "local"
    header = check_checkpoint(src) if local else None
    if all((spec or "none") == "none" for spec in ranges.values()):
        converted = header is not None and bool(header.layout.converted_layers)
        if converted and dense:
            raise LadderizeError(f"--layout dense copies a dense source; {src} is converted ({header.layout.describe()}): "
                                 "leave out --layout to copy it with its own layout")
        if not converted and not dense:
            raise LadderizeError(f"no layout given: name the layers to convert with {mode_flags(', ')} (ranges, or auto), "
                                 "or pass --layout dense to copy the source unconverted")
        return  # a converted source keeps its own layout; --layout dense copies a dense one
    if not local:
        return
    shape = header.shape
    layout = Layout.from_mode_ranges(shape.num_hidden_layers, ranges, spd_tp_size=tp_degree_for(ranges, spd_tp))
    layout.validate(shape.num_attention_heads, shape.num_key_value_heads, shape.intermediate_size)


def check_ranks(tps: list[int], device: str, oversubscribe: bool) -> None:
    """More CPU ranks than cores without ``--oversubscribe`` (``runtime.host.check_cores``, the runtime's own rule),
    refused before torch loads where the ranks surely run on the CPU: ``--device cpu``, or ``auto`` on a machine
    without an NVIDIA driver. (Elsewhere the runtime's ``check_machine`` decides, once torch knows the GPUs.)"""
    from ..checkpoint.placement import this_launch
    from ..runtime.host import check_cores, no_cuda_here

    on_cpu = device.startswith("cpu") or (device == "auto" and no_cuda_here())
    if on_cpu and not this_launch().by_launcher:
        for tp in tps:
            check_cores(tp, tp, oversubscribe)


def bench_default_tp(checkpoint: Path | str | None, synthetic: str | None, ranges: dict[str, str | None],
                     spd_tp: int | None, device: str, oversubscribe: bool) -> tuple[int, bool, str | None]:
    """``bench``'s TP degree when ``--tp`` is not given (``runtime.tp_check.default_tp``: 2, or the smallest degree that
    runs the model), with ``--oversubscribe`` turned on where that degree's ranks surely run on fewer CPU cores (as
    ``check_ranks`` decides it); returns (degree, oversubscribe, the line that says what was chosen, or ``None``).
    No torch."""
    from ..checkpoint.architectures import synthetic_config
    from ..checkpoint.shapes import ModelShape
    from ..hardware import cpu_cores
    from ..model.layout import Layout
    from ..checkpoint.placement import this_launch
    from ..runtime.host import no_cuda_here
    from ..runtime.tp_check import DEFAULT_TP, default_tp

    if checkpoint is not None:
        header = check_checkpoint(checkpoint)
        dims, layout_for = header.shape, lambda _tp: header.layout
    else:
        values, name = synthetic_config(synthetic)
        dims = ModelShape.from_config(values, name)
        chosen = {key: value for key, value in ranges.items() if value}
        layout_for = lambda tp: Layout.from_mode_ranges(dims.num_hidden_layers, chosen, spd_tp_size=spd_tp or tp)  # noqa: E731
    tp, reason = default_tp(dims, layout_for)
    notes = [] if reason is None else [f"the default --tp {DEFAULT_TP} cannot run this model ({reason})"]
    on_cpu = device.startswith("cpu") or (device == "auto" and no_cuda_here())
    if on_cpu and not this_launch().by_launcher and tp > cpu_cores() and not oversubscribe:
        oversubscribe = True
        notes.append(f"{tp} ranks on {cpu_cores()} CPU cores, oversubscribed (timings will not mean much)")
    return tp, oversubscribe, f"--tp {tp}: {'; '.join(notes)}" if notes else None


def check_schedules(names: list[str]) -> None:
    """Each ``--schedule``/``--schedules`` name known (``runtime.plan.Schedule``; no torch)."""
    from ..runtime.plan import Schedule

    for name in names:
        Schedule.parse(name)


def check_runtime_checkpoint(path: Path | str, tps: list[int], allow_spd_mismatch: bool) -> None:
    """``check_checkpoint``, and that each TP degree can run it (``runtime.tp_check.validate_tp``, the runtime's own
    rule): heads that do not split are one line before torch is imported, not after the ranks start."""
    from ..runtime.tp_check import validate_tp

    header = check_checkpoint(path)
    for tp in tps:
        validate_tp(header.shape, header.layout, tp, allow_spd_mismatch)
    check_weights(path)


def check_synthetic(shape: str, ranges: dict[str, str | None], spd_tp: int, tps: list[int], allow_spd_mismatch: bool) -> None:
    """``bench --synthetic SHAPE`` checked before torch: the shape (a preset or a config.json), the ``--<mode>``
    ranges on it, and each TP degree against its heads (``runtime.tp_check.validate_tp``), one line each."""
    from ..checkpoint.architectures import synthetic_config
    from ..checkpoint.shapes import ModelShape
    from ..model.layout import Layout
    from ..runtime.tp_check import validate_tp

    values, name = synthetic_config(shape)
    dims = ModelShape.from_config(values, name)
    layout = Layout.from_mode_ranges(dims.num_hidden_layers, {k: v for k, v in ranges.items() if v}, spd_tp_size=spd_tp)
    layout.validate(dims.num_attention_heads, dims.num_key_value_heads, dims.intermediate_size)
    for tp in tps:
        validate_tp(dims, layout, tp, allow_spd_mismatch)


def check_source(src: str) -> str:
    """``convert``/``sensitivity``/``sample`` SRC checked before heavy imports (``convert.sources.check_source``).
    Returns what it is: ``local``, ``gguf`` or ``hub``."""
    from ..convert.sources import check_source as check

    return check(src)


def check_output(path: Path | str | None, what: str = "output") -> None:
    """An output location (``OUT``, ``--out``, ``--json FILE``) checked before any work: its folder exists (no folder
    is made outside what the user named) and takes a new file; one line if not."""
    if path is not None:
        from ..checkpoint.atomic import check_file_target

        check_file_target(path, what)


def quiet_libraries(verbose: bool, vllm: bool = False) -> None:
    """``--verbose`` off: lm-eval, datasets and vLLM log every task override, engine step and warning; keep them to
    errors (``vllm``: a command that starts vLLM, which reads ``VLLM_LOGGING_LEVEL`` as it is imported, in every
    process it starts; a value set is kept)."""
    import logging
    import os

    if not verbose:
        if vllm:
            os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
        for name in ("lm_eval", "lm-eval", "datasets", "transformers", "huggingface_hub"):
            logging.getLogger(name).setLevel(logging.ERROR)


def hide_flag_types() -> None:
    """Typer's help shows a ``<bool>`` value tag beside every on/off flag (``--force <bool>``); a flag takes no value.
    Arguments too lose their tags (``src <str>``), and the usage line names them as the README does:
    ``ladderize convert [OPTIONS] SRC OUT``, not ``{src} {out}``."""
    _plain_arguments()
    option = getattr(typer.core, "TyperOption", None)
    original = getattr(option, "display_type_rich", None)
    if original is None or getattr(original, "_ladderize", False):
        return

    def display_type_rich(self, ctx):
        return None if getattr(self, "is_flag", False) and not getattr(self, "count", False) else original(self, ctx)

    display_type_rich._ladderize = True
    option.display_type_rich = display_type_rich


def _plain_arguments() -> None:
    argument = getattr(typer.core, "TyperArgument", None)
    if argument is None or getattr(argument, "_ladderize", False):
        return

    def usage_name(self) -> str:
        name = self.metavar or (self.name or "").upper()
        name = name if self.required else f"[{name}]"
        return name + ("..." if self.nargs != 1 else "")

    argument._usage_display_name = usage_name
    argument.display_type_rich = lambda self, ctx: None
    argument._ladderize = True


@dataclass(frozen=True)
class Range:
    """The values a numeric option takes: ``low`` (excluded when ``low_open``) up to ``high`` (included); ``None``: unbounded."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    words: str = ""  # what the values mean, where the bounds alone do not say it

    def describe(self) -> str:
        if self.words:
            return self.words
        if self.low is not None and self.high is not None:
            return f"in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}]"
        if self.low is not None:
            if self.low == 0:
                return "positive" if self.low_open else "0 or more"
            return f"{'above' if self.low_open else 'at least'} {self.low:g}"
        return f"at most {self.high:g}" if self.high is not None else "a number"

    def contains(self, value: float) -> bool:
        above = value > self.low if self.low_open else value >= self.low if self.low is not None else True
        return above and (self.high is None or value <= self.high)


COUNT, NATURAL, POSITIVE, FRACTION = Range(1), Range(0), Range(0, low_open=True), Range(0, 1, low_open=True)
BUDGET = POSITIVE  # every --<mode>-budget (``mode_options``), whichever modes the table has
# Every int/float option of every command, by flag; ``command --flag`` where one command's differs.
# tests/cli/test_option_ranges.py checks that no numeric option is missing here.
NUMBER_RANGES: dict[str, Range] = {
    "--tp": COUNT, "--data-parallel": COUNT, "--spd-tp": COUNT, "--max-shard-bytes": COUNT,
    "--max-new-tokens": COUNT, "--temperature": Range(0, words="0 (greedy) or positive"),
    "--top-k": Range(0, words="0 (all tokens) or positive"), "--top-p": FRACTION, "--seed": NATURAL,
    "--prompt": COUNT, "--gen": COUNT, "--warmup": NATURAL, "--repeats": COUNT, "--domino-chunks": COUNT,
    "--threads-per-rank": NATURAL, "--tokens": COUNT, "--seq-len": COUNT, "--batch-size": COUNT, "--grad-accum": COUNT,
    "--lr": POSITIVE, "--epochs": POSITIVE, "--lora-rank": COUNT, "--save-every": COUNT, "--sequences": COUNT,
    "--new-tokens": COUNT, "--samples": COUNT, "--limit": POSITIVE, "--max-length": Range(2), "--bootstrap-iters": NATURAL,
    "--max-steps": COUNT, "--max-tokens": COUNT, "--workers": COUNT, "--save-minutes": POSITIVE,
    "sample --temperature": POSITIVE,  # sampling text needs a temperature; generate's 0 is greedy
    "sensitivity --seq-len": Range(2),  # a perplexity needs one predicted token per sequence
    "adapt --seq-len": Range(2),  # each token trains on the next
}


def option_range(command: str, flag: str) -> Range | None:
    """The range of ``command``'s option ``flag`` (``NUMBER_RANGES``; ``BUDGET`` for a mode's ``--<mode>-budget``),
    or ``None`` when it has none."""
    if flag.endswith("-budget") and flag.startswith("--"):
        from ..model.layout import MODE_TRAITS

        if flag[2:-len("-budget")] in MODE_TRAITS:
            return BUDGET
    return NUMBER_RANGES.get(f"{command} {flag}", NUMBER_RANGES.get(flag))


def numeric_options(app: typer.Typer) -> list[tuple[str, str, Any]]:
    """``(command, --flag, OptionInfo)`` of every int/float option (``Optional`` included) the app's commands take."""
    import inspect
    import typing

    from typer.models import OptionInfo

    found = []
    for command in app.registered_commands:
        name = command.name or command.callback.__name__.replace("_", "-")
        hints = typing.get_type_hints(command.callback)
        for param, signature in inspect.signature(command.callback).parameters.items():
            kinds = [t for t in typing.get_args(hints.get(param)) if t is not type(None)] or [hints.get(param)]
            if isinstance(signature.default, OptionInfo) and kinds[0] in (int, float):
                flags = [d for d in (signature.default.param_decls or ()) if d.startswith("--")]
                found.append((name, flags[0] if flags else "--" + param.replace("_", "-"), signature.default))
    return found


def check_ranges(app: typer.Typer) -> None:
    """Give every numeric option with a ``NUMBER_RANGES`` entry a parse-time check: a value outside is one line
    (``--samples must be at least 1, got 0``) and exit 2, before the command runs or imports torch."""
    for command, flag, info in numeric_options(app):
        allowed = option_range(command, flag)
        if allowed is not None and not hasattr(info.callback, "range"):
            info.callback = _range_check(flag, allowed)


def _range_check(flag: str, allowed: Range):
    def check(value):  # Typer passes the value to a callback's one untyped parameter
        if value is not None and not allowed.contains(value):
            from ..errors import LadderizeError

            raise LadderizeError(f"{flag} must be {allowed.describe()}, got {value}")
        return value

    check.range = allowed
    return check
