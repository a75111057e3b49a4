"""DBRX (databricks/dbrx-base, dbrx-instruct): an MoE decoder whose config nests attention and FFN settings.

The top level names the sizes MosaicML's way (d_model, n_heads, n_layers, max_seq_len; transformers maps
hidden_size, num_attention_heads, num_hidden_layers, max_position_embeddings onto them, so a config that
gives both must give one value). `attn_config` holds kv_n_heads (1 when absent, as transformers' and SGLang
0.5.23's DbrxAttentionConfig default it), clip_qkv and rope_theta; `ffn_config` holds ffn_hidden_size,
moe_num_experts and moe_top_k. transformers 5 saves the same model with num_key_value_heads at the top and
ffn_config.hidden_size (each must agree), and a top-level rope_parameters its DBRX never reads (the
attention's base stays attn_config.rope_theta). Every layer: a bias-free LayerNorm, GQA attention (the checkpoint fuses
q/k/v into one Wqkv: the same bytes), a second LayerNorm, then GLU experts (w1, v1, w2) behind a router;
no dense MLP and no shared expert. The cache is a plain full-attention one: kv_n_heads x head_dim
(d_model / n_heads) for K and for V on every layer.
"""

from __future__ import annotations

from kvcache.models.decoder import Heads, ModelSource, describe, hidden_size, num_layers, weight_layout
from kvcache.models.fields import MAX_EXPERTS, MAX_HEADS, ConfigFields
from kvcache.models.model_config import ModelConfig
from kvcache.models.weight_blocks import Attention, Layer, MoE, Norm

# DBRX's own name for each size, and the transformers name that aliases it.
_ALIASES = (("d_model", "hidden_size"), ("n_heads", "num_attention_heads"), ("n_layers", "num_hidden_layers"),
            ("max_seq_len", "max_position_embeddings"))


def _one_value_per_size(t: ConfigFields) -> None:
    """A size stated under both its DBRX and its transformers name must be one number."""
    for own, alias in _ALIASES:
        if t.has(own):
            t.repeats(alias, t.raw[own], f"the value '{t.path}{own}' gives")


def _required_section(t: ConfigFields, name: str, holds: str) -> ConfigFields:
    section = t.section(name)
    if section is None:
        t.fail(name, None, f"an object with {holds}")
    return section


def _heads(t: ConfigFields, attn: ConfigFields) -> Heads:
    hidden = hidden_size(t)
    heads = t.int("n_heads", "num_attention_heads", high=MAX_HEADS)
    if hidden % heads:
        t.fail("n_heads", heads, f"a divisor of d_model ({hidden}): DBRX's head_dim is d_model / n_heads")
    kv_heads = attn.int("kv_n_heads", default=1, high=heads)
    if heads % kv_heads:
        attn.fail("kv_n_heads", kv_heads, f"a divisor of n_heads ({heads})")
    t.repeats("num_key_value_heads", kv_heads, "attn_config.kv_n_heads",  # transformers 5 repeats it at the top
              read=lambda name: t.int(name, high=MAX_HEADS))
    return Heads(hidden=hidden, heads=heads, kv_heads=kv_heads, head_dim=hidden // heads)


def _experts(t: ConfigFields, ffn: ConfigFields, hidden: int) -> MoE:
    experts = ffn.int("moe_num_experts", high=MAX_EXPERTS)
    ffn.int("moe_top_k", high=experts)  # each token's experts: at most the experts there are
    width = ffn.optional_int("hidden_size")  # newer transformers repeat d_model here
    if width is not None and width != hidden:
        ffn.fail("hidden_size", width, f"d_model ({hidden}): the experts read the model's hidden states")
    return MoE(hidden, experts, ffn.int("ffn_hidden_size"), router_name="router.layer")


def read_dbrx(src: ModelSource) -> ModelConfig:
    t = src.text
    _one_value_per_size(t)
    attn = _required_section(t, "attn_config", "kv_n_heads, clip_qkv and rope_theta")
    ffn = _required_section(t, "ffn_config", "ffn_hidden_size, moe_num_experts and moe_top_k")
    heads, n = _heads(t, attn), num_layers(t)
    attn.number("clip_qkv", default=1.0)  # clips activations; no byte depends on it, but it must be a number
    norm = Norm(heads.hidden)
    attention = Attention(hidden=heads.hidden, heads=heads.heads, kv_heads=heads.kv_heads, head_dim=heads.head_dim,
                          input_size=heads.hidden)
    layer = Layer((("norm_attn_norm.norm_1", norm), ("norm_attn_norm.attn", attention),
                   ("norm_attn_norm.norm_2", norm), ("ffn", _experts(t, ffn, heads.hidden))))
    weights = weight_layout(src, (layer,) * n, heads.hidden, embed_name="transformer.wte",
                            final_norm="transformer.norm_f", layer_prefix="transformer.blocks.{i}.")
    return describe(src, kinds=("full_attention",) * n, heads=heads, weights=weights,
                    rope_theta=attn.number("rope_theta", default=10_000.0))
