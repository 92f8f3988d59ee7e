"""``ladderize predict``: latency and throughput of each schedule under TP, before retraining."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..checkpoint.atomic import check_file_target
from ..model.layout import LayerMode
from . import options as opts
from . import render
from .app import app, console



def converted_modes() -> str:
    """The whole-model what-ifs of the converted modes (``predict.estimate.what_ifs``), named for ``--schedules``."""
    return ", ".join(mode.value for mode in LayerMode.converted_modes())


@app.command("predict")
@opts.mode_options(panel=opts.INSTEAD_OF_LAYOUT)
def predict_cmd(
    model: Optional[str] = typer.Option(
        None, "--model",
        help="A preset (llama-3.1-70b, ...), config.json or checkpoint; default --layout's.",
    ),
    tp: str = typer.Option("1,2,4,8", "--tp", help="Comma-separated tensor-parallel degrees to predict."),
    batch: str = typer.Option("1,4,16,64", "--batch", help="Comma-separated batch sizes (sequences decoded together)."),
    prompt: int = typer.Option(1024, "--prompt", help="Prompt tokens per sequence (the prefill length)."),
    gen: int = typer.Option(512, "--gen", help="New tokens generated per sequence."),
    interconnect: Optional[str] = typer.Option(
        None, "--interconnect",
        help="h100-nvlink (default), h100-no-p2p, pcie-gen5, infiniband-ndr or a JSON profile.",
    ),
    layout: Optional[Path] = typer.Option(
        None, "--layout", help="Converted checkpoint (or its config.json): its layout's row."
    ),
    ranges: dict[str, Optional[str]] = None,  # --ladder, --spd, ...: one option per converted mode (``opts.mode_options``)
    spd_tp: Optional[int] = opts.spd_tp_option(" (default: the largest --tp)", panel=opts.INSTEAD_OF_LAYOUT),
    compute: Optional[str] = typer.Option(
        None, "--compute",
        help="measured (this GPU's modules timed) or roofline (--gpu); default: measured on that GPU.",
        rich_help_panel=opts.COMPUTE,
    ),
    gpu: Optional[str] = typer.Option(
        None, "--gpu",
        help="Roofline GPU: h100-gpt-fast (the H100 default), h100, h200, a100 or a profile JSON.",
        rich_help_panel=opts.COMPUTE,
    ),
    calibrate: bool = typer.Option(
        False, "--calibrate",
        help="Instead of predicting: time this device, write the fitted profile to --profile.",
        rich_help_panel=opts.CALIBRATION,
    ),
    profile: Optional[Path] = typer.Option(
        None, "--profile", help="With --calibrate: the profile to write; otherwise a profile to predict with.",
        rich_help_panel=opts.CALIBRATION,
    ),
    force: bool = opts.force_option("With --calibrate: replace an existing --profile file.", panel=opts.CALIBRATION),
    schedules: Optional[str] = typer.Option(
        None, "--schedules", help=f"Comma-separated: dense, {converted_modes()}, domino, upper-bound, layout (default: all that apply).",
        rich_help_panel=opts.SCHEDULES,
    ),
    domino_chunks: int = typer.Option(2, "--domino-chunks", help="Chunks domino splits the batch (or a lone prompt) into.", rich_help_panel=opts.SCHEDULES),
    json_path: Optional[Path] = opts.json_file_option(what="the rows, module timings and profiles used"),
    cache_dir: Optional[Path] = typer.Option(
        None, "--cache-dir", help="Cache of measured module timings (default ~/.cache/ladderize/predict).",
        rich_help_panel=opts.COMPUTE,
    ),
    show_modules: bool = typer.Option(False, "--show-modules", help="Also print the per-module compute timings.", rich_help_panel=opts.OUTPUT),
    device: str = opts.DEVICE_OPTION,
    dtype: str = opts.DTYPE_OPTION,
) -> None:
    """Predict prefill/decode latency and tokens/s of dense, ladder, SPD and domino schedules under TP, before retraining."""
    from ..predict.pipeline import calibrate_from_options, prepare_prediction

    if calibrate:
        from ..predict.calibrate import fit_summary

        device, _ = opts.check_placement(device, dtype)
        check_file_target(profile, "--profile file")
        result = calibrate_from_options(model=model, layout=layout, tp=tp, batch=batch, prompt=prompt, gen=gen,
                                        out=profile, force=force, cache_dir=cache_dir, device=device)
        for line in fit_summary(result):
            console.print(line, highlight=False, markup=False)
        console.print(f"wrote {profile}", highlight=False, markup=False)
        return
    device, _ = opts.check_placement(device, dtype, resolve=compute != "roofline" and profile is None)
    check_file_target(json_path, "--json file")
    if (compute == "measured" or cache_dir is not None) and profile is None:
        from ..checkpoint.atomic import check_writable
        from ..paths import cache_path

        opts.check_output(cache_dir, "--cache-dir")  # a folder the user names: in one that exists
        check_writable(Path(cache_dir or cache_path("predict")).expanduser() / "measurements.json", "predict cache file")
    plan = prepare_prediction(
        model=model, layout=layout, ranges=ranges, spd_tp=spd_tp, tp=tp, batch=batch, prompt=prompt, gen=gen,
        interconnect=interconnect, compute=compute, gpu=gpu, schedules=schedules, domino_chunks=domino_chunks,
        cache_dir=cache_dir, device=device, dtype=dtype, profile=profile,
    )
    for line in render.predict_header(plan):
        console.print(line, highlight=False, markup=False)
    if getattr(plan.compute, "timed_here", False) and not plan.compute.is_gpu:
        console.print("[yellow]warning: module times are this CPU's (big shapes via scaled proxies), not a GPU's[/]")
    result = plan.run()
    for line in getattr(plan.compute, "warnings", []):
        console.print(f"[yellow]warning: {line}[/]")

    table, notes = render.predict_table(result, prompt, gen)
    console.print(table)
    for number, note in enumerate(notes, 1):
        console.print(f"[{number}] {note}", highlight=False, markup=False)
    if show_modules:
        console.print(render.module_table(result))
    if json_path is not None:
        console.print(f"wrote {opts.write_json(json_path, result.to_record().to_json())}", highlight=False)
