"""Gemma-2 and Gemma-3: norms before and after both attention and MLP, tied embeddings, local/global layers.

Gemma-2 without `layer_types` slides on even layers; Gemma-3 on all but every
`sliding_window_pattern`-th (the generic rule).
"""

from __future__ import annotations

from kvcache.models.model_config import LayerKind, ModelConfig
from kvcache.models.decoder import (
    ModelSource, attention_layer_kinds, describe, num_layers, read_heads, standard_layers, weight_layout, window_for,
)
from kvcache.models.feed_forward import ffn_blocks
from kvcache.models.generic import attention_block, text_model_type

_NORMS = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm")


def read_gemma(src: ModelSource) -> ModelConfig:
    t = src.text
    model_type = text_model_type(src)
    heads, n = read_heads(t), num_layers(t)
    if t.has("layer_types", "sliding_window_pattern"):
        kinds = attention_layer_kinds(t, n)
    else:
        kinds = tuple[LayerKind, ...]("sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n))
    layers = standard_layers(attention_block(t, heads, model_type), ffn_blocks(t, heads.hidden, n, model_type=model_type),
                             heads.hidden, norms=_NORMS)
    weights = weight_layout(src, layers, heads.hidden, tied_default=True)
    return describe(src, kinds=kinds, heads=heads, weights=weights, sliding_window=window_for(t, kinds))
