"""Ladder / Sync-Point-Drop Llama: one causal LM whose decoder layers each have a mode.

The layer loop carries two residual states: ``residual`` (r_{k-1}, the complete stream)
and ``stale`` (the state before it). Each layer runs its two ``ModuleOp``s of the mode program
(``layout.module_program``) through ``residual.ResidualStream``, the interpreter the TP runtime
and vLLM use too; on one device every rank's share is present, so the sum is already complete.
Module k of a layer reads

    dense:  norm_k(residual)          r_k = r_{k-1} + f_k(norm_k(r_{k-1}))
    ladder: norm_k(stale)             r_k = r_{k-1} + f_k(norm_k(r_{k-2})),  r_{-1} = r_0

An SPD block (TP degree N, rank r owning head group r and MLP shard r) computes, from its
input X = r_{k-1}:

    Y_r = Attn_r(LN1(X)) @ W_O[r]
    Z_r = MLP_r(LN2(X + Y_r))
    out = X + sum_r (Y_r + Z_r)

and leaves ``stale = X``: a ladder module after an SPD block reads the state that exists
before the block's single all-reduce completes. Parameter names are Llama's, so a dense
Llama checkpoint loads unchanged.

The block math (rotary, heads, the partial attention and MLP of a head group, the SPD block)
lives in ``block.py``, shared with the TP runtime's rank model. A layer mode's meaning is a
row of ``layout.MODE_TRAITS``; the order of its reads and adds is ``residual.py``'s; this file
supplies only the kernels (``_LayerKernels``). Norms stay transformers' ``LlamaRMSNorm`` (see
``block.rms_norm``). This file, ``block.py``, ``residual.py``, the configuration and ``layout.py``
need only torch and transformers, so they travel with a checkpoint (``auto_map``).
"""

from __future__ import annotations

import inspect
import shutil
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
import transformers
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache, DynamicCache
from transformers.masking_utils import create_causal_mask
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.llama.modeling_llama import (
    LlamaModel,
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
    eager_attention_forward,
)

from .block import attention_partial, fold_rotary_sign, mlp_partial, rotate, split_heads
from .configuration_ladder_llama import LadderLlamaConfig
from .layout import (
    LayerMode,
    Layout,
    LayoutError,
    ModuleKind,
    format_layer_ranges,
    module_program,
    rank_kv_heads,
    rank_query_heads,
)
from .residual import ResidualStream, layer_program

# The KV cache's names: transformers calls it ``past_key_values`` up to 5.23 and ``cache`` from 5.24 on, as
# an argument (forward, ``create_causal_mask``, ``generate``'s model inputs) and as an output field. The
# name in use is the one transformers' own ``LlamaModel.forward`` declares, so this file follows it; a
# transformers that names it otherwise is refused when this file loads, not run with a cache nobody reads.
CACHE_NAMES = ("cache", "past_key_values")


def _installed_cache_name() -> str:
    declared = inspect.signature(LlamaModel.forward).parameters
    for name in CACHE_NAMES:
        if name in declared:
            return name
    raise ImportError(
        f"ladderize's model does not know this transformers' KV cache argument: LlamaModel.forward takes "
        f"none of {', '.join(CACHE_NAMES)} (transformers {transformers.__version__})"
    )


CACHE = _installed_cache_name()


def take_cache(kwargs: dict) -> Cache | None:
    """Pop the KV cache from a forward's keyword arguments, under whichever of ``CACHE_NAMES`` the caller used
    (transformers' ``generate``, peft, a user's script on either side of the rename)."""
    given = [kwargs.pop(name) for name in CACHE_NAMES if name in kwargs]
    given = [cache for cache in given if cache is not None]
    if len(given) > 1:
        raise ValueError(f"pass the KV cache once, as `{CACHE}`, not under both of {', '.join(CACHE_NAMES)}")
    return given[0] if given else None


class LadderAttention(nn.Module):
    """Grouped-query self-attention that can stop before ``o_proj`` (SPD needs the per-head outputs)."""

    def __init__(self, config: LadderLlamaConfig, layer_idx: int):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.num_key_value_groups = config.num_attention_heads // config.num_key_value_heads
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_dropout
        self.is_causal = True
        # an attention function of transformers' signature in place of the config's (adapt's compiled CPU training
        # sets ``adapt.causal_attention.training_attention``); None: ``config._attn_implementation``'s
        self.attention_function: Callable | None = None
        qkv_bias = config.attention_bias
        self.q_proj = nn.Linear(config.hidden_size, config.num_attention_heads * self.head_dim, bias=qkv_bias)
        self.k_proj = nn.Linear(config.hidden_size, config.num_key_value_heads * self.head_dim, bias=qkv_bias)
        self.v_proj = nn.Linear(config.hidden_size, config.num_key_value_heads * self.head_dim, bias=qkv_bias)
        self.o_proj = nn.Linear(
            config.num_attention_heads * self.head_dim, config.hidden_size, bias=config.attention_out_bias
        )

    def heads(self, hidden_states: torch.Tensor, **kwargs) -> torch.Tensor:
        """Attention output of every head before ``o_proj``: ``[B, S, H * head_dim]``."""
        return self.heads_and_weights(hidden_states, **kwargs)[0]

    def heads_and_weights(
        self,
        hidden_states: torch.Tensor,  # [B, S, D]
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attention output of every head before ``o_proj`` ``[B, S, H * head_dim]``, and the attention
        probabilities ``[B, H, S, S_kv]`` where the attention implementation returns them (eager), else None.
        The KV cache, if any, comes in ``kwargs`` under either name (``take_cache``)."""
        input_shape = hidden_states.shape[:-1]
        cache = take_cache(kwargs)
        query, key, value = self.projections(hidden_states, position_embeddings)
        if cache is not None:
            key, value = cache.update(key, value, self.layer_idx)
        attention: Callable = self.attention_function or ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, eager_attention_forward
        )
        output, weights = attention(
            self,
            query,
            key,
            value,
            attention_mask,
            dropout=0.0 if not self.training else self.attention_dropout,
            scaling=self.scaling,
            **kwargs,
        )
        return output.reshape(*input_shape, -1).contiguous(), weights

    def projections(
        self, hidden_states: torch.Tensor, position_embeddings: tuple[torch.Tensor, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Query ``[B, H, S, hd]`` and key ``[B, K, S, hd]`` with rotary applied, and value ``[B, K, S, hd]``.

        ``position_embeddings`` is ``(cos, sin_signed)`` [B, S, hd], as ``LadderLlamaModel.layer_kwargs``
        gives it (``block.fold_rotary_sign``).
        """
        cos, sin = position_embeddings
        query = rotate(split_heads(self.q_proj(hidden_states), self.head_dim), cos, sin)  # [B, S, H, hd]
        key = rotate(split_heads(self.k_proj(hidden_states), self.head_dim), cos, sin)  # [B, S, K, hd]
        value = split_heads(self.v_proj(hidden_states), self.head_dim)
        return query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)

    def attention_maps(
        self, hidden_states: torch.Tensor, position_embeddings: tuple[torch.Tensor, torch.Tensor]
    ) -> torch.Tensor:
        """Causal attention probabilities of every query head on a whole sequence: ``[B, H, S, S]``.

        SPD head grouping compares heads by these maps; they come from the same projections
        and rotary as the forward pass.
        """
        query, key, _ = self.projections(hidden_states, position_embeddings)
        key = key.repeat_interleave(self.num_key_value_groups, dim=1)
        scores = query @ key.transpose(-1, -2) * self.scaling
        length = scores.shape[-1]
        causal = torch.ones(length, length, dtype=torch.bool, device=scores.device).tril()
        return scores.masked_fill(~causal, float("-inf")).softmax(-1)

    def o_proj_inputs(self) -> int:
        return base_linear(self.o_proj).in_features

    def forward(self, hidden_states: torch.Tensor, **kwargs) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(o_proj(heads), attention probabilities or None)``, as Llama's attention returns them."""
        heads, weights = self.heads_and_weights(hidden_states, **kwargs)
        return self.o_proj(heads), weights


class LadderMLP(nn.Module):
    """SwiGLU MLP; ``partial`` evaluates one column shard of the intermediate dimension."""

    def __init__(self, config: LadderLlamaConfig):
        super().__init__()
        hidden, inner, bias = config.hidden_size, config.intermediate_size, config.mlp_bias
        self.gate_proj = nn.Linear(hidden, inner, bias=bias)
        self.up_proj = nn.Linear(hidden, inner, bias=bias)
        self.down_proj = nn.Linear(inner, hidden, bias=bias)
        self.act_fn = ACT2FN[config.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))

    def partial(self, x: torch.Tensor, shard: slice, down_constant: torch.Tensor | None = None) -> torch.Tensor:
        """This shard's contribution to ``down_proj`` (without its constant term): one TP rank's MLP.

        A wrapped ``down_proj`` runs on the zero-padded slice, less ``down_constant`` (``constant_term``;
        computed here when not given)."""
        gate, up = column_shard(self.gate_proj, x, shard), column_shard(self.up_proj, x, shard)
        if is_plain_linear(self.down_proj):
            return mlp_partial(gate, up, self.down_proj.weight[:, shard], self.act_fn)
        inner = base_linear(self.down_proj).in_features
        padded = F.pad(self.act_fn(gate) * up, (shard.start, inner - shard.stop))  # [B, S, I], zero off the slice
        return linear_part(self.down_proj, padded, down_constant)


def is_plain_linear(module: nn.Module) -> bool:
    """A bare ``nn.Linear``: SPD slices its weight per rank. Any other module (a peft wrapper: LoRA, DoRA,
    IA3, LoHa, LoKr, ...) is called whole on each rank's input, so whatever it adds is in effect."""
    return type(module) is nn.Linear


def base_linear(module: nn.Module) -> nn.Module:
    """The ``nn.Linear`` under any wrappers (peft keeps it as ``base_layer``)."""
    while hasattr(module, "base_layer"):
        module = module.base_layer
    return module


def constant_term(module: nn.Module, like: torch.Tensor) -> torch.Tensor | None:
    """What an affine module adds to every input: its bias (``nn.Linear``), or ``module(0)`` for a wrapper
    (IA3 scales the bias, LoRA may add its own). ``like`` gives dtype and device."""
    if is_plain_linear(module):
        return module.bias
    return module(like.new_zeros(1, 1, base_linear(module).in_features))


def linear_part(module: nn.Module, x: torch.Tensor, constant: torch.Tensor | None = None) -> torch.Tensor:
    """``module(x) - module(0)``: an affine module's output without its constant term (exact where it has none).
    ``constant``: ``constant_term(module, x)`` when the caller has it already."""
    constant = constant_term(module, x) if constant is None else constant
    return module(x) if constant is None else module(x) - constant


def column_shard(module: nn.Module, x: torch.Tensor, rows: slice) -> torch.Tensor:
    """``module(x)[..., rows]``: a bare ``nn.Linear`` computes only those rows; a wrapper runs whole."""
    if is_plain_linear(module):
        return F.linear(x, module.weight[rows], _bias_rows(module, rows))
    return module(x)[..., rows]


def _bias_rows(linear: nn.Linear, rows: slice | torch.Tensor) -> torch.Tensor | None:
    return None if linear.bias is None else linear.bias[rows]


class LadderDecoderLayer(GradientCheckpointingLayer):
    """A Llama decoder layer: its two ``ModuleOp``s of the mode program, run by ``residual.ResidualStream``."""

    def __init__(self, config: LadderLlamaConfig, layer_idx: int):
        super().__init__()
        layout = config.layout
        # Re-wrap in this module's enum: under trust_remote_code, transformers may load the config's
        # copy of layout.py as a different module than ours, and enum identity checks would fail.
        self.mode = LayerMode(layout.modes[layer_idx].value)
        # This layer's two modules of the mode program, and the states the stream holds when it starts, numbered
        # from the layer's start: layers of one kind compile to one graph (residual.layer_program)
        self.attn_op, self.mlp_op, self.entry_slots = layer_program(module_program(layout.modes), layer_idx)
        self.layer_idx = layer_idx
        self.self_attn = LadderAttention(config, layer_idx)
        self.mlp = LadderMLP(config)
        self.input_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        if self.mlp_op.reads_local_partial:
            self.spd_groups = _spd_groups(config, layout, layer_idx, self.self_attn.head_dim)

    def forward(
        self,
        residual: torch.Tensor,  # r_{k-1}, [B, S, D]
        stale: torch.Tensor,  # r_{k-2}, [B, S, D]
        output_attentions: bool = False,
        **attn_kwargs,
    ) -> tuple[torch.Tensor, ...]:
        """Return the new ``(residual, stale)`` pair after this layer's two modules, and with
        ``output_attentions`` the attention probabilities (None unless the implementation gives them).

        ``residual`` is what Llama's layer returns (``output[0]``, as transformers 4's layers put it);
        ``stale`` travels as an output, not a side channel: a ladder layer after this one reads it, and
        reentrant gradient checkpointing (transformers 4's default) keeps gradients only through outputs.
        One device holds every rank's share, so the sum over ranks is already complete (``residual.COMPLETE``).
        """
        stream = ResidualStream(residual, stale, self.entry_slots)
        kernels = _LayerKernels(self, dict(attn_kwargs, output_attentions=True) if output_attentions else attn_kwargs)
        stream.run(self.attn_op, kernels)
        stream.run(self.mlp_op, kernels)
        out = (stream.resolve(), stream.prev)
        return out + (kernels.attention_weights,) if output_attentions else out

    def _spd_groups_on(self, device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor, slice]]:
        """Per head group: its ``o_proj`` input columns, a mask of the other groups' columns, and its MLP slice."""
        cached = getattr(self, "_spd_groups_cache", None)
        if cached is None or cached[0] != device:
            width = self.self_attn.o_proj_inputs()
            groups = []
            for cols, shard in self.spd_groups:
                columns = torch.tensor(cols, dtype=torch.long, device=device)
                others = torch.ones(width, dtype=torch.bool, device=device).index_fill_(0, columns, False)
                groups.append((columns, others, shard))
            self._spd_groups_cache = cached = (device, groups)
        return cached[1]


class _LayerKernels:
    """``residual.ModuleKernels`` of one ``LadderDecoderLayer`` on one device.

    Dense and ladder modules return the module's whole output, bias included (``nn.Linear``, as
    transformers' Llama computes it: bit-identical), so ``bias`` is None for them. An SPD block
    holds every head group's share (``block.attention_partial`` of its ``o_proj`` columns, and
    ``LadderMLP.partial`` of its intermediate slice); its biases are added once, after the sum.
    A bare ``nn.Linear`` is sliced; any other module (a peft wrapper) is called on the group's input
    (``column_shard``, ``linear_part``), so an adapter is exact in SPD as its merged weights would be:
    peft's Linear adapters are affine in their input, and dropout falls on each group's own inputs.
    """

    __slots__ = ("layer", "attn_kwargs", "attention_weights", "constants")

    def __init__(self, layer: LadderDecoderLayer, attn_kwargs: dict):
        self.layer, self.attn_kwargs = layer, attn_kwargs
        self.attention_weights: torch.Tensor | None = None
        self.constants: dict[str, torch.Tensor | None] = {}  # constant_term of o_proj / down_proj, once a forward

    def constant(self, name: str) -> torch.Tensor | None:
        """``constant_term`` of the layer's ``o_proj`` or ``down_proj`` (computed once per forward)."""
        if name not in self.constants:
            layer = self.layer
            module = layer.self_attn.o_proj if name == "o_proj" else layer.mlp.down_proj
            self.constants[name] = constant_term(module, layer.input_layernorm.weight)
        return self.constants[name]

    def attention(self, op, h: torch.Tensor) -> torch.Tensor:
        layer = self.layer
        output, self.attention_weights = layer.self_attn(layer.input_layernorm(h), **self.attn_kwargs)
        return output

    def mlp(self, op, h: torch.Tensor) -> torch.Tensor:
        return self.layer.mlp(self.layer.post_attention_layernorm(h))

    def bias(self, op) -> torch.Tensor | None:
        if not (op.reads_local_partial or (op.kind is ModuleKind.ATTENTION and not op.allreduce)):
            return None  # inside the module's own output
        return self.constant("down_proj" if op.kind is ModuleKind.MLP else "o_proj")

    def spd_attention(self, op, h: torch.Tensor) -> list[torch.Tensor]:
        """Every head group's ``Y_r``: the heads once, then each group's ``o_proj`` columns (a bare
        ``nn.Linear``), or ``o_proj`` called on the heads with the other groups' columns zeroed (a wrapper)."""
        layer = self.layer
        heads, self.attention_weights = layer.self_attn.heads_and_weights(layer.input_layernorm(h), **self.attn_kwargs)
        o_proj, groups = layer.self_attn.o_proj, layer._spd_groups_on(heads.device)
        if is_plain_linear(o_proj):
            return [attention_partial(heads.index_select(-1, columns), o_proj.weight.index_select(1, columns))
                    for columns, _, _ in groups]
        constant = self.constant("o_proj")
        return [linear_part(o_proj, heads.masked_fill(others, 0.0), constant) for _, others, _ in groups]

    def spd_mlp(self, op, h: torch.Tensor, share: int) -> torch.Tensor:
        layer = self.layer
        shard = layer._spd_groups_on(h.device)[share][2]
        down_constant = None if is_plain_linear(layer.mlp.down_proj) else self.constant("down_proj")
        return layer.mlp.partial(layer.post_attention_layernorm(h), shard, down_constant)


def _spd_groups(
    config: LadderLlamaConfig, layout: Layout, layer: int, head_dim: int
) -> list[tuple[list[int], slice]]:
    """Per SPD rank: the o_proj input columns of its heads and its MLP intermediate slice."""
    tp = layout.spd_tp_size
    order = layout.head_order(layer, config.num_key_value_heads)
    inner = config.intermediate_size // tp
    groups = []
    for rank in range(tp):
        q_heads = rank_query_heads(rank_kv_heads(order, tp, rank), config.num_attention_heads, config.num_key_value_heads)
        columns = [h * head_dim + d for h in q_heads for d in range(head_dim)]
        groups.append((columns, slice(rank * inner, (rank + 1) * inner)))
    return groups


def check_transformers_tensor_parallel(layout: Layout, tp_size: int) -> None:
    """Refuse transformers' tensor parallelism (``tp_plan``) of ``tp_size`` ranks for a layout with layers whose
    attention output is not all-reduced (``attention_allreduce`` false): transformers' plan all-reduces every
    ``o_proj``, while such a layer keeps each rank's attention partial local until its MLP's all-reduce.
    ``LayoutError`` in one line that names ladderize's runtime, which runs them."""
    local = [layer for layer, mode in enumerate(layout.modes) if not mode.traits.attention_allreduce]
    if tp_size > 1 and local:
        raise LayoutError(
            f"transformers' tensor parallelism (tp_plan) cannot run this model ({layout.describe()}): layers "
            f"{format_layer_ranges(local)} keep each rank's attention output local until the MLP's all-reduce, "
            "where transformers' plan all-reduces every attention output; run it under tensor parallelism with "
            "ladderize's runtime (`ladderize bench`, `ladderize generate`: ladderize.runtime), or without tp_plan "
            "on one device"
        )


COMPANION_FILES = ("README.md", "ladderize.json")  # the model card and the provenance of a ladderize checkpoint


class LadderLlamaPreTrainedModel(PreTrainedModel):
    """Saves (``save_pretrained``, ``push_to_hub``, ``Trainer.save_model``) keep ladderize's model card and
    provenance beside the weights: ``companion_writer`` builds them where ladderize is installed (it sets it:
    ``checkpoint/io.write_companion_files``); under remote code alone the loaded folder's two files are copied.
    transformers' tensor parallelism (``tp_plan``) is refused where a layer's attention output stays local
    (``check_transformers_tensor_parallel``)."""

    companion_writer: Callable[[LadderLlamaConfig, Path | None, Path], None] | None = None
    config_class = LadderLlamaConfig
    config: LadderLlamaConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["LadderDecoderLayer"]
    _skip_keys_device_placement = [CACHE]
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    _supports_attention_backend = True
    _can_compile_fullgraph = True  # every layout's forward is one graph (tests/model/test_torch_compile.py)

    def _resolve_parallel_plans(self, distributed_config, *args, **kwargs):
        # from_pretrained(tp_plan=...) resolves the plans after building the model, before reading any weight
        check_transformers_tensor_parallel(self.config.layout, getattr(distributed_config, "tp_size", 1) or 1)
        return super()._resolve_parallel_plans(distributed_config, *args, **kwargs)

    def save_pretrained(self, save_directory, *args, **kwargs) -> None:
        """``PreTrainedModel.save_pretrained``, then the model card and provenance (``write_companions``)."""
        super().save_pretrained(save_directory, *args, **kwargs)
        self.write_companions(save_directory)

    def _upload_modified_files(self, working_dir, *args, **kwargs):
        # push_to_hub saves, then writes transformers' template card over README.md, then uploads: put ours back.
        self.write_companions(working_dir)
        return super()._upload_modified_files(working_dir, *args, **kwargs)

    def write_companions(self, directory: str | Path) -> None:
        """Write the model card and provenance into ``directory``, from the folder this model was loaded from."""
        source = Path(self.name_or_path) if self.name_or_path and Path(self.name_or_path).is_dir() else None
        writer = type(self).companion_writer
        if writer is not None:
            writer(self.config, source, Path(directory))
            return
        for name in COMPANION_FILES if source is not None else ():
            if (source / name).is_file() and (source / name).resolve() != (Path(directory) / name).resolve():
                shutil.copyfile(source / name, Path(directory) / name)


class LadderLlamaModel(LadderLlamaPreTrainedModel):
    """Embeddings, the mode-aware layer loop, and the final norm."""

    def __init__(self, config: LadderLlamaConfig):
        super().__init__(config)
        self.padding_idx = config.pad_token_id
        self.vocab_size = config.vocab_size
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, self.padding_idx)
        self.layers = nn.ModuleList([LadderDecoderLayer(config, i) for i in range(config.num_hidden_layers)])
        self.norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = LlamaRotaryEmbedding(config=config)
        self.gradient_checkpointing = False
        self.post_init()

    def layer_kwargs(
        self,
        inputs_embeds: torch.Tensor,  # [B, S, D]
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        **kwargs,
    ) -> dict:
        """The keyword arguments every decoder layer receives: rotary tables, causal mask, and the cache under
        transformers' name for it (``CACHE``: gradient checkpointing looks for it there).

        ``position_embeddings`` is ``(cos, sin_signed)`` (``block.fold_rotary_sign``): the form ``block.rotate`` takes.
        """
        if position_ids is None:
            past_seen = cache.get_seq_length() if cache is not None else 0
            position_ids = (torch.arange(inputs_embeds.shape[1], device=inputs_embeds.device) + past_seen).unsqueeze(0)
        causal_mask = create_causal_mask(
            config=self.config,
            inputs_embeds=inputs_embeds,
            attention_mask=attention_mask,
            position_ids=position_ids,
            **{CACHE: cache},
        )
        return dict(
            position_embeddings=fold_rotary_sign(*self.rotary_emb(inputs_embeds, position_ids=position_ids)),
            attention_mask=causal_mask,
            **{CACHE: cache},
            **kwargs,
        )

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        *,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPast | tuple:
        """Llama's forward. The KV cache comes as a keyword, ``cache`` or ``past_key_values`` (``take_cache``),
        and returns in the output field transformers names (``CACHE``); the arguments after ``position_ids``
        are keyword-only, so that a cache passed by position fails instead of being read as something else."""
        cache = take_cache(kwargs)
        if (input_ids is None) ^ (inputs_embeds is not None):
            raise ValueError("You must specify exactly one of input_ids or inputs_embeds")
        use_cache = self.config.use_cache if use_cache is None else use_cache
        output_hidden_states = _flag(output_hidden_states, self.config, "output_hidden_states")
        output_attentions = _flag(output_attentions, self.config, "output_attentions")
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)  # [B, S, D]
        if use_cache and cache is None:
            cache = DynamicCache(config=self.config)
        attn_kwargs = self.layer_kwargs(inputs_embeds, attention_mask, position_ids, cache, **kwargs)
        residual = stale = inputs_embeds  # r_0 and r_{-1} = r_0
        all_hidden = [residual] if output_hidden_states else None
        all_attentions = [] if output_attentions else None
        for layer in self.layers:
            if all_attentions is not None:
                residual, stale, weights = layer(residual, stale, output_attentions=True, **attn_kwargs)
                all_attentions.append(weights)
            else:
                residual, stale = layer(residual, stale, **attn_kwargs)
            if all_hidden is not None:
                all_hidden.append(residual)
        hidden = self.norm(residual)
        if all_hidden is not None:
            all_hidden[-1] = hidden
        outputs = BaseModelOutputWithPast(
            last_hidden_state=hidden,
            **{CACHE: cache if use_cache else None},
            hidden_states=tuple(all_hidden) if all_hidden is not None else None,
            attentions=tuple(all_attentions) if all_attentions is not None else None,
        )
        return outputs if _flag(return_dict, self.config, "return_dict") else outputs.to_tuple()


class LadderLlamaForCausalLM(LadderLlamaPreTrainedModel, GenerationMixin):
    """Causal LM head over ``LadderLlamaModel``; drop-in for ``LlamaForCausalLM``."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    # Llama's: the head is split on the vocabulary as the embedding it is tied to (``embedding_rowwise``)
    _tp_plan = {"lm_head": "colwise_gather_output"}
    _pp_plan = {"lm_head": (["hidden_states"], ["logits"])}

    def __init__(self, config: LadderLlamaConfig):
        super().__init__(config)
        self.model = LadderLlamaModel(config)
        self.vocab_size = config.vocab_size
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    @property
    def layout(self) -> Layout:
        return self.config.layout

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        *,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        return_dict: bool | None = None,
        **kwargs,
    ) -> CausalLMOutputWithPast | tuple:
        """Llama's causal-LM forward; the KV cache as in ``LadderLlamaModel.forward``."""
        cache = take_cache(kwargs)
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            **{CACHE: cache},
            use_cache=use_cache,
            output_hidden_states=output_hidden_states,
            output_attentions=output_attentions,
            return_dict=True,
            **kwargs,
        )
        hidden = outputs.last_hidden_state
        keep = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        logits = self.lm_head(hidden[:, keep, :])
        loss = None
        if labels is not None:
            loss = self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs)
        result = CausalLMOutputWithPast(
            loss=loss,
            logits=logits,
            **{CACHE: getattr(outputs, CACHE)},
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )
        return result if _flag(return_dict, self.config, "return_dict") else result.to_tuple()


def _flag(value: bool | None, config: LadderLlamaConfig, name: str) -> bool:
    """A forward's ``output_*`` / ``return_dict`` argument, or the config's default when it is None."""
    return bool(getattr(config, name, name == "return_dict")) if value is None else value


__all__ = ["LadderLlamaForCausalLM", "LadderLlamaModel", "LadderLlamaPreTrainedModel"]
