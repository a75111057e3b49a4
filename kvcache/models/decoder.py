"""What every decoder config shares: the source being read, attention heads, layer kinds, MLP/MoE blocks.

Readers (the generic one and each family's) are built from these pieces, so an alias or a
rule (head_dim defaults to hidden / heads; Qwen2 slides from max_window_layers) is stated
once for every family.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import msgspec

from kvcache.models.model_config import LayerKind, ModelConfig
from kvcache.models.fields import MAX_EXPERTS, MAX_HEAD_DIM, MAX_HEADS, MAX_LAYERS, MAX_POSITIONS, MAX_VOCAB, ConfigFields
from kvcache.models.weight_blocks import Block, GatedMLP, Layer, MoE, Norm, Part, PlainMLP
from kvcache.models.quantization import Quantization, read_quantization
from kvcache.models.weights_layout import WeightLayout
from kvcache.arithmetic import ceil_div

LAYER_ALIASES = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
HIDDEN_ALIASES = ("hidden_size", "n_embd", "d_model", "model_dim")
INTERMEDIATE_ALIASES = ("intermediate_size", "ffn_hidden_size", "n_inner", "ffn_dim")


@dataclass(frozen=True, slots=True)
class ModelSource:
    """The config being read: the whole file, the language model's section, and the labels for messages."""

    top: ConfigFields
    text: ConfigFields
    architecture: str
    model_type: str
    raw: dict[str, Any]
    wrapped: bool = False
    # a wrapper whose composite model holds the LM head itself (Qwen-VL style), so its tie_word_embeddings is the
    # wrapper's; otherwise the language model's section holds the head and its own flag (fields.py says why)
    head_on_wrapper: bool = False

    @property
    def name(self) -> str:
        return self.top.model


@dataclass(frozen=True, slots=True)
class Heads:
    """Attention sizes: hidden, query heads, KV heads, head_dim (for K and V)."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int


def num_layers(f: ConfigFields) -> int:
    return f.int(*LAYER_ALIASES, high=MAX_LAYERS)


def hidden_size(f: ConfigFields) -> int:
    return f.int(*HIDDEN_ALIASES)


def read_heads(f: ConfigFields) -> Heads:
    """Heads and head_dim under their aliases; KV heads default to the query heads (MHA)."""
    hidden = hidden_size(f)
    heads = f.int("num_attention_heads", "n_head", "num_heads", "n_heads", high=MAX_HEADS)
    if f.flag("multi_query"):
        kv_heads = 1
    else:
        kv_heads = f.int("num_key_value_heads", "num_kv_heads", "n_head_kv", "multi_query_group_num",
                         default=heads, high=MAX_HEADS)
    if heads % kv_heads:
        f.fail("num_key_value_heads", kv_heads, f"a divisor of num_attention_heads ({heads})")
    head_dim = f.optional_int("head_dim", "attention_head_dim", "kv_channels", high=MAX_HEAD_DIM)
    if head_dim is None:
        if hidden % heads:
            f.fail("num_attention_heads", heads, f"a divisor of hidden_size ({hidden}) when head_dim is not given")
        head_dim = hidden // heads
    return Heads(hidden=hidden, heads=heads, kv_heads=kv_heads, head_dim=head_dim)


_LAYER_TYPE_KINDS: dict[str, LayerKind] = {
    "full_attention": "full_attention", "attention": "full_attention", "global": "full_attention",
    "sliding_attention": "sliding_attention", "local": "sliding_attention",
    "chunked_attention": "chunked_attention", "linear_attention": "linear_attention",
}


def listed_layer_kinds(f: ConfigFields, n: int, *, allowed: frozenset[str]) -> tuple[LayerKind, ...] | None:
    """`layer_types` (one entry per layer), mapped to our kinds; an entry this family cannot cache is refused."""
    listed = f.text_list("layer_types", length=n)
    if listed is None:
        return None
    kinds: list[LayerKind] = []
    for i, entry in enumerate(listed):
        kind = _LAYER_TYPE_KINDS.get(entry)
        if kind is None or kind not in allowed:
            names = sorted(k for k, v in _LAYER_TYPE_KINDS.items() if v in allowed)
            f.fail(f"layer_types[{i}]", entry, f"one of {', '.join(names)} (this layer type is not supported)")
        kinds.append(kind)
    return tuple(kinds)


ATTENTION_KINDS = frozenset({"full_attention", "sliding_attention", "chunked_attention"})


def attention_layer_kinds(f: ConfigFields, n: int) -> tuple[LayerKind, ...]:
    """Which layers slide: `layer_types`, else `sliding_window_pattern` (every p-th layer full, Gemma-3,
    Cohere-2), else Qwen2's `use_sliding_window` from `max_window_layers`, else Mistral's: a set
    `sliding_window` slides every layer."""
    listed = listed_layer_kinds(f, n, allowed=ATTENTION_KINDS)
    if listed is not None:
        return listed
    if not f.has("sliding_window"):
        return ("full_attention",) * n
    pattern = f.optional_int("sliding_window_pattern", high=n)  # every pattern-th layer is full: one at least
    if pattern is not None:
        return tuple("full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(n))
    if f.has("use_sliding_window"):
        if not f.flag("use_sliding_window"):
            return ("full_attention",) * n
        first = f.int("max_window_layers", default=0, low=0, high=MAX_LAYERS)
        return tuple("full_attention" if i < first else "sliding_attention" for i in range(n))
    return ("sliding_attention",) * n


def window_for(f: ConfigFields, kinds: tuple[LayerKind, ...]) -> int | None:
    """sliding_window, read only when a layer slides."""
    return f.int("sliding_window", high=MAX_POSITIONS) if "sliding_attention" in kinds else None


# ---- MLP and MoE ------------------------------------------------------------------------------------

_PLAIN_MLP_TYPES = frozenset({"gpt2", "gpt_bigcode", "starcoder2", "gpt_neox", "phi", "falcon", "opt", "gptj",
                              "bloom", "mpt", "codegen", "nemotron"})


def dense_mlp(f: ConfigFields, hidden: int, *, model_type: str) -> Block:
    """The dense MLP: gated (SwiGLU/GeGLU) unless the family's is a plain two-matrix one."""
    inter = f.int(*INTERMEDIATE_ALIASES)
    bias = f.flag("mlp_bias", "use_bias") or model_type in ("gpt2", "gpt_bigcode")
    return PlainMLP(hidden, inter, bias) if model_type in _PLAIN_MLP_TYPES else GatedMLP(hidden, inter, bias)


def experts_count(f: ConfigFields) -> int:
    """Routed experts per MoE layer; 0 for a dense model."""
    return f.int("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts",
                 default=0, low=0, high=MAX_EXPERTS)


TOP_K_ALIASES = ("num_experts_per_tok", "experts_per_token", "num_experts_per_token", "moe_k", "top_k_experts")


def check_routing(f: ConfigFields, experts: int) -> None:
    """The router's numbers against the experts it routes to: each token's top-k at most the experts there are;
    grouped routing (DeepSeek-V3's n_group / topk_group) splits the experts evenly and picks top-k from the
    chosen groups. Nothing here changes a byte; a config that breaks them is not one model."""
    top_k = f.optional_int(*TOP_K_ALIASES, high=experts)
    groups = f.optional_int("n_group", high=experts)
    if groups is None:
        return
    if experts % groups:
        f.fail("n_group", groups, f"a divisor of the {experts} routed experts (each group holds as many)")
    chosen = f.int("topk_group", default=groups, high=groups)
    if top_k is not None and top_k > chosen * (experts // groups):
        f.fail("topk_group", chosen, f"enough groups of {experts // groups} experts for "
                                     f"num_experts_per_tok {top_k} (at least {ceil_div(top_k, experts // groups)})")


def moe_block(f: ConfigFields, hidden: int, experts: int, *, score_bias: bool = False, **names: Any) -> MoE:
    """Routed experts (moe_intermediate_size, else intermediate_size) and shared ones under their three spellings."""
    check_routing(f, experts)
    inter = f.int("moe_intermediate_size", *INTERMEDIATE_ALIASES)
    shared = f.optional_int("shared_expert_intermediate_size", low=0)
    gate = shared is not None and shared > 0
    if shared is None:
        shared = f.optional_int("moe_shared_expert_intermediate_size", low=0)
    if shared is None:
        count = f.int("n_shared_experts", "num_shared_experts", "moe_num_shared_experts", "num_shared_expert",
                      default=0, low=0, high=MAX_EXPERTS)
        shared = count * inter
    latent = f.int("moe_latent_size", default=0, low=0)
    return MoE(hidden, experts, inter, shared_intermediate=shared, score_bias=score_bias, latent=latent,
               **({"shared_name": "shared_expert", "shared_gate": True} if gate else {}), **names)


_MLP_LAYER_TYPES = {"dense": False, "sparse": True}
_ROUTING_SETTINGS = ("first_k_dense_replace", "moe_layer_start_index", "mlp_only_layers", "decoder_sparse_step",
                     "interleave_moe_layer_step", "moe_layer_freq", "moe_layer_interval")


def moe_layers(f: ConfigFields, n: int) -> tuple[bool, ...]:
    """Which of the n layers route to experts: transformers 5's `mlp_layer_types` (dense / sparse per layer), or
    after first_k_dense_replace, every moe_layer_freq-th / decoder_sparse_step-th / interleave_moe_layer_step-th,
    never the mlp_only_layers; a config with both must say the same in both. A model given experts routes to
    them in some layer: settings that leave every layer dense contradict the expert count."""
    listed = f.mapped_list("mlp_layer_types", table=_MLP_LAYER_TYPES, length=n)
    if listed is None:
        return _routed_by_settings(f, n)
    if any(f.has(name) for name in _ROUTING_SETTINGS) and listed != _routed_by_settings(f, n):
        f.fail("mlp_layer_types", list(f.raw["mlp_layer_types"]), "'sparse' exactly where first_k_dense_replace, "
               "mlp_only_layers, moe_layer_freq and decoder_sparse_step route to the experts, when both are given")
    if not any(listed):
        f.fail("mlp_layer_types", list(f.raw["mlp_layer_types"]), f"at least one 'sparse' of the {n} layers "
                                                                  "(the config gives experts)")
    return listed


def _routed_by_settings(f: ConfigFields, n: int) -> tuple[bool, ...]:
    """Routing from the older settings (every layer routes when none is given)."""
    first_dense = f.int("first_k_dense_replace", "moe_layer_start_index", default=0, low=0, high=n - 1)
    dense_only = set(f.int_list("mlp_only_layers", high=n - 1) or ())
    step = f.int("decoder_sparse_step", "interleave_moe_layer_step", default=1, high=n)
    if isinstance(f.raw.get("moe_layer_freq"), list):  # one 0/1 flag per layer (MiniMax-M3, MiMo-V2)
        flags = f.int_list("moe_layer_freq", low=0, high=1) or ()
        if len(flags) != n:
            f.fail("moe_layer_freq", f"a list of {len(flags)}", f"one 0/1 flag per layer ({n})")
        routed = tuple(bool(flags[i]) and i not in dense_only for i in range(n))
    else:
        freq = f.int("moe_layer_freq", "moe_layer_interval", default=1, high=n)
        routed = tuple(i >= first_dense and i not in dense_only and i % freq == 0 and (i + 1) % step == 0
                       for i in range(n))
    if not any(routed):
        f.fail("mlp_only_layers" if dense_only else "first_k_dense_replace", sorted(dense_only) or first_dense,
               f"settings that leave at least one of the {n} layers routing to the experts the config gives "
               "(first_k_dense_replace, mlp_only_layers, moe_layer_freq and decoder_sparse_step leave none)")
    return routed


def ffn_blocks(f: ConfigFields, hidden: int, n: int, *, model_type: str, score_bias: bool = False,
               **moe_names: Any) -> tuple[Block, ...]:
    """Each layer's MLP: the dense one, or the MoE block where the layer routes to experts."""
    experts = experts_count(f)
    if experts == 0:
        dense = dense_mlp(f, hidden, model_type=model_type)
        return (dense,) * n
    routed = moe_layers(f, n)
    moe = moe_block(f, hidden, experts, score_bias=score_bias, **moe_names)
    dense = dense_mlp(f, hidden, model_type=model_type) if not all(routed) else moe
    return tuple(moe if r else dense for r in routed)


# ---- layers and the model -------------------------------------------------------------------------


_NORMS = ("input_layernorm", "post_attention_layernorm")


def standard_layers(attention: Block, ffns: tuple[Block, ...], hidden: int, *,
                    norms: tuple[str, ...] = _NORMS) -> tuple[Layer, ...]:
    """Pre-norm decoder layers with the same attention in every layer (see mixed_layers)."""
    return mixed_layers((("self_attn", attention),) * len(ffns), ffns, hidden, norms=norms)


def mixed_layers(mixers: tuple[Part, ...], ffns: tuple[Block, ...], hidden: int, *,
                 norms: tuple[str, ...] = _NORMS, ffn_name: str = "mlp") -> tuple[Layer, ...]:
    """Pre-norm decoder layers, each with its own (name, mixer): the first norm, the mixer, the other
    norms, the MLP; alike layers share one object."""
    norm = Norm(hidden)
    made: dict[tuple[Part, Block], Layer] = {}
    for mixer, ffn in set(zip(mixers, ffns)):
        made[(mixer, ffn)] = Layer(((norms[0], norm), mixer, *((n, norm) for n in norms[1:]), (ffn_name, ffn)))
    return tuple(made[key] for key in zip(mixers, ffns))


def weight_layout(src: ModelSource, layers: tuple[Layer, ...], hidden: int, *, tied_default: bool = False,
                  **ends: Any) -> WeightLayout:
    """The layout with the fields every config has; a wrapped (multimodal) config nests it under language_model,
    the LM head too unless the wrapper holds it (ModelSource.head_on_wrapper)."""
    t = src.text
    quantization = _quantization(src)
    if quantization.method == "mxfp4" and not any(isinstance(block, MoE) for layer in layers for _, block in layer.parts):
        q = src.top if src.top.has("quantization_config") else t
        q.fail("quantization_config.quant_method", "mxfp4", "a model with routed experts: SGLang 0.5.23 and vLLM 0.34.0 "
               "quantize only fused MoE experts to MXFP4 (quantization/mxfp4.py get_quant_method leaves Linear layers "
               "unquantized), so a dense model's MXFP4 checkpoint does not load")
    layout = WeightLayout(hidden=hidden, vocab=t.int("vocab_size", "padded_vocab_size", high=MAX_VOCAB), layers=layers,
                          tied=_tied(src, tied_default), quantization=quantization, **ends)
    if not src.wrapped:
        return layout
    head = layout.lm_head_name if src.head_on_wrapper else "language_model." + layout.lm_head_name
    return replace(layout, layer_prefix="language_model." + layout.layer_prefix,
                   embed_name="language_model." + layout.embed_name, final_norm="language_model." + layout.final_norm,
                   lm_head_name=head)


def _quantization(src: ModelSource) -> Quantization:
    """quantization_config at the top of the file, else in the language model's section (Kimi-K2.5)."""
    return read_quantization(src.top if src.top.has("quantization_config") else src.text)


def _tied(src: ModelSource, default: bool) -> bool:
    """tie_word_embeddings of the config that holds the LM head, else of the other level, else the family's default."""
    for f in ((src.top, src.text) if src.head_on_wrapper else (src.text, src.top)):
        if f.has("tie_word_embeddings"):
            return f.flag("tie_word_embeddings")
    return default


def _rope_theta(t: ConfigFields) -> float:
    """rope_theta, or the newer rope_parameters.rope_theta; 10,000 when neither is given."""
    nested = t.section("rope_parameters")
    if not t.has("rope_theta") and nested is not None:
        return nested.number("rope_theta", default=10_000.0)
    return t.number("rope_theta", default=10_000.0)


def _check_rope_scaling(t: ConfigFields) -> None:
    """rope_scaling (or transformers 5's rope_parameters) stretches the trained context: an object whose factor is
    a positive number. Engines read the factor for the context length (SGLang multiplies by it where no original
    context is given), so a broken one is refused rather than passed on."""
    for name in ("rope_scaling", "rope_parameters"):
        section = t.section(name)
        if section is not None:
            section.number("factor", default=1.0)
            section.optional_int("original_max_position_embeddings", high=MAX_POSITIONS)


def describe(src: ModelSource, *, kinds: tuple[LayerKind, ...], heads: Heads, weights: WeightLayout,
             default_positions: int | None = None, **extra: Any) -> ModelConfig:
    """The ModelConfig: the common cache fields, this family's extras, and the weight layout. `default_positions`:
    the context a family's configs may leave out (both engines take 2048 where none is given)."""
    t = src.text
    names = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx", "max_seq_len",
             "model_max_length")
    if default_positions is None:
        positions = t.int(*names, high=MAX_POSITIONS)
    else:
        positions = t.int(*names, default=default_positions, high=MAX_POSITIONS)
    _check_rope_scaling(t)
    fields: dict[str, Any] = dict(
        name=src.name, architecture=src.architecture, model_type=src.model_type,
        hidden_size=heads.hidden, num_hidden_layers=len(kinds), num_attention_heads=heads.heads,
        num_key_value_heads=heads.kv_heads, head_dim=heads.head_dim, v_head_dim=heads.head_dim,
        vocab_size=weights.vocab,
        max_position_embeddings=positions,
        checkpoint_dtype=src.top.dtype_name() or t.dtype_name(), layer_kinds=kinds, weights=weights,
        rms_norm_eps=t.number("rms_norm_eps", "layer_norm_epsilon", "norm_eps", "layernorm_epsilon", "layer_norm_eps",
                              default=1e-6),
        rope_theta=_rope_theta(t), hf_config=src.raw,
    )
    fields.update(extra)
    return ModelConfig(**fields)


# ---- next-token-prediction (MTP / NEXTN) layers -----------------------------------------------------

def with_mtp(model: ModelConfig, layers: tuple[Layer, ...], kinds: tuple[LayerKind, ...], *,
             prefix: str | None = None) -> ModelConfig:
    """The model with the MTP layers its checkpoint holds: their weights (one Layer each, named from `prefix`, else
    numbered after the decoder layers) and cache kinds. Only a NEXTN draft loads and caches them
    (ModelConfig.nextn_draft); the target skips them, as SGLang 0.5.23 does."""
    weights = replace(model.weights, nextn_layers=layers, nextn_prefix=prefix)
    return msgspec.structs.replace(model, weights=weights, nextn_layer_kinds=kinds)
