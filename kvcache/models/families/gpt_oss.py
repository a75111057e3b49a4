"""gpt-oss: biased attention with per-head sinks; biased experts behind a biased router named `router`."""

from __future__ import annotations

from kvcache.models.model_config import ModelConfig
from kvcache.models.decoder import (
    ModelSource, attention_layer_kinds, describe, num_layers, read_heads, standard_layers, weight_layout, window_for,
)
from kvcache.models.feed_forward import moe_block
from kvcache.models.fields import MAX_EXPERTS
from kvcache.models.generic import attention_block, text_model_type


def read_gpt_oss(src: ModelSource) -> ModelConfig:
    t = src.text
    heads, n = read_heads(t), num_layers(t)
    kinds = attention_layer_kinds(t, n)
    attention = attention_block(t, heads, text_model_type(src), qkv_bias=True, o_bias=True, sinks=True)
    experts = moe_block(t, heads.hidden, t.int("num_local_experts", "num_experts", high=MAX_EXPERTS), router_name="router", router_bias=True,
                        expert_bias=True)
    layers = standard_layers(attention, (experts,) * n, heads.hidden)
    return describe(src, kinds=kinds, heads=heads, weights=weight_layout(src, layers, heads.hidden),
                    sliding_window=window_for(t, kinds))
