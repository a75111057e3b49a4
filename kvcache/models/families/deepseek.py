"""DeepSeek-V2/V3, Kimi-K2 (MLA) and DeepSeek-V3.2 (MLA + the sparse-attention indexer).

MLA caches one latent of kv_lora_rank + qk_rope_head_dim per token per layer. V3.2's
indexer (present when the config has `index_topk`) adds one fp8 key of index_head_dim
per token per layer with a float32 scale per 128 values, as SGLang 0.5.23 sizes it; indexer
settings that make SGLang size that key cache otherwise are refused (`refuse_unmodelled_indexer`).
Dense MLPs for the first first_k_dense_replace layers, MoE after; NEXTN (MTP) layers
are numbered after the main ones, as in the checkpoint.
"""

from __future__ import annotations

from kvcache.models.model_config import INDEX_SCALE_BLOCK, ModelConfig
from kvcache.models.decoder import (
    Heads, ModelSource, describe, hidden_size, num_layers, standard_layers, weight_layout, with_mtp,
)
from kvcache.models.feed_forward import ffn_blocks
from kvcache.models.fields import MAX_HEAD_DIM, MAX_HEADS, MAX_LAYERS, ConfigFields
from kvcache.models.weight_blocks import Indexer, Layer, Linear, MLAttention, Norm
from kvcache.models.generic import text_model_type


def refuse_unmodelled_indexer(t: ConfigFields) -> None:
    """Refuse the indexer settings that change SGLang 0.5.23's key cache and are not modelled here: pooled keys
    (`index_kpool` > 1 divides each token's key bytes) and layers that reuse the previous layer's top-k (they keep
    no key). Which layers reuse is decided as SGLang decides it: `indexer_types` ("shared") when given, else
    `cli_factor` > 1, else `index_topk_pattern` ("S"), else `index_topk_freq` > 1; only the deciding field counts."""
    every_layer = ("every layer computes its own top-k and keeps its own indexer key (layers that reuse another's "
                   "top-k, which SGLang gives no key, are not modelled)")
    kpool = t.int("index_kpool", default=1, high=MAX_LAYERS)
    if kpool != 1:
        t.fail("index_kpool", kpool, "1: one indexer key per token (pooled keys, index_kpool > 1, are not modelled)")
    if t.flag("index_kpool_compress"):
        t.fail("index_kpool_compress", True, "false: compressed indexer key pools are not modelled")
    if _no_layer_shares(t, "indexer_types", "shared", every_layer):
        return  # a per-layer list decides for every layer: SGLang reads nothing after it
    cli_factor = t.int("cli_factor", default=1, high=MAX_LAYERS)
    if cli_factor != 1:
        t.fail("cli_factor", cli_factor, f"1: {every_layer}")
    if _no_layer_shares(t, "index_topk_pattern", "S", every_layer):
        return
    freq = t.int("index_topk_freq", default=1, high=MAX_LAYERS)
    if freq != 1:
        t.fail("index_topk_freq", freq, f"1: {every_layer}")


def _no_layer_shares(t: ConfigFields, name: str, shared: str, every_layer: str) -> bool:
    """Whether the per-layer list `name` is given (then it decides); refused when a layer in it is `shared`."""
    listed = t.raw.get(name)
    if listed is None:
        return False
    if not isinstance(listed, (str, list)):
        t.fail(name, listed, "a string or a list, one entry per layer")
    if shared in listed:
        t.fail(name, listed, f"no '{shared}' entry: {every_layer}")
    return True


def mla_attention(t: ConfigFields, hidden: int, heads: int) -> MLAttention:
    """The MLA block, with V3.2's indexer when `index_topk` is set."""
    q_rank = t.optional_int("q_lora_rank", high=hidden)  # latents compress the hidden state: never wider
    indexer = None
    if t.has("index_topk"):
        t.int("index_topk")
        refuse_unmodelled_indexer(t)
        if q_rank is None:
            t.fail("q_lora_rank", None, "a positive integer: the sparse-attention indexer reads the q latent")
        index_dim = t.int("index_head_dim", high=MAX_HEAD_DIM)
        if index_dim % INDEX_SCALE_BLOCK:
            t.fail("index_head_dim", index_dim, f"a multiple of {INDEX_SCALE_BLOCK}, the indexer's fp8 scale block")
        indexer = Indexer(hidden, q_rank, t.int("index_n_heads", high=MAX_HEADS), index_dim)
    return MLAttention(hidden=hidden, heads=heads, nope_dim=t.int("qk_nope_head_dim", high=MAX_HEAD_DIM),
                       rope_dim=t.int("qk_rope_head_dim", high=MAX_HEAD_DIM), v_dim=t.int("v_head_dim", high=MAX_HEAD_DIM),
                       kv_lora_rank=t.int("kv_lora_rank", high=hidden), q_lora_rank=q_rank, indexer=indexer)


def mla_cache_fields(attn: MLAttention) -> dict[str, int | None]:
    """What the cache needs of an MLA layer: the latent, the rope part, and the indexer key (V3.2)."""
    return dict(kv_lora_rank=attn.kv_lora_rank, qk_rope_head_dim=attn.rope_dim,
                index_head_dim=attn.indexer.head_dim if attn.indexer else None)


def read_deepseek(src: ModelSource) -> ModelConfig:
    t = src.text
    hidden, n = hidden_size(t), num_layers(t)
    heads = t.int("num_attention_heads", high=MAX_HEADS)
    attn = mla_attention(t, hidden, heads)
    score_bias = t.text("topk_method", default="") == "noaux_tc" or text_model_type(src) == "deepseek_v3"
    ffns = ffn_blocks(t, hidden, n, model_type="deepseek", score_bias=score_bias)
    layers = standard_layers(attn, ffns, hidden)
    norm = Norm(hidden)
    nextn = t.int("num_nextn_predict_layers", default=0, low=0, high=MAX_LAYERS)
    # an MTP layer: its own input norms and projection around a copy of the last decoder layer
    mtp = Layer((("enorm", norm), ("hnorm", norm), ("eh_proj", Linear(hidden, 2 * hidden)), *layers[-1].parts,
                 ("shared_head.norm", norm)))
    weights = weight_layout(src, layers, hidden)
    qk_dim = attn.nope_dim + attn.rope_dim
    model = describe(src, kinds=("mla",) * n, heads=Heads(hidden, heads, heads, qk_dim), weights=weights,
                     v_head_dim=attn.v_dim, **mla_cache_fields(attn))
    return with_mtp(model, (mtp,) * nextn, ("mla",) * nextn)
