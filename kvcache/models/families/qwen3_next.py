"""Gated-delta-net hybrids: Qwen3-Next (every full_attention_interval-th layer is attention) and
Qwen3.5-style configs (`layer_types` naming linear_attention layers).

Attention layers are gated (q doubled for the output gate) with q/k norms; linear layers
keep a per-request conv window and a delta-rule state (see layer_specs).
"""

from __future__ import annotations

from kvcache.models.model_config import LayerKind, ModelConfig
from kvcache.models.decoder import (
    ModelSource,
    describe,
    ffn_blocks,
    listed_layer_kinds,
    mixed_layers,
    num_layers,
    read_heads,
    weight_layout,
)
from kvcache.models.fields import MAX_HEAD_DIM, MAX_HEADS, MAX_LAYERS, ConfigFields
from kvcache.models.generic import attention_block, text_model_type
from kvcache.models.weight_blocks import GatedDeltaNet

_KINDS = frozenset({"full_attention", "linear_attention"})


def gated_delta_net(t: ConfigFields, hidden: int) -> GatedDeltaNet:
    return GatedDeltaNet(hidden=hidden, key_heads=t.int("linear_num_key_heads", high=MAX_HEADS),
                         value_heads=t.int("linear_num_value_heads", high=MAX_HEADS),
                         key_dim=t.int("linear_key_head_dim", high=MAX_HEAD_DIM),
                         value_dim=t.int("linear_value_head_dim", high=MAX_HEAD_DIM),
                         conv_kernel=t.int("linear_conv_kernel_dim", high=64))


def linear_state_fields(gdn: GatedDeltaNet) -> dict[str, int]:
    """The cache fields of a delta-rule layer (gated delta net or KDA)."""
    return dict(linear_num_key_heads=gdn.key_heads, linear_num_value_heads=gdn.value_heads,
                linear_key_head_dim=gdn.key_dim, linear_value_head_dim=gdn.value_dim,
                linear_conv_kernel_dim=gdn.conv_kernel)


def _layer_kinds(t: ConfigFields, n: int) -> tuple[LayerKind, ...]:
    listed = listed_layer_kinds(t, n, allowed=_KINDS)
    if listed is not None:
        return listed
    interval = t.int("full_attention_interval", high=MAX_LAYERS)
    return tuple("full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n))


def read_qwen3_next(src: ModelSource) -> ModelConfig:
    t = src.text
    heads, n = read_heads(t), num_layers(t)
    kinds = _layer_kinds(t, n)
    attention = attention_block(t, heads, text_model_type(src), qk_norm=True,
                                gated=t.flag("attn_output_gate", default=True))
    gdn = gated_delta_net(t, heads.hidden)
    ffns = ffn_blocks(t, heads.hidden, n, model_type="qwen3_next")
    mixers = tuple(("self_attn", attention) if k == "full_attention" else ("linear_attn", gdn) for k in kinds)
    weights = weight_layout(src, mixed_layers(mixers, ffns, heads.hidden), heads.hidden)
    return describe(src, kinds=kinds, heads=heads, weights=weights, **linear_state_fields(gdn))
