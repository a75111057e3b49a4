"""What every decoder config shares: the source being read, attention heads, layer kinds, the weight layout
(MLP/MoE blocks: kvcache.models.feed_forward).

Readers (the generic one and each family's) are built from these pieces, so an alias or a
rule (head_dim defaults to hidden / heads; Qwen2 slides from max_window_layers) is stated
once for every family.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import msgspec

from kvcache.models.model_config import LayerKind, ModelConfig
from kvcache.models.fields import MAX_HEAD_DIM, MAX_HEADS, MAX_LAYERS, MAX_POSITIONS, MAX_VOCAB, ConfigFields
from kvcache.models.weight_blocks import Block, Layer, MoE, Norm, Part
from kvcache.models.quantization import Quantization, read_quantization
from kvcache.models.weights_layout import WeightLayout

LAYER_ALIASES = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
HIDDEN_ALIASES = ("hidden_size", "n_embd", "d_model", "model_dim")


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
