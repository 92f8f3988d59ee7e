"""vLLM model for ladderize checkpoints: dense, ladder, SPD and hybrid layouts under vLLM's tensor parallelism.

The layer loop is ``ladderize/model/residual.py``'s ``ResidualStream`` running ``Layout.program()``
(``ladderize/model/layout.py``), the same interpreter as the HF model and the TP runtime: it owns the
order of reads, all-reduces and adds. This file supplies only the kernels (``_VllmKernels``) and the
reduction (``_SyncAllReduce``, or the overlapped ``_OverlappedAllReduce``). Nothing here re-derives
what a mode means.

Every ``o_proj`` and ``down_proj`` is a ``RowParallelLinear`` with ``reduce_results=False`` and
``skip_bias_add=True``: it returns this rank's partial sum, and the interpreter places the all-reduce
(and adds the bias once) itself:

    dense / ladder module:  r_k = r_{k-1} + (AllReduce(f_k(norm_k(r_{reads}))) + bias)
    SPD block (input X):    Y_r = Attn_r(LN1(X)) W_O[r];  Z_r = MLP_r(LN2(X + Y_r (+ o_bias)))  (block.spd_share)
                            out = X + ((AllReduce(Y_r + Z_r) + o_bias) + down_bias): one all-reduce

The classes are named ``Vllm*`` (the HF model's are ``Ladder*``); the architecture registered with
vLLM is still ``LadderLlamaForCausalLM`` (``plugin.ARCHITECTURE``).

An SPD layer needs vLLM's rank r to hold ladderize's SPD head group r:
vLLM gives rank r the contiguous query/KV heads, so ``load_weights`` permutes the q/k/v rows and
o_proj columns of a layer with an ``spd_head_order`` (a relabelling of heads, which leaves the
layer's function unchanged) and the TP degree must equal the checkpoint's ``spd_tp_size``.

Communication: synchronous all-reduce (vLLM's own, on CPU its shared-memory communicator) is the
validated path. ``LADDERIZE_VLLM_OVERLAP=1`` on CUDA in eager mode enables an overlapped variant for
the all-reduces the program marks ``overlaps_next`` (a side stream running vLLM's all-reduce while
the next module computes). It is UNVALIDATED: it has never run on a GPU (none was available when it
was written), and it is refused everywhere else.

torch.compile: see ``COMPILED_LADDER_VALIDATED`` and ``FUNCTIONAL_LINEARS_WHEN_COMPILED`` below, and
docs/serving.md.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import torch
from torch import nn
from vllm.compilation.decorators import support_torch_compile
from vllm.config import CompilationMode, VllmConfig
from vllm.distributed import (
    get_pp_group,
    get_tensor_model_parallel_world_size,
    tensor_model_parallel_all_reduce,
)
from vllm.logger import init_logger
from vllm.model_executor.layers.activation import SiluAndMul
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.linear import LinearBase, MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from vllm.model_executor.layers.rotary_embedding import get_rope
from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding
from vllm.model_executor.models.llama import LlamaForCausalLM, LlamaModel
from vllm.model_executor.models.utils import (
    AutoWeightsLoader,
    make_empty_intermediate_tensors_factory,
)
from vllm.platforms import current_platform
from vllm.sequence import IntermediateTensors

from ladderize.model.block import permute_attention
from ladderize.model.layout import Layout, ModuleKind, ModuleOp, rank_query_heads
from ladderize.model.residual import ResidualStream
from ladderize.checkpoint.shapes import head_dim_of
from ladderize.runtime.vllm.plugin import check_parallel

logger = init_logger("vllm.ladderize")  # under "vllm." so that vLLM's log handler prints it

# Whether a model with ladder layers may run under vLLM's torch.compile. True only together with a test
# that proves compiled == eager for ladder layouts: tests/runtime/vllm/test_vllm_parity.py compiles a ladder
# and a hybrid model on every CI run and fails if this flag is True while their outputs differ.
# It holds because of the workaround below (FUNCTIONAL_LINEARS_WHEN_COMPILED), and only on CPU, where the
# tests run: on other platforms (CUDA) layouts with ladder layers stay eager until a test there proves them.
COMPILED_LADDER_VALIDATED = True

# torch 2.13's inductor drops the dependency between a custom op that writes into a preallocated
# output (vLLM's CPU GEMM ``_C.onednn_mm(Tensor(a!) c, ...)``, called on ``torch.empty``) and a fused
# pointwise reader of that output: it may fuse the reader into a kernel that runs *before* the GEMM.
# A dense layout never exposes it (the next norm needs r_k at once), but in the ladder flow the
# residual update r_k = r_{k-1} + y_k is needed only a module later, gets fused into the kernel that
# computes norm(r_{k-1}), and reads y_k's buffer before it is written: wrong tokens at TP=1.
# Standalone reproducer (plain torch, no vLLM): lab/repro_inductor_mutated_output_fusion.py;
# details in docs/serving.md. Workaround: when this model is compiled on CPU with ladder or SPD
# layers, its linear layers use vLLM's plain ``F.linear`` path (``_cpu_skip_gemm_dispatch``), which
# inductor lowers to functional ``mm``/``addmm`` with correct dependencies.
FUNCTIONAL_LINEARS_WHEN_COMPILED = True

OVERLAP_ENV = "LADDERIZE_VLLM_OVERLAP"


def layout_of(config) -> Layout:
    return Layout.from_config(config)


def compile_allowed(vllm_config: VllmConfig) -> bool:
    """``support_torch_compile``'s ``enable_if``: ladder layouts compile only once validated."""
    layout = layout_of(vllm_config.model_config.hf_config)
    if any(mode.reads_stale_residual for mode in layout.modes) and not (COMPILED_LADDER_VALIDATED and current_platform.is_cpu()):
        # validated on CPU only (the tests run there); on other platforms the compiled ladder flow is untested
        logger.warning(
            "ladderize: layout %s has ladder layers; they run eager (torch.compile is off for this model) because "
            "the compiled ladder path is not validated on this platform",
            layout.describe(),
        )
        return False
    return True


class VllmLadderAttention(nn.Module):
    """Llama attention that returns this rank's ``o_proj`` partial (no all-reduce, no bias)."""

    def __init__(self, config, cache_config, quant_config, prefix: str):
        super().__init__()
        tp = get_tensor_model_parallel_world_size()
        hidden = config.hidden_size
        self.total_num_heads = config.num_attention_heads
        self.total_num_kv_heads = config.num_key_value_heads
        self.num_heads = self.total_num_heads // tp
        self.num_kv_heads = max(1, self.total_num_kv_heads // tp)
        self.head_dim = head_dim_of(config)
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        out_bias = getattr(config, "attention_out_bias", None)
        self.qkv_proj = QKVParallelLinear(
            hidden, self.head_dim, self.total_num_heads, self.total_num_kv_heads,
            bias=bool(config.attention_bias), quant_config=quant_config, prefix=f"{prefix}.qkv_proj",
        )
        self.o_proj = RowParallelLinear(
            self.total_num_heads * self.head_dim, hidden,
            bias=bool(config.attention_bias if out_bias is None else out_bias), quant_config=quant_config,
            reduce_results=False, skip_bias_add=True, prefix=f"{prefix}.o_proj",
        )
        self.rotary_emb = get_rope(
            self.head_dim, max_position=getattr(config, "max_position_embeddings", 8192),
            rope_parameters=getattr(config, "rope_parameters", None), is_neox_style=True,
        )
        self.attn = Attention(
            self.num_heads, self.head_dim, self.head_dim**-0.5, num_kv_heads=self.num_kv_heads,
            cache_config=cache_config, quant_config=quant_config, prefix=f"{prefix}.attn",
        )

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        qkv, _ = self.qkv_proj(hidden_states)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = self.rotary_emb(positions, q, k)
        partial, _ = self.o_proj(self.attn(q, k, v))
        return partial


class VllmLadderMLP(nn.Module):
    """SwiGLU MLP that returns this rank's ``down_proj`` partial (no all-reduce, no bias)."""

    def __init__(self, config, quant_config, prefix: str):
        super().__init__()
        if config.hidden_act != "silu":
            raise ValueError(f"ladderize: unsupported activation {config.hidden_act!r}; only silu is supported")
        bias = bool(getattr(config, "mlp_bias", False))
        self.gate_up_proj = MergedColumnParallelLinear(
            config.hidden_size, [config.intermediate_size] * 2, bias=bias, quant_config=quant_config,
            prefix=f"{prefix}.gate_up_proj",
        )
        self.down_proj = RowParallelLinear(
            config.intermediate_size, config.hidden_size, bias=bias, quant_config=quant_config,
            reduce_results=False, skip_bias_add=True, prefix=f"{prefix}.down_proj",
        )
        self.act_fn = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, _ = self.gate_up_proj(x)
        partial, _ = self.down_proj(self.act_fn(x))
        return partial


class VllmLadderDecoderLayer(nn.Module):
    """The parameters of one layer (Llama's names); ``_VllmKernels`` runs its modules of the program."""

    def __init__(self, vllm_config: VllmConfig, prefix: str):
        super().__init__()
        config = vllm_config.model_config.hf_config
        self.self_attn = VllmLadderAttention(config, vllm_config.cache_config, vllm_config.quant_config, f"{prefix}.self_attn")
        self.mlp = VllmLadderMLP(config, vllm_config.quant_config, f"{prefix}.mlp")
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)


class _VllmKernels:
    """``residual.ModuleKernels`` of this rank under vLLM: its partials (norm included) and the biases,
    which the ``RowParallelLinear``s leave out (``skip_bias_add``) for ``ResidualStream`` to add once."""

    __slots__ = ("layers", "positions")

    def __init__(self, layers: nn.ModuleList, positions: torch.Tensor):
        self.layers, self.positions = layers, positions

    def attention(self, op: ModuleOp, h: torch.Tensor) -> torch.Tensor:
        layer = self.layers[op.layer]
        return layer.self_attn(self.positions, layer.input_layernorm(h))

    def mlp(self, op: ModuleOp, h: torch.Tensor) -> torch.Tensor:
        layer = self.layers[op.layer]
        return layer.mlp(layer.post_attention_layernorm(h))

    def bias(self, op: ModuleOp) -> torch.Tensor | None:
        layer = self.layers[op.layer]
        return layer.self_attn.o_proj.bias if op.kind is ModuleKind.ATTENTION else layer.mlp.down_proj.bias

    def spd_attention(self, op: ModuleOp, h: torch.Tensor) -> list[torch.Tensor]:
        return [self.attention(op, h)]  # this rank's SPD head group: one share

    def spd_mlp(self, op: ModuleOp, h: torch.Tensor, share: int) -> torch.Tensor:
        return self.mlp(op, h)


class _SyncAllReduce:
    """``residual.Reduction``: vLLM's all-reduce, synchronous (the validated path)."""

    def __init__(self, tp: int):
        self.tp = tp

    def start(self, partial: torch.Tensor, overlap: bool) -> torch.Tensor:
        return tensor_model_parallel_all_reduce(partial) if self.tp > 1 else partial

    def wait(self, handle: torch.Tensor) -> torch.Tensor:
        return handle


class _OverlappedAllReduce:
    """UNVALIDATED (never run on a GPU): ``residual.Reduction`` that runs vLLM's all-reduce on a CUDA side
    stream when the program lets it overlap the next module, joined before its result is read."""

    def __init__(self):
        self.stream = torch.cuda.Stream()

    def start(self, partial: torch.Tensor, overlap: bool):
        if not overlap:
            return tensor_model_parallel_all_reduce(partial), False
        main = torch.cuda.current_stream()
        self.stream.wait_stream(main)
        with torch.cuda.stream(self.stream):
            reduced = tensor_model_parallel_all_reduce(partial)
        return reduced, True

    def wait(self, handle) -> torch.Tensor:
        reduced, on_side_stream = handle
        if on_side_stream:
            main = torch.cuda.current_stream()
            main.wait_stream(self.stream)
            reduced.record_stream(main)
        return reduced


def overlap_requested(vllm_config: VllmConfig) -> bool:
    if os.environ.get(OVERLAP_ENV, "0") != "1":
        return False
    if not torch.cuda.is_available() or not vllm_config.model_config.enforce_eager:
        raise ValueError(
            f"ladderize: {OVERLAP_ENV}=1 needs CUDA (NCCL on a side stream) and enforce_eager=True; "
            "on this platform the ladder all-reduces run synchronously (unset it)"
        )
    logger.warning("ladderize: %s=1: overlapped ladder all-reduce on a CUDA side stream is UNVALIDATED", OVERLAP_ENV)
    return True


@support_torch_compile(
    dynamic_arg_dims={
        "input_ids": {0: "b"}, "positions": {0: "b"}, "intermediate_tensors": {0: "b"}, "inputs_embeds": {0: "b"},
    },
    enable_if=compile_allowed,
)
class VllmLadderLlamaModel(nn.Module):
    """Embeddings, the mode-program layer loop, the final norm."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "", **_):
        super().__init__()
        config = vllm_config.model_config.hf_config
        self.config = config
        self.layout = layout_of(config)
        self.tp = get_tensor_model_parallel_world_size()
        check_parallel(self.layout, self.tp, get_pp_group().world_size)  # also checked before start-up
        self.program = self.layout.program()
        self.vocab_size = config.vocab_size
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size, quant_config=vllm_config.quant_config)
        self.layers = nn.ModuleList(
            [VllmLadderDecoderLayer(vllm_config, f"{prefix}.layers.{i}") for i in range(config.num_hidden_layers)]
        )
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.make_empty_intermediate_tensors = make_empty_intermediate_tensors_factory(
            ["hidden_states", "residual"], config.hidden_size
        )
        if self._compiled(vllm_config) and FUNCTIONAL_LINEARS_WHEN_COMPILED and self.layout.converted_layers:
            if current_platform.is_cpu():
                for module in self.layers.modules():
                    if isinstance(module, LinearBase):
                        module._cpu_skip_gemm_dispatch = True  # see FUNCTIONAL_LINEARS_WHEN_COMPILED
                logger.info("ladderize: compiled on CPU: linear layers use F.linear (works around an inductor "
                            "fusion bug with vLLM's out-variant oneDNN GEMM; see docs/serving.md)")
        self.overlap = _OverlappedAllReduce() if self.tp > 1 and overlap_requested(vllm_config) else None
        self.reduction = self.overlap or _SyncAllReduce(self.tp)
        counts = self.layout.allreduces_per_token()
        logger.info(
            "ladderize: serving layout %s at TP=%d: %d all-reduces per token (%d overlappable; %s); torch.compile %s",
            self.layout.describe(), self.tp, counts["total"], counts["overlappable"],
            "overlapped on a side stream, UNVALIDATED" if self.overlap else "run synchronously",
            "on" if self._compiled(vllm_config) else "off",
        )

    @staticmethod
    def _compiled(vllm_config: VllmConfig) -> bool:
        return vllm_config.compilation_config.mode != CompilationMode.NONE and compile_allowed(vllm_config)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors: IntermediateTensors | None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The program through ``residual.ResidualStream`` (the HF model's and the runtime's interpreter)."""
        stream = ResidualStream(inputs_embeds if inputs_embeds is not None else self.embed_input_ids(input_ids))
        kernels = _VllmKernels(self.layers, positions)
        for op in self.program:
            stream.run(op, kernels, self.reduction)
        return self.norm(stream.resolve())

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return AutoWeightsLoader(self).load_weights(weights, mapper=LlamaModel.hf_to_vllm_mapper)


def permute_spd_heads(weights: Iterable[tuple[str, torch.Tensor]], config) -> Iterable[tuple[str, torch.Tensor]]:
    """Reorder the heads of layers with an ``spd_head_order`` so vLLM's rank r holds SPD head group r.

    New KV head p is source KV head ``order[p]``; its query heads follow it (GQA groups stay
    together), and ``o_proj``'s input columns move with the query heads. A relabelling of heads:
    the layer's function is unchanged, only which rank holds which head.
    """
    layout = layout_of(config)
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = head_dim_of(config)
    orders = {}
    for layer in range(layout.num_layers):
        order = layout.head_order(layer, kv_heads)
        if order != list(range(kv_heads)):
            orders[layer] = (order, rank_query_heads(order, heads, kv_heads))
    for name, tensor in weights:
        parts = name.split(".")
        if orders and "layers" in parts and "self_attn" in parts:
            layer = int(parts[parts.index("layers") + 1])
            if layer in orders:
                tensor = permute_attention(name, tensor, *orders[layer], head_dim)
        yield name, tensor


class VllmLadderLlamaForCausalLM(LlamaForCausalLM):
    """``LlamaForCausalLM`` (LM head, logits, weight names) over the ladderize layer loop."""

    def _init_model(self, vllm_config: VllmConfig, prefix: str = "", layer_type=None):
        return VllmLadderLlamaModel(vllm_config=vllm_config, prefix=prefix)

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors: IntermediateTensors | None = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return self.model(input_ids, positions, intermediate_tensors, inputs_embeds)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return super().load_weights(permute_spd_heads(weights, self.config))
