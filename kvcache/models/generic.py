"""The generic reader: any standard decoder (Llama, Mistral, Qwen2/3 and their MoE, Phi-3, GLM-4, Granite,
Cohere, OLMo, StarCoder2, ERNIE, Hunyuan, Seed-OSS...) without an entry of its own.

Standard means: GQA/MHA attention with K and V of head_dim per KV head, full or sliding
(or chunked) per layer, a dense or MoE MLP. Weight names follow Llama's; a family whose
checkpoint fuses or renames tensors still gets the same shapes and byte counts.
"""

from __future__ import annotations

from kvcache.models.model_config import ModelConfig
from kvcache.models.decoder import (
    Heads, ModelSource, attention_layer_kinds, describe, num_layers, read_heads, standard_layers, weight_layout, window_for,
)
from kvcache.models.feed_forward import ffn_blocks
from kvcache.models.fields import MAX_POSITIONS, ConfigFields
from kvcache.models.weight_blocks import Attention, Linear

# Families whose q/k/v carry a bias without saying so in the config, and o_proj none whatever attention_bias
# says (Qwen2 and its VL/MoE kin, MiMo).
_QKV_BIAS_TYPES = frozenset({"qwen2", "qwen2_moe", "qwen2_vl", "qwen2_5_vl", "mimo"})
# Families whose o_proj has no bias whatever attention_bias says (GLM-4-0414: q/k/v only).
_NO_O_BIAS_TYPES = frozenset({"glm4"})
# Families with per-head q/k RMSNorms over head_dim.
_QK_NORM_TYPES = frozenset({"qwen3", "qwen3_moe", "qwen3_vl", "qwen3_vl_moe", "gemma3"})
# GPT-2-style families: biases everywhere and learned absolute positions, which their configs do not state.
_GPT2_TYPES = frozenset({"gpt2", "gpt_bigcode"})
# Families whose configs omit tie_word_embeddings because their default is to tie.
_TIED_BY_DEFAULT = frozenset({"gemma", "gemma2", "gemma3", "gpt2", "gpt_bigcode", "starcoder2",
                              "cohere", "cohere2", "opt", "bloom"})


def attention_block(f: ConfigFields, heads: Heads, model_type: str, *, input_size: int | None = None,
                    **flags: bool) -> Attention:
    """Attention weights from the config's bias and norm switches (and the family's unstated defaults)."""
    bias = f.flag("attention_bias", "bias", "use_bias") or model_type in _GPT2_TYPES
    qkv_bias = bias or f.flag("qkv_bias", "use_qkv_bias", "add_qkv_bias") or model_type in _QKV_BIAS_TYPES
    qk_norm = f.flag("use_qk_norm", "qk_layernorm") or model_type in _QK_NORM_TYPES
    o_bias = (f.flag("attention_out_bias") if f.has("attention_out_bias")  # Seed-OSS states o_proj's apart
              else bias and model_type not in _QKV_BIAS_TYPES | _NO_O_BIAS_TYPES)
    settings = {"qkv_bias": qkv_bias, "o_bias": o_bias, "qk_norm": qk_norm, **flags}
    return Attention(hidden=heads.hidden, heads=heads.heads, kv_heads=heads.kv_heads, head_dim=heads.head_dim,
                     input_size=input_size or heads.hidden, **settings)


def text_model_type(src: ModelSource) -> str:
    """The language model's family: its section's model_type (text_config's for wrapped configs), less the `_text`
    that transformers puts on a wrapper's language-model class (qwen2_vl_text, qwen3_vl_text, gemma3_text), whose
    unstated biases and norms are its family's."""
    return src.text.text("model_type", default=src.model_type).removesuffix("_text")


def read_generic(src: ModelSource) -> ModelConfig:
    """Any standard decoder: attention per layer_types / sliding rules, dense or MoE MLPs, Llama names."""
    t = src.text
    model_type = text_model_type(src)
    heads, n = read_heads(t), num_layers(t)
    kinds = attention_layer_kinds(t, n)
    score_bias = t.text("topk_method", default="") == "noaux_tc"
    ffns = ffn_blocks(t, heads.hidden, n, model_type=model_type, score_bias=score_bias)
    layers = standard_layers(attention_block(t, heads, model_type), ffns, heads.hidden)
    positions = (("model.embed_positions", Linear(t.int("n_positions", "max_position_embeddings", high=MAX_POSITIONS),
                                                  heads.hidden)),) if model_type in _GPT2_TYPES else ()
    weights = weight_layout(src, layers, heads.hidden, tied_default=model_type in _TIED_BY_DEFAULT, front=positions)
    chunk = t.int("attention_chunk_size", high=MAX_POSITIONS) if "chunked_attention" in kinds else None
    return describe(src, kinds=kinds, heads=heads, weights=weights, sliding_window=window_for(t, kinds),
                    attention_chunk_size=chunk)
