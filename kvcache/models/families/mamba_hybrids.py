"""Mamba hybrids beyond Nemotron-H: Falcon-H1, Granite-4 hybrid, Bamba, Zamba-2 (Mamba-2) and Jamba (Mamba-1).

- Falcon-H1: every layer runs attention and Mamba-2 side by side (cache for both), then an MLP.
- Granite-4 hybrid (`layer_types` mamba/attention; linear_attention/full_attention as transformers 5
  saves them) and Bamba (`attn_layer_indices`): each layer is Mamba-2 or attention, then an MLP
  (Granite: MoE + shared expert).
- Zamba-2 (`layers_block_type` mamba/hybrid; transformers 5 writes mamba as linear_attention): hybrid layers add a shared attention block
  over [hidden, embedding], whose two weight copies (num_mem_blocks) are counted once.
- Jamba: attention every attn_layer_period-th layer (from attn_layer_offset), Mamba-1
  elsewhere; MoE every expert_layer_period-th layer. A Mamba-1 state is expressed as
  Mamba-2 heads of head_dim 1 and no groups (SGLang 0.5.23's full-rank shape).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from kvcache.models.model_config import LayerKind, ModelConfig
from kvcache.models.decoder import (
    Heads, ModelSource, describe, hidden_size, mixed_layers, num_layers, read_heads, weight_layout,
)
from kvcache.models.feed_forward import check_routing, experts_count, moe_block
from kvcache.models.families.nemotron_h import mamba2_cache_fields, mamba2_mixer
from kvcache.models.fields import (
    MAX_EXPERTS, MAX_HEAD_DIM, MAX_HEADS, MAX_LAYERS, ConfigFields, with_transformers5_names,
)
from kvcache.models.generic import attention_block, text_model_type
from kvcache.models.weight_blocks import (
    Attention,
    Block,
    GatedMLP,
    Layer,
    Linear,
    Mamba2Mixer,
    MoE,
    Norm,
    ParamSpec,
    Part,
    Shard,
    linear,
)
from kvcache.arithmetic import ceil_div


def _mamba2(t: ConfigFields, hidden: int) -> Mamba2Mixer:
    """Mamba-2 under the mamba_* names: heads x head_dim is mamba_d_ssm (or mamba_expand x hidden)."""
    heads = t.int("mamba_n_heads", "n_mamba_heads", high=MAX_HEADS)
    head_dim = t.optional_int("mamba_d_head", "mamba_headdim", high=MAX_HEAD_DIM)
    if head_dim is None:
        inner = t.int("mamba_d_ssm", default=t.int("mamba_expand", default=2, high=64) * hidden)
        if inner % heads:
            t.fail("mamba_n_heads", heads, f"a divisor of the Mamba width {inner}")
        head_dim = inner // heads
    elif t.has("mamba_d_ssm") and t.int("mamba_d_ssm") != heads * head_dim:  # both say how wide the state is
        t.fail("mamba_d_ssm", t.int("mamba_d_ssm"), f"mamba_n_heads x mamba_d_head = {heads} x {head_dim} = "
                                                    f"{heads * head_dim}")
    return mamba2_mixer(t, hidden, heads=heads, head_dim=head_dim)


def read_falcon_h1(src: ModelSource) -> ModelConfig:
    t = src.text
    heads, n = read_heads(t), num_layers(t)
    norm = Norm(heads.hidden)
    mamba = replace(_mamba2(t, heads.hidden), gated_norm=t.flag("mamba_rms_norm"))
    layer = Layer((("input_layernorm", norm), ("self_attn", attention_block(t, heads, text_model_type(src))),
                   ("mamba", mamba), ("pre_ff_layernorm", norm),
                   ("feed_forward", GatedMLP(heads.hidden, t.int("intermediate_size"), t.flag("mlp_bias")))))
    return describe(src, kinds=("attention_mamba2",) * n, heads=heads,
                    weights=weight_layout(src, (layer,) * n, heads.hidden), **mamba2_cache_fields(mamba))


def _ffn_granite(t: ConfigFields, hidden: int) -> Block:
    experts = experts_count(t)
    shared = t.int("shared_intermediate_size", default=0, low=0)
    if experts == 0:
        return GatedMLP(hidden, shared or t.int("intermediate_size"))
    check_routing(t, experts)
    return MoE(hidden, experts, t.int("intermediate_size"), shared_intermediate=shared, shared_name="shared_mlp")


def _mixer_of(mamba: Block, attention: Block) -> Callable[[LayerKind], Part]:
    """A Mamba-or-attention layer's (name, mixer) by its kind."""
    return lambda kind: ("mamba", mamba) if kind == "mamba2" else ("self_attn", attention)


def _either_or(src: ModelSource, kinds: tuple[LayerKind, ...], ffn: Block) -> ModelConfig:
    """Layers that are Mamba-2 or attention, each followed by the same MLP block."""
    t = src.text
    heads = read_heads(t)
    mamba = _mamba2(t, heads.hidden)
    mixer = _mixer_of(mamba, attention_block(t, heads, text_model_type(src)))
    layers = mixed_layers(tuple(map(mixer, kinds)), (ffn,) * len(kinds), heads.hidden)
    return describe(src, kinds=kinds, heads=heads, weights=weight_layout(src, layers, heads.hidden),
                    **mamba2_cache_fields(mamba))


# Granite-4 hybrid's layer_types (or its alias layers_block_type), under the older names and transformers 5's.
_GRANITE_KINDS: dict[str, LayerKind] = with_transformers5_names({"mamba": "mamba2", "attention": "full_attention"})


def read_granite_hybrid(src: ModelSource) -> ModelConfig:
    t = src.text
    n = num_layers(t)
    kinds = t.mapped_list("layer_types", "layers_block_type", table=_GRANITE_KINDS, length=n) or ("mamba2",) * n
    return _either_or(src, kinds, _ffn_granite(t, hidden_size(t)))


def read_bamba(src: ModelSource) -> ModelConfig:
    t = src.text
    n = num_layers(t)
    attention = set(t.int_list("attn_layer_indices", high=n - 1) or ())
    kinds = tuple[LayerKind, ...]("full_attention" if i in attention else "mamba2" for i in range(n))
    return _either_or(src, kinds, GatedMLP(hidden_size(t), t.int("intermediate_size")))


# Zamba-2's layers_block_type: transformers 5 saves its Mamba layers as linear_attention; hybrid stays hybrid.
_ZAMBA2_BLOCKS = with_transformers5_names({"mamba": "mamba", "hybrid": "hybrid"})


def read_zamba2(src: ModelSource) -> ModelConfig:
    t = src.text
    n = num_layers(t)
    types = t.mapped_list("layers_block_type", table=_ZAMBA2_BLOCKS, length=n)
    if types is None:
        t.fail("layers_block_type", types, f"one of 'mamba' / 'hybrid' per layer ({n})")
    hidden = hidden_size(t)
    heads_n = t.int("num_attention_heads", high=MAX_HEADS)
    head_dim = t.int("attention_head_dim", default=2 * hidden // heads_n, high=MAX_HEAD_DIM)
    heads = Heads(hidden, heads_n, t.int("num_key_value_heads", default=heads_n, high=MAX_HEADS), head_dim)
    mamba = _mamba2(t, hidden)
    norm = Norm(hidden)
    blocks = {"mamba": (("input_layernorm", norm), ("mamba", mamba)),
              "hybrid": (("input_layernorm", norm), ("mamba", mamba), ("linear", Linear(hidden, hidden)))}
    shared = Attention(hidden=hidden, heads=heads.heads, kv_heads=heads.kv_heads, head_dim=head_dim, input_size=2 * hidden)
    mlp = GatedMLP(hidden, t.int("intermediate_size"))
    copies = t.int("num_mem_blocks", default=1, high=MAX_LAYERS)
    made = {key: Layer(parts) for key, parts in blocks.items()}
    layers = tuple(made[x] for x in types)
    shared_parts = tuple(part for k in range(copies) for part in (
        (f"model.shared_transformer.{k}.input_layernorm", Norm(2 * hidden)), (f"model.shared_transformer.{k}.self_attn", shared),
        (f"model.shared_transformer.{k}.pre_ff_layernorm", norm), (f"model.shared_transformer.{k}.mlp", mlp)))
    weights = weight_layout(src, layers, hidden, front=shared_parts)
    kinds = tuple[LayerKind, ...]("attention_mamba2" if x == "hybrid" else "mamba2" for x in types)
    return describe(src, kinds=kinds, heads=heads, weights=weights, **mamba2_cache_fields(mamba))


@dataclass(frozen=True, slots=True)
class Mamba1Mixer:
    """Mamba-1: in_proj to [x, z], a depthwise conv over x, x_proj to [dt, B, C], dt_proj, A, D; Jamba adds weighted
    RMSNorms over dt, B and C (`bcdt_norms`), pure Mamba has none and Falcon-Mamba's carry no weight."""

    hidden: int
    inner: int
    state: int
    conv_kernel: int
    dt_rank: int
    bcdt_norms: bool = True
    conv_bias: bool = True
    proj_bias: bool = False

    def specs(self, name: str, shard: Shard) -> list[ParamSpec]:
        i = shard.split(self.inner)
        norms = (("dt_layernorm", self.dt_rank), ("b_layernorm", self.state), ("c_layernorm", self.state))
        return (linear(f"{name}.in_proj", 2 * i, self.hidden, bias=self.proj_bias)
                + [ParamSpec(f"{name}.conv1d.weight", (i, 1, self.conv_kernel))]
                + ([ParamSpec(f"{name}.conv1d.bias", (i,))] if self.conv_bias else [])
                + linear(f"{name}.x_proj", self.dt_rank + 2 * self.state, i)
                + linear(f"{name}.dt_proj", i, self.dt_rank, bias=True)
                + [ParamSpec(f"{name}.A_log", (i, self.state)), ParamSpec(f"{name}.D", (i,))]
                + ([ParamSpec(f"{name}.{n}.weight", (d,)) for n, d in norms] if self.bcdt_norms else [])
                + linear(f"{name}.out_proj", self.hidden, i, bias=self.proj_bias))


def read_jamba(src: ModelSource) -> ModelConfig:
    t = src.text
    heads, n = read_heads(t), num_layers(t)
    hidden = heads.hidden
    period = t.int("attn_layer_period", high=MAX_LAYERS)
    offset = t.int("attn_layer_offset", low=0, high=period - 1)  # layer i attends when i % period == offset
    kinds = tuple[LayerKind, ...]("full_attention" if i % period == offset else "mamba2" for i in range(n))
    inner = t.int("mamba_expand", default=2, high=64) * hidden
    state, conv = t.int("mamba_d_state", high=MAX_HEAD_DIM), t.conv_kernel("mamba_d_conv")
    mamba = Mamba1Mixer(hidden, inner, state, conv, t.int("mamba_dt_rank", default=ceil_div(hidden, 16)))
    experts = t.int("num_experts", default=1, high=MAX_EXPERTS)
    e_period = t.int("expert_layer_period", default=1, high=MAX_LAYERS)
    e_offset = t.int("expert_layer_offset", default=0, low=0, high=e_period - 1)
    dense = GatedMLP(hidden, t.int("intermediate_size"))
    moe = moe_block(t, hidden, experts, router_name="router") if experts > 1 else dense
    mixer = _mixer_of(mamba, attention_block(t, heads, text_model_type(src)))
    ffns = tuple(moe if i % e_period == e_offset else dense for i in range(n))
    layers = mixed_layers(tuple(map(mixer, kinds)), ffns, hidden, norms=("input_layernorm", "pre_ff_layernorm"),
                          ffn_name="feed_forward")
    return describe(src, kinds=kinds, heads=heads, weights=weight_layout(src, layers, hidden),
                    **mamba1_cache_fields(mamba))


def mamba1_cache_fields(m: Mamba1Mixer) -> dict[str, int]:
    """A Mamba-1 state as Mamba-2 heads of head_dim 1 and no groups (SGLang 0.5.23's full-rank shape)."""
    return dict(mamba_num_heads=m.inner, mamba_head_dim=1, ssm_state_size=m.state, mamba_n_groups=0,
                mamba_conv_kernel=m.conv_kernel)
