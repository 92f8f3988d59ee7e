"""What an adaptation run costs before it starts: FLOPs per token, memory per GPU, steps, saves and time.

Everything here reads shapes only (a ``config.json`` is enough), so ``ladderize adapt --dry-run`` prices a run of a
model whose weights are not on this machine, for the launch it names (``8xH100``) or the one it runs under.

**FLOPs per trained token** (``FlopCount``), counted as the PaLM paper's appendix B counts them (matmul parameters:
the embedding lookup excluded, the LM head included; the attention's quadratic term left out):

- 6 x the trained parameters (forward, the activations' gradient, the weights' gradient);
- 4 x the frozen parameters the gradient passes through: the student's layers above its first trained one that do
  not train, and its LM head when an objective reads it (forward and the activations' gradient);
- 2 x the forward-only parameters: the layers below the first converted one (run once for student and teacher when
  they are identical, ``share_prefix``), and the teacher's layers and head that the objectives read.

**Memory per GPU** of a joint stage (``JointMemory``), priced for the strategy it runs with
(``strategy_choice.choose_strategy``: the same call the run makes):

- *sharded* (FSDP2, ``sharded.py``): fp32 student weights (beside a teacher, only its layers from the first converted
  one up: the rest are the teacher's, held once), the teacher in the compute dtype, fp32 gradients and AdamW's two
  fp32 moments of the trained parameters, each divided by the processes; two gathered decoder layers in the compute
  dtype (the one computing and the one prefetched); with ``grad_accum`` > 1, the accumulated gradients, which FSDP2
  keeps unsharded in fp32 between micro-batches (gradient sync waits for the last one);
- *one process* or *replicated* (``replicated.py``, DDP): the whole fp32 student and the whole fp32 teacher on every
  process, fp32 gradients and AdamW's moments of the trained parameters (under DDP a second copy of the gradients in
  its buckets), and ``ema``'s fp32 average of them. ``--train all`` trains every parameter, ``--train lora`` the
  adapters (``lora_parameters``).

Both keep the activations the backward needs, per token of a micro-batch: 6 x hidden + 2 x KV width + 4 x intermediate
values in the compute dtype for every layer from the first trained one up (``activation_checkpointing``: only each layer's
two input states, plus one layer's activations while it recomputes).
A run fits where the total is at most ``USABLE_SHARE`` of the GPU's memory less ``RESERVED_BYTES`` (CUDA context,
NCCL buffers, the allocator's slack).

**Time** on a known GPU: each stage's FLOPs at the GPU's peak x ``ASSUMED_MFU`` (``SEQUENTIAL_ASSUMED_MFU``), the
launch as a ``stage_clock.StageClock`` (``PricedDevice``), timed by the same function as a pace timed here.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ...errors import LadderizeError
from ...hardware import GPU_PEAKS, gpu_named
from ...progress import gib
from .planned_stage import PlannedStage
from .settings_sections import ParallelismSettings, TrainingSettings
from .sequential_schedule import rows_read

if TYPE_CHECKING:
    from ..objectives.registry import Objective

USABLE_SHARE = 0.92  # of the GPU's memory: what the caching allocator can hand out before fragmentation bites
RESERVED_BYTES = 3 << 30  # CUDA context, NCCL's buffers, cuBLAS workspaces
ASSUMED_MFU = 0.34  # a joint stage's time on a known GPU: kd measured at llama-3b on one H100 (bench_adapt_throughput.py)
SEQUENTIAL_ASSUMED_MFU = 0.30
DISK_BYTES_PER_S = 1e9  # the rate a stage's output is priced at: 1 GB/s, a network file system's or a slow local disk's
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}


def _shape_of(config: Any):
    from ...checkpoint.shapes import ModelShape

    return config if isinstance(config, ModelShape) else ModelShape.from_config(config, "model")


def layer_parameters(config: Any) -> int:
    """Parameters of one decoder layer (attention, MLP and its two norms)."""
    shape = _shape_of(config)
    outside = shape.vocab_size * shape.hidden_size * (1 if shape.tie_word_embeddings else 2) + shape.hidden_size
    return (shape.num_parameters - outside) // shape.num_hidden_layers


def head_parameters(config: Any) -> int:
    """Parameters of the LM head (the embedding's, when they are tied): vocabulary x hidden."""
    shape = _shape_of(config)
    return shape.vocab_size * shape.hidden_size


@dataclass(frozen=True)
class FlopCount:
    """Matmul parameters of one trained token by how often each multiplies (see the module docstring)."""

    trained: int
    backward_through: int
    forward_only: int
    recomputed: int = 0  # activation checkpointing: the decoder layers' forward run again in the backward

    @property
    def per_token(self) -> int:
        """The model's FLOPs per token (what MFU counts): the recompute left out."""
        return 6 * self.trained + 4 * self.backward_through + 2 * self.forward_only

    @property
    def executed_per_token(self) -> int:
        """The FLOPs a device runs per token: the model's and the recomputed forward (what a priced time counts)."""
        return self.per_token + 2 * self.recomputed

    @classmethod
    def for_stage(cls, config: Any, converted: list[int], weights: dict[str, float] | set[str], *,
                  share_prefix: bool = True, scope: str = "converted", stored_teacher: bool = False,
                  checkpointing: bool = False) -> "FlopCount":
        """The count of a joint stage training ``converted`` (``scope`` converted or all) with these objectives (what
        each reads of the two models: ``registry.Objective``); ``stored_teacher``: it reads the teacher's states a
        sequential stage stored, so the shared prefix and the teacher's layers do not run (its head does);
        ``checkpointing``: every decoder layer the backward passes through runs its forward again (the head does not)."""
        from ..objectives.registry import entries

        if checkpointing:
            plain = cls.for_stage(config, converted, weights, share_prefix=share_prefix, scope=scope,
                                  stored_teacher=stored_teacher)
            shape = _shape_of(config)
            head = head_parameters(shape) if any(objective.head for objective in entries(weights)) else 0
            layers = plain.trained + plain.backward_through - head  # trained or passed through, in every scope
            return cls(plain.trained, plain.backward_through, plain.forward_only, layers)

        shape = _shape_of(config)
        layers, layer, head = shape.num_hidden_layers, layer_parameters(shape), head_parameters(shape)
        objectives = entries(weights)
        reads_head = any(objective.head for objective in objectives)
        # the student's layers that run
        top = layers if any(objective.reads_final for objective in objectives) else max(converted) + 1
        if scope == "lora":  # the adapters are tiny: the converted layers' weights pass the gradient, untrained
            plain = cls.for_stage(shape, converted, weights, share_prefix=share_prefix, stored_teacher=stored_teacher)
            return cls(0, plain.backward_through + plain.trained, plain.forward_only)
        if scope == "all":
            trained = layers * layer + (head if reads_head else 0)
            return cls(trained, 0, cls._teacher(objectives, layers, layer, head, max(converted), 0))
        first = min(converted)
        trained = len(converted) * layer
        through = (top - first - len(converted)) * layer + (head if reads_head else 0)
        if stored_teacher:
            return cls(trained, through, head if any(objective.teacher_head for objective in objectives) else 0)
        prefix = first * layer
        teacher = cls._teacher(objectives, layers, layer, head, max(converted), first if share_prefix else 0)
        return cls(trained, through, prefix + teacher)

    @staticmethod
    def _teacher(objectives: list[Objective], layers: int, layer: int, head: int, last_converted: int,
                 start: int) -> int:
        """Forward-only parameters of the teacher from layer ``start`` (0 when its prefix is not shared)."""
        from ..objectives.registry import TEACHER_FINAL

        if not any(objective.needs_teacher for objective in objectives):
            return 0
        stop = layers if any(objective.teacher == TEACHER_FINAL for objective in objectives) else last_converted + 1
        return (stop - start) * layer + (head if any(objective.teacher_head for objective in objectives) else 0)


@dataclass(frozen=True)
class Launch:
    """How many processes (one GPU each) and which GPU: ``8xH100``; ``gpu`` None where it is not known."""

    processes: int
    gpu: str | None = None

    @classmethod
    def parse(cls, text: str) -> "Launch":
        match = re.fullmatch(r"\s*(\d+)\s*[xX]\s*([A-Za-z0-9-]+)\s*", text)
        known = sorted(GPU_PEAKS)
        if not match or int(match.group(1)) < 1 or match.group(2).lower() not in known:
            raise LadderizeError(f"--dry-run {text!r}: give the launch as NxGPU, e.g. 8xH100 (GPUs: "
                                 f"{', '.join(k.upper() for k in known)})")
        return cls(int(match.group(1)), match.group(2).lower())

    @classmethod
    def current(cls, device: str = "auto") -> "Launch":
        """The launch this process runs under: the launcher's process count and, where ``device`` (``--device``)
        places the run on a GPU, that GPU if known."""
        from ...checkpoint.placement import resolve_device, this_launch

        target = resolve_device(device)
        gpu = None
        if target.type == "cuda":
            import torch

            gpu = gpu_named(torch.cuda.get_device_name(target))
        return cls(this_launch().world, gpu)

    @property
    def memory_bytes(self) -> float | None:
        return GPU_PEAKS[self.gpu].memory_bytes if self.gpu else None

    @property
    def peak_flops_per_s(self) -> float | None:
        return GPU_PEAKS[self.gpu].peak_flops_per_s if self.gpu else None

    def describe(self) -> str:
        return f"{self.processes} x {self.gpu.upper() if self.gpu else 'device'}"


@dataclass(frozen=True)
class PricedDevice:
    """A launch priced from afar, a ``stage_clock.StageClock``: a stage's FLOPs (``FlopCount``; a sequential stage's
    layer passes and the teacher's pass) over a GPU's peak FLOP/s x the assumed MFU, on the processes its steps are
    split over; reads are not priced."""

    config: Any
    converted: tuple[int, ...]
    launch: Launch

    @classmethod
    def of(cls, config: Any, converted: list[int], launch: Launch) -> "PricedDevice | None":
        """The device of ``launch`` (None where its GPU, and so its peak, is not known)."""
        return cls(config, tuple(converted), launch) if launch.peak_flops_per_s else None

    def flops_per_s(self, sequential: bool) -> float:
        """One GPU's assumed rate: its peak at ``SEQUENTIAL_ASSUMED_MFU`` or ``ASSUMED_MFU``."""
        return (SEQUENTIAL_ASSUMED_MFU if sequential else ASSUMED_MFU) * self.launch.peak_flops_per_s

    def count(self, stage: PlannedStage, stored_teacher: bool = False) -> FlopCount:
        """The FLOPs per trained token of joint stage ``stage``."""
        from ..objectives.registry import parse_objectives

        settings = stage.resolved
        return FlopCount.for_stage(self.config, list(self.converted), parse_objectives(settings.objective.objectives),
                                   scope=settings.scope.train, stored_teacher=stored_teacher,
                                   checkpointing=bool(settings.parallelism.activation_checkpointing))

    def tokens_per_s_per_gpu(self, stage: PlannedStage, stored_teacher: bool = False) -> float:
        return self.flops_per_s(False) / self.count(stage, stored_teacher).executed_per_token

    def fixed_seconds(self, stage: PlannedStage) -> float:
        return 0.0

    def sequential_seconds(self, stage: PlannedStage) -> float:
        """Each converted layer's ``epochs`` training passes over the calibration tokens and the teacher's forward
        over them, on the processes its step's batch is split over."""
        settings = stage.resolved
        shape = _shape_of(self.config)
        tokens = settings.training.tokens
        work = (6 * layer_parameters(shape) * tokens * settings.sequential.epochs * len(self.converted)
                + 2 * shape.num_parameters * tokens)
        return work / (self.flops_per_s(True) * self.gpus(stage))

    def gpus(self, stage: PlannedStage) -> int:
        """The processes a sequential stage's step is split over (``stage_clock.sequential_processes``)."""
        from .stage_clock import sequential_processes

        return sequential_processes(stage, self.launch.processes)

    def joint_seconds(self, stage: PlannedStage, stored_teacher: bool) -> float:
        """Whole steps of the global batch, each process computing its part of every step
        (``stage_clock.process_share``, as a pace timed under the launch counts it)."""
        from .stage_clock import process_share

        training = stage.resolved.training
        tokens = training.steps * training.tokens_per_step * process_share(stage, self.launch.processes)
        return tokens / self.tokens_per_s_per_gpu(stage, stored_teacher)


LOGIT_BLOCKS_ALIVE = 6  # float32 [block rows, vocab] tensors alive at once in one block of the kd loss (head_bytes)


def activation_bytes_per_token(config: Any, compute_bytes: int = 2) -> int:
    """Bytes one layer keeps for the backward per token, as autograd saves them (``model/block.py``): in the compute
    dtype (6 x hidden + 2 x KV width + 4 x intermediate) each RMSNorm's normalised rows and output, q (after the rotary) and the attention's
    output, k and v, the MLP's gate, up, activation and product; in float32 each RMSNorm's input (``x.float()``) and
    its per-token inverse norm, and the attention's log-sum-exp per head."""
    shape = _shape_of(config)
    kv = shape.num_key_value_heads * shape.head_dim
    return (compute_bytes * (6 * shape.hidden_size + 2 * kv + 4 * shape.intermediate_size)
            + 2 * 4 * shape.hidden_size + 4 * shape.num_attention_heads + 2 * 4)


def head_bytes(config: Any, micro_batch_tokens: int, compute_bytes: int, sharded: bool, processes: int,
               teacher_head: bool) -> tuple[float, float, float]:
    """``(head, logits, rows)``: the bytes the LM-head losses hold at their peak (``objectives.blockwise_head_losses``)
    for a micro-batch of ``micro_batch_tokens`` on a GPU (``registry.logit_block_rows`` rows a block).

    - *sharded*: the head is an FSDP2 unit (the teacher's, shared), gathered whole in the compute dtype on more than
      one process; the student's logits exist whole with their gradient (``BlockwiseLoss``, 2 x tokens x vocab in the
      compute dtype), beside ``LOGIT_BLOCKS_ALIVE`` float32 blocks of the loss;
    - one process or replicated: a plain head runs inside the blocks (``BlockwiseHeadLoss``): its weight cast once to
      the compute dtype where that is not float32 (and the teacher's, ``frozen_head``), one block's logits in the
      compute dtype and ``LOGIT_BLOCKS_ALIVE`` float32 ones, and the rows' float32 gradient;
    - rows, both: the final norm's float32 input, its output (the head's input), the teacher's final stream and its
      normed rows, in the compute dtype."""
    from ..objectives.registry import logit_block_rows

    shape = _shape_of(config)
    vocab, hidden, tokens = shape.vocab_size, shape.hidden_size, micro_batch_tokens
    block = min(tokens, logit_block_rows(vocab, "cuda"))
    blocks = LOGIT_BLOCKS_ALIVE * block * vocab * 4
    rows = tokens * hidden * (4 + 3 * compute_bytes)
    if sharded:
        head = vocab * hidden * compute_bytes if processes > 1 else 0
        return float(head), float(2 * tokens * vocab * compute_bytes + blocks), float(rows)
    casts = (1 + teacher_head) * vocab * hidden * compute_bytes if compute_bytes < 4 else 0
    return float(casts), float(block * vocab * compute_bytes + blocks), float(rows + 4 * tokens * hidden)


def lora_parameters(config: Any, rank: int) -> int:
    """Parameters of one layer's LoRA adapters of ``rank`` (``lora.py``: A and B on each of the layer's linear modules,
    ``architectures.LINEAR_MODULES``)."""
    shape = _shape_of(config)
    hidden, inner = shape.hidden_size, shape.intermediate_size
    query, kv = shape.num_attention_heads * shape.head_dim, shape.num_key_value_heads * shape.head_dim
    widths = {"q_proj": hidden + query, "k_proj": hidden + kv, "v_proj": hidden + kv, "o_proj": query + hidden,
              "gate_proj": hidden + inner, "up_proj": hidden + inner, "down_proj": inner + hidden}
    return rank * sum(widths.values())


@dataclass(frozen=True)
class JointMemory:
    """Bytes per GPU of a joint stage, by what holds them."""

    student: float
    teacher: float
    gradients: float
    optimizer: float
    gathered: float
    activations: float
    accumulated: float = 0.0  # sharded, with grad_accum > 1: the unsharded fp32 gradients between micro-batches
    buckets: float = 0.0  # replicated (DDP): the gradients' copy in its buckets
    ema: float = 0.0  # ema: the fp32 average of the trained parameters
    head: float = 0.0  # an objective on the LM head: the head gathered (sharded) or cast (``head_bytes``)
    logits: float = 0.0  # its logits, their gradient and the loss's float32 blocks
    rows: float = 0.0  # the final stream's rows around the head

    @property
    def total(self) -> float:
        return (self.student + self.teacher + self.gradients + self.optimizer + self.gathered + self.activations
                + self.accumulated + self.buckets + self.ema + self.head + self.logits + self.rows)

    @classmethod
    def estimate(cls, config: Any, converted: list[int], processes: int, micro_batch_tokens: int, *,
                 teacher: bool = True, checkpointing: bool = False, compute_bytes: int = 2,
                 sharded: bool = True, scope: str = "converted", ema: bool = False, accumulating: bool = False,
                 lora_rank: int = 16, head_loss: bool = False, teacher_head: bool = False) -> "JointMemory":
        """The bytes per GPU (module docstring) of a stage training ``scope`` (``--train``) of ``converted``, on
        ``processes``; ``sharded``: FSDP2, else the whole student on every process (``strategy_choice.Strategy.shards``)."""
        shape = _shape_of(config)
        layer = layer_parameters(shape)
        every = shape.num_parameters
        first = 0 if scope == "all" else min(converted)
        trained = (every if scope == "all" else len(converted) * lora_parameters(shape, lora_rank) if scope == "lora"
                   else len(converted) * layer)
        per_layer = activation_bytes_per_token(shape, compute_bytes)
        kept_layers = shape.num_hidden_layers - first
        if checkpointing:
            activations = micro_batch_tokens * (kept_layers * 2 * shape.hidden_size * compute_bytes + per_layer)
        else:
            activations = micro_batch_tokens * kept_layers * per_layer
        head, logits, rows = (head_bytes(shape, micro_batch_tokens, compute_bytes, sharded, processes, teacher_head)
                              if head_loss else (0.0, 0.0, 0.0))
        if not sharded:  # replicated.py: both models whole, in fp32, on every process
            return cls(student=4 * every + (4 * trained if scope == "lora" else 0),
                       teacher=4 * every if teacher else 0.0, gradients=4 * trained, optimizer=8 * trained,
                       gathered=0.0, activations=float(activations), buckets=4 * trained if processes > 1 else 0.0,
                       ema=4 * trained if ema else 0.0, head=head, logits=logits, rows=rows)
        # sharded beside a teacher, the student holds its own layers from the first converted one up: the layers
        # below it, the embedding, the final norm and the head are the teacher's (``sharded._identical_parts``)
        own = kept_layers * layer if teacher else every
        return cls(student=4 * own / processes, teacher=(compute_bytes * every / processes) if teacher else 0.0,
                   gradients=4 * trained / processes, optimizer=8 * trained / processes,
                   gathered=2 * layer * compute_bytes if processes > 1 else 0.0,
                   activations=float(activations), accumulated=4 * trained if accumulating else 0.0,
                   head=head, logits=logits, rows=rows)

    @classmethod
    def for_step(cls, config: Any, converted: list[int], stage: PlannedStage, processes: int,
                 micro_batch_tokens: int | None = None) -> "JointMemory":
        """The estimate of a plan's joint stage ``stage`` (its typed settings) on
        ``processes``, for the strategy it runs with there (``strategy_choice.choose_strategy``); ``micro_batch_tokens``:
        the step's own micro-batch unless given: its global batch's rows on one process in one micro-batch
        (``batches.StepSplit.local``)."""
        from ..objectives.registry import entries, parse_objectives
        from .strategy_choice import choose_strategy

        settings = stage.resolved
        weights = parse_objectives(settings.objective.objectives)
        local = settings.training.split(processes).local
        return cls.estimate(config, converted, processes, micro_batch_tokens or settings.training.seq_len * local,
                            teacher=any(objective.needs_teacher for objective in entries(weights)),
                            checkpointing=bool(settings.parallelism.activation_checkpointing),
                            compute_bytes=4 if settings.parallelism.dtype == "float32" else 2,
                            sharded=choose_strategy(settings, processes).shards, scope=settings.scope.train,
                            ema=bool(settings.scope.ema), accumulating=settings.training.grad_accum > 1, lora_rank=settings.scope.lora_rank,
                            head_loss=any(objective.head for objective in entries(weights)),
                            teacher_head=any(objective.teacher_head for objective in entries(weights)))

    @classmethod
    def largest_batch(cls, config: Any, converted: list[int], processes: int, seq_len: int, usable: float, *,
                      most: int, stage: PlannedStage | None = None, **options: Any) -> int:
        """The most sequences of ``seq_len`` tokens per micro-batch, up to ``most``, whose estimate fits in ``usable``
        bytes (0: not one): of the plan's stage ``stage`` (``for_step``), else ``estimate`` with ``options``."""
        def fits(batch: int) -> bool:
            tokens = seq_len * batch
            memory = (cls.for_step(config, converted, stage, processes, tokens) if stage is not None else
                      cls.estimate(config, converted, processes, tokens, **options))
            return memory.total <= usable

        batch = 0
        while batch < most and fits(batch + 1):
            batch += 1
        return batch

    def describe(self) -> str:
        parts = [("student", self.student), ("teacher", self.teacher), ("gradients", self.gradients),
                 ("DDP buckets", self.buckets), ("unsharded accumulated gradients", self.accumulated),
                 ("AdamW", self.optimizer), ("EMA", self.ema), ("gathered layers", self.gathered),
                 ("activations", self.activations), ("LM head", self.head),
                 ("logits and blocks", self.logits), ("head rows", self.rows)]
        return f"{gib(self.total)} = " + " + ".join(f"{name} {gib(value)}" for name, value in parts if value)


def usable_bytes(memory_bytes: float) -> float:
    """What a run may plan to use of a GPU's ``memory_bytes``."""
    return USABLE_SHARE * memory_bytes - RESERVED_BYTES


@dataclass
class StageCost:
    """One stage of the plan, priced."""

    stage: int
    name: str
    kind: str
    tokens: int
    tokens_per_step: int
    steps: int
    flops_per_token: int
    memory: dict[str, float] | None = None
    recomputed_flops_per_token: int = 0  # activation checkpointing's second forward, priced beside ``flops_per_token``
    memory_bytes: float | None = None
    strategy: str | None = None  # a joint stage's: how it runs on the launch (``strategy_choice.Strategy.describe``)
    split: str | None = None  # a joint stage's: its global batch over the processes (``batches.StepSplit.describe``)
    tokens_per_s_per_gpu: float | None = None
    seconds: float | None = None
    saves: int = 0
    save_bytes: float = 0.0
    output: str | None = None  # what the stage writes at its end: "OUT (bfloat16)", "its checkpoint (float32)"
    output_bytes: float = 0.0
    teacher_state_bytes: float = 0.0  # a sequential stage's: the teacher's states it keeps for a later stage
    notes: list[str] = field(default_factory=list)
    # a sequential stage: its calibration tokens x epochs through each group of layers it trains together, in turn
    epochs: float | None = None
    groups: int | None = None  # the groups (a layer each, or ``window`` layers)
    window: int = 1
    uneven: bool = False  # some group holds fewer than ``window`` layers
    tokens_trained: int | None = None  # calibration tokens x the epochs of every group, summed

    def arithmetic(self) -> str:
        """What the stage trains, as a sum that holds as written: a joint stage's tokens are whole steps; a sequential
        stage's calibration tokens pass ``epochs`` times through each group of layers in turn, in whole steps (the
        last of an epoch may be short)."""
        steps = f"{self.steps:,} steps x {self.tokens_per_step:,} tokens"
        if self.tokens_trained is None:
            return f"{self.tokens:,} tokens = {steps}"
        epochs = f"{self.epochs:g} epoch{'' if self.epochs == 1 else 's'}"
        groups = (f"{self.groups} layer{'' if self.groups == 1 else 's'}" if self.window == 1 else
                  f"{self.groups} window{'' if self.groups == 1 else 's'} of {'up to ' if self.uneven else ''}"
                  f"{self.window} layers")
        whole = self.steps * self.tokens_per_step == self.tokens_trained
        return (f"{self.tokens:,} tokens x {epochs} x {groups} in turn = {self.tokens_trained:,} tokens"
                + (f" = {steps}" if whole else f" in {self.steps:,} steps of up to {self.tokens_per_step:,} tokens"))


@dataclass
class RunPlan:
    """Every stage priced for one launch, and whether the run fits."""

    model: str
    layout: str
    launch: Launch
    stages: list[StageCost]
    refusal: str | None = None
    clock: PricedDevice | None = None  # what timed the stages (None: the launch's GPU is not known)

    @property
    def seconds(self) -> float | None:
        times = [stage.seconds for stage in self.stages]
        return None if any(t is None for t in times) else sum(times)

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "layout": self.layout, "launch": asdict(self.launch),
                "stages": [asdict(stage) for stage in self.stages], "seconds": self.seconds, "fits": self.refusal is None,
                "refusal": self.refusal, "assumed_mfu": {"joint": ASSUMED_MFU, "sequential": SEQUENTIAL_ASSUMED_MFU}}

    def disk_bytes(self) -> dict[str, float]:
        """The bytes the run writes, by target: OUT (the last stage's output), and the run folder (the earlier stages'
        checkpoints, the teacher states sequential stages keep, and one training state, the largest)."""
        earlier = sum(stage.output_bytes for stage in self.stages[:-1])
        kept = sum(stage.teacher_state_bytes for stage in self.stages)
        save = max((stage.save_bytes for stage in self.stages), default=0.0)
        return {"OUT": self.stages[-1].output_bytes if self.stages else 0.0, "the run folder": earlier + kept + save}

    def lines(self) -> list[str]:
        from ...progress import format_duration

        out = [f"dry run: {self.model} ({self.layout}) on {self.launch.describe()}; no weights read"]
        for stage in self.stages:
            head = (f"  {stage.stage}. {stage.name} ({stage.kind}): {stage.arithmetic()}, "
                    f"{stage.flops_per_token / 1e9:,.1f} GFLOP per token"
                    + (f" (+{stage.recomputed_flops_per_token / 1e9:,.1f} recomputed: activation checkpointing)"
                       if stage.recomputed_flops_per_token else ""))
            out.append(head)
            if stage.strategy is not None:
                out.append(f"     runs {stage.strategy}")
            if stage.split is not None:
                out.append(f"     {stage.split}")
            if stage.memory_bytes is not None:
                mem = JointMemory(**stage.memory).describe() if stage.memory else gib(stage.memory_bytes)
                cap = f" of {gib(usable_bytes(self.launch.memory_bytes))} usable" if self.launch.memory_bytes else ""
                out.append(f"     memory per GPU: {mem}{cap}")
            if stage.seconds is not None:
                out.append(f"     expected: {stage.tokens_per_s_per_gpu:,.0f} tokens/s per GPU, "
                           f"{format_duration(stage.seconds)}")
            if stage.saves:
                out.append(f"     saves: {stage.saves:,} training states of {gib(stage.save_bytes)} (trained layers and AdamW)")
            if stage.output is not None:
                kept = f" + the teacher's states for a later stage, {gib(stage.teacher_state_bytes)}" \
                    if stage.teacher_state_bytes else ""
                written = stage.output_bytes + stage.teacher_state_bytes
                out.append(f"     writes: {stage.output} {gib(stage.output_bytes)}{kept}: about "
                           f"{format_duration(written / DISK_BYTES_PER_S)} at {DISK_BYTES_PER_S / 1e9:g} GB/s")
            out.extend(f"     {note}" for note in stage.notes)
        if self.seconds is not None:
            out.append(f"  total: {format_duration(self.seconds)} on {self.launch.describe()} "
                       f"(at {ASSUMED_MFU:.0%} MFU for joint stages, {SEQUENTIAL_ASSUMED_MFU:.0%} for sequential ones)")
        out.append("  disk: free space needed, " + ", ".join(f"{what} {gib(count)}" for what, count in
                                                          self.disk_bytes().items())
                   + " (OUT and the run folder on one disk: their sum; checked before a run starts)")
        out.append("  fits" if self.refusal is None else f"  does not fit: {self.refusal}")
        return out


def plan_run(config: Any, layout_text: str, converted: list[int], stages: Sequence[PlannedStage], launch: Launch,
             model_name: str = "model", data_tokens: int | None = None) -> RunPlan:
    """Price the resolved (and sized) recipe ``stages`` for ``launch``, each stage timed by the one time model
    (``stage_clock.stages_seconds``) on the launch priced from afar (``PricedDevice``); ``data_tokens``: the tokens the
    data holds, where known (a stage reading stored teacher states runs no teacher layer). ``refusal`` names what to
    change where a stage does not fit."""
    from .batches import StepSplit
    from ..objectives.registry import parse_objectives
    from .sequential_schedule import reads_stored_teacher
    from .stage_clock import stages_seconds
    from .strategy_choice import choose_strategy

    priced, refusal = [], None
    usable = usable_bytes(launch.memory_bytes) if launch.memory_bytes else None
    clock = PricedDevice.of(config, converted, launch)
    times = stages_seconds(clock, stages, data_tokens) if clock is not None else [None] * len(stages)
    for index, (planned, seconds) in enumerate(zip(stages, times)):
        settings = planned.resolved
        weights = parse_objectives(settings.objective.objectives)
        seq_len, batch, accum = settings.training.seq_len, settings.training.batch_size, settings.training.grad_accum
        sequential = settings.sequential.local_schedule == "sequential"
        compute_bytes = 4 if settings.parallelism.dtype == "float32" else 2
        if sequential:
            stage = _sequential_cost(config, converted, planned, launch, seq_len, batch, compute_bytes, seconds)
        else:
            tokens_per_step, steps_n = settings.training.tokens_per_step, settings.training.steps  # the global batch
            stored = reads_stored_teacher(stages, index, data_tokens)
            count = FlopCount.for_stage(config, converted, weights, scope=settings.scope.train, stored_teacher=stored,
                                        checkpointing=bool(settings.parallelism.activation_checkpointing))
            strategy = choose_strategy(settings, launch)
            memory = JointMemory.for_step(config, converted, planned, launch.processes)
            stage = StageCost(planned.number, planned.name, "joint", steps_n * tokens_per_step, tokens_per_step, steps_n,
                              count.per_token, memory=asdict(memory), memory_bytes=memory.total,
                              recomputed_flops_per_token=count.executed_per_token - count.per_token,
                              save_bytes=12.0 * count.trained,  # fp32 weights and AdamW's two moments
                              strategy=strategy.describe(), split=StepSplit(batch, launch.processes, accum).describe())
            if stored:
                stage.notes.append("reads the teacher's states a sequential stage before it stores: the teacher's "
                                   "layers do not run")
            every = settings.saving.save_every
            if every:
                stage.saves = steps_n // every
            if clock is not None:
                stage.tokens_per_s_per_gpu = clock.tokens_per_s_per_gpu(planned, stored)
                stage.seconds = seconds
                if not every:  # a minute in, then every save_minutes (training_state.SaveClock)
                    minutes = settings.saving.save_minutes
                    stage.saves = max(1, math.ceil(stage.seconds / (60 * minutes)))
            if usable is not None and memory.total > usable and refusal is None:
                refusal = _joint_advice(config, converted, launch, planned, memory, usable)
        _price_writes(stage, config, stages, index, launch.processes)
        priced.append(stage)
        if usable is not None and sequential and stage.memory_bytes and stage.memory_bytes > usable and refusal is None:
            refusal = (f"stage {stage.stage} ({stage.name}) needs {gib(stage.memory_bytes)} per GPU, "
                       f"{gib(usable)} usable: store its states on disk (--states-on-disk) or give it fewer tokens")
    return RunPlan(model_name, layout_text, launch, priced, refusal, clock)


def _price_writes(stage: StageCost, config: Any, stages: Sequence[PlannedStage], index: int, processes: int) -> None:
    """What stage ``index`` writes at its end: OUT in its output dtype (by default the checkpoint's), or a checkpoint
    in float32 before the last stage (``recipe_run.py``), and a sequential stage's kept teacher states
    (``sequential_schedule.rows_read``: three ``[rows, S, D]`` float32 tensors)."""
    settings, shape = stages[index].resolved, _shape_of(config)
    last = index == len(stages) - 1
    dtype = (settings.saving.output_dtype or str(getattr(config, "dtype", None) or "float32").removeprefix("torch.")) \
        if last else "float32"
    stage.output = f"{'OUT' if last else 'its checkpoint'} ({dtype})"
    stage.output_bytes = float(shape.num_parameters * DTYPE_BYTES.get(dtype, 4))
    if settings.sequential.local_schedule == "sequential":
        stage.teacher_state_bytes = 3.0 * rows_read(stages, index, processes) * settings.training.seq_len * shape.hidden_size * 4


def _sequential_cost(config: Any, converted: list[int], planned: PlannedStage, launch: Launch, seq_len: int,
                     batch: int, compute_bytes: int, seconds: float | None) -> StageCost:
    """A sequential stage: the teacher's states cached once, then each layer (or window of layers) trained on them for
    ``epochs``, in the steps the stage runs (``sequential_schedule.window_steps``), taking ``seconds`` (None: not
    priced)."""
    from .sequential_schedule import state_copies, window_epochs, window_steps

    settings = planned.resolved
    shape = _shape_of(config)
    tokens, epochs, window = settings.training.tokens, settings.sequential.epochs, settings.sequential.window
    rows = max(1, tokens // seq_len)  # the calibration set: whole sequences
    batch = settings.training.step_rows(rows)
    tokens_per_step = seq_len * batch
    shares = window_epochs(converted, epochs, settings.sequential.epochs_ramp, window)
    steps_n = sum(window_steps(shares, rows, batch).values())
    trained = round(sum(shares.values()) * rows * seq_len)
    layer = layer_parameters(shape)
    flops = 6 * layer  # per token pass through one layer (the states are cached)
    states = 0.0 if settings.sequential.states == "disk" else state_copies(window) * shape.hidden_size * 4 * tokens
    memory = 16 * layer + states + batch * seq_len * activation_bytes_per_token(shape, compute_bytes)
    stage = StageCost(planned.number, planned.name, "sequential", rows * seq_len, tokens_per_step, steps_n, flops,
                      memory_bytes=memory, epochs=sum(shares.values()) / len(shares), groups=len(shares),
                      window=window, uneven=len(shares) * window != len(converted), tokens_trained=trained)
    # a resume's save: the window's layers with AdamW (fp32), and the states entering the next window, the teacher's
    # and the student's (two each: the residual and the stale one), every process its own rows (``sequential_run``)
    stage.save_bytes = 12.0 * layer * window + 4 * shape.hidden_size * 4 * tokens
    if seconds is not None:
        gpus = min(launch.processes, batch)  # a step's batch is split over the processes
        stage.seconds = seconds
        stage.tokens_per_s_per_gpu = tokens * epochs * len(converted) / stage.seconds / gpus
    if batch < launch.processes:
        stage.notes.append(f"its step's batch ({batch}) is split over the processes: {launch.processes - batch} of "
                           f"{launch.processes} wait (raise its batch_size to use them)")
    return stage


def _joint_advice(config: Any, converted: list[int], launch: Launch, stage: PlannedStage, memory: JointMemory,
                  usable: float) -> str:
    """One line: what the stage needs, and the changes that would make it fit, each priced for the strategy it would
    run with (``strategy_choice.choose_strategy``: more GPUs shard a stage that one GPU runs whole, not one that a setting
    keeps replicated)."""
    from .strategy_choice import choose_strategy, whole_weight_changes, whole_weight_settings

    settings = stage.resolved

    def fits(changed: PlannedStage, processes: int = launch.processes) -> JointMemory | None:
        priced = JointMemory.for_step(config, converted, changed, processes)
        return priced if priced.total <= usable else None

    def fewest_gpus(changed: PlannedStage) -> int | None:
        return next((n for n in (2, 4, 8, 16, 32, 64, 128) if n > launch.processes and fits(changed, n)), None)

    checked = stage.with_fields(ParallelismSettings, activation_checkpointing=True)
    fixes = []
    plain, checked_gpus = fewest_gpus(stage), fewest_gpus(checked)
    if plain is not None:
        extra = f" ({checked_gpus} with --activation-checkpointing)" if checked_gpus and checked_gpus < plain else ""
        fixes.append(f"at least {plain} GPUs{extra}")
    elif checked_gpus is not None:
        fixes.append(f"at least {checked_gpus} GPUs with --activation-checkpointing")
    if not settings.parallelism.activation_checkpointing and fits(checked):
        fixes.append("--activation-checkpointing")
    from .batches import StepSplit, dividing_accumulation

    batch, seq_len, processes = int(settings.training.batch_size), int(settings.training.seq_len), launch.processes
    local = StepSplit(batch, processes, int(settings.training.grad_accum)).local
    accumulated = JointMemory.largest_batch(config, converted, processes, seq_len, usable, most=local - 1,
                                            stage=stage.with_fields(TrainingSettings, grad_accum=max(2, int(settings.training.grad_accum))))
    divides = dividing_accumulation(batch, processes, -(-batch // (processes * accumulated))) if accumulated else None
    if divides:  # the same global batch in smaller micro-batches
        fixes.append(f"--grad-accum {divides} (the same batch of {batch}, {batch // (processes * divides)} per "
                     "process a micro-batch)")
    else:
        alone = JointMemory.largest_batch(config, converted, processes, seq_len, usable, most=local - 1,
                                          stage=stage.with_fields(TrainingSettings, grad_accum=1))
        if alone:
            fixes.append(f"--batch-size {alone * processes} without --grad-accum (fewer tokens per step: the "
                         "accumulated gradients do not fit beside it)")
    strategy = choose_strategy(settings, launch)
    if not strategy.shards and launch.processes > 1:
        unblocked = whole_weight_changes(settings)
        priced = fits(replace(stage, resolved=unblocked))
        if priced is not None and choose_strategy(unblocked, launch).shards:
            dropped = [entry.flag for entry in whole_weight_settings(settings)]
            dropped += [f"--shard {settings.parallelism.shard}"] if settings.parallelism.shard != "auto" else []
            fixes.append(f"without {' and '.join(dropped)} (then sharded: {gib(priced.total)})")
    advice = "; ".join(fixes) if fixes else "more GPUs or a GPU with more memory"
    return (f"stage {stage.number} ({stage.name}) needs {gib(memory.total)} per GPU on {launch.describe()} "
            f"({strategy.describe()}), {gib(usable)} usable: {advice}")
