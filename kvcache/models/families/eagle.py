"""EAGLE / EAGLE-3 draft heads: Llama-shaped decoder layer(s) fed by the target's hidden states.

EAGLE-3: `fc` fuses three target hidden states; the one layer attends over [embedding,
hidden] (q/k/v take 2 x hidden). Its configs say nothing about sharing the target's
embedding, so the head counts its own (a caller that shares passes include_embedding=False).
The lm_head is draft_vocab_size rows when given.
"""

from __future__ import annotations

import msgspec

from kvcache.models.model_config import ModelConfig
from kvcache.models.decoder import ModelSource, describe, read_heads, weight_layout
from kvcache.models.feed_forward import ffn_blocks
from kvcache.models.fields import MAX_VOCAB
from kvcache.models.generic import attention_block, read_generic, text_model_type
from kvcache.models.weight_blocks import Layer, Linear, Norm


def read_eagle(src: ModelSource) -> ModelConfig:
    """EAGLE-1/2 heads (LlamaForCausalLMEagle): a standard decoder marked as a draft head."""
    return msgspec.structs.replace(read_generic(src), is_draft_head=True)


def read_eagle3(src: ModelSource) -> ModelConfig:
    t = src.text
    heads = read_heads(t)
    hidden = heads.hidden
    attention = attention_block(t, heads, text_model_type(src), input_size=2 * hidden)
    (mlp,) = ffn_blocks(t, hidden, 1, model_type="llama")
    norm = Norm(hidden)
    layer = Layer((("fc", Linear(hidden, 3 * t.int("target_hidden_size", default=hidden), bias=t.flag("bias"))),
                   ("midlayer.input_layernorm", norm), ("midlayer.hidden_norm", norm), ("midlayer.self_attn", attention),
                   ("midlayer.post_attention_layernorm", norm), ("midlayer.mlp", mlp)))
    weights = weight_layout(src, (layer,), hidden, layer_prefix="", embed_name="embed_tokens", final_norm="norm",
                            lm_head_vocab=t.optional_int("draft_vocab_size", high=MAX_VOCAB))
    return describe(src, kinds=("full_attention",), heads=heads, weights=weights, is_draft_head=True)
