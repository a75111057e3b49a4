"""Llama-4: chunked local attention on RoPE layers, global attention on the NoPE ones; MoE with a shared expert.

`no_rope_layers[i]` is 1 where layer i uses RoPE (and so chunked attention of
attention_chunk_size tokens) and 0 where it is a global NoPE layer; without the list,
every 4th layer is NoPE (HF's default). Dense layers use intermediate_size_mlp, experts
intermediate_size; MoE every interleave_moe_layer_step-th layer.
"""

from __future__ import annotations

from kvcache.models.model_config import LayerKind, ModelConfig
from kvcache.models.decoder import ModelSource, describe, num_layers, read_heads, standard_layers, weight_layout
from kvcache.models.feed_forward import check_routing, moe_layers
from kvcache.models.fields import MAX_EXPERTS, MAX_LAYERS, MAX_POSITIONS
from kvcache.models.generic import attention_block, text_model_type
from kvcache.models.weight_blocks import GatedMLP, MoE

_NOPE_INTERVAL = 4
_LAYER_TYPES: dict[str, LayerKind] = {"full_attention": "full_attention", "chunked_attention": "chunked_attention"}


def read_llama4(src: ModelSource) -> ModelConfig:
    t = src.text
    heads, n = read_heads(t), num_layers(t)
    uses_rope = t.int_list("no_rope_layers", low=0, high=1)
    if not uses_rope:  # absent, or [] as the published Scout config has it: transformers reads both as the default
        interval = t.int("no_rope_layer_interval", default=_NOPE_INTERVAL, high=MAX_LAYERS)
        uses_rope = tuple(int((i + 1) % interval != 0) for i in range(n))
    if len(uses_rope) != n:
        t.fail("no_rope_layers", f"a list of {len(uses_rope)}", f"one 0/1 entry per layer ({n})")
    chunk = t.optional_int("attention_chunk_size", high=MAX_POSITIONS)
    kinds: tuple[LayerKind, ...] = tuple(
        "chunked_attention" if rope and chunk is not None else "full_attention" for rope in uses_rope)
    listed = t.mapped_list("layer_types", table=_LAYER_TYPES, length=n)  # transformers 5 writes both; it refuses
    if listed is not None and listed != kinds:  # a list of another length, and so does this reader
        t.fail("layer_types", list(t.raw["layer_types"]), "chunked_attention exactly on the RoPE layers of "
               "no_rope_layers (full_attention on the NoPE ones, or everywhere without attention_chunk_size)")
    hidden = heads.hidden
    inter = t.int("intermediate_size")
    count = t.int("num_local_experts", high=MAX_EXPERTS)
    check_routing(t, count)
    experts = MoE(hidden, count, inter, shared_intermediate=inter, router_name="router", shared_name="shared_expert")
    dense = GatedMLP(hidden, t.int("intermediate_size_mlp", default=inter))
    ffns = tuple(experts if routed else dense for routed in moe_layers(t, n))
    layers = standard_layers(attention_block(t, heads, text_model_type(src), qk_norm=False), ffns, hidden)
    return describe(src, kinds=kinds, heads=heads, weights=weight_layout(src, layers, hidden),
                    attention_chunk_size=chunk if "chunked_attention" in kinds else None)
