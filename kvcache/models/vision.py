"""The vision tower of a multimodal config, counted when `vision_config` gives its shapes.

A ViT (SigLIP/CLIP/Qwen-VL style): patch embedding, learned positions, pre-norm layers of
biased MHA and a two-matrix MLP, a final norm, and a linear projector into the language
model. Towers whose config lacks the shapes are not counted, and the model says so.
"""

from __future__ import annotations

from dataclasses import replace

import msgspec

from kvcache.models.fields import MAX_HEADS, MAX_LAYERS, ConfigFields
from kvcache.models.model_config import ModelConfig
from kvcache.models.weight_blocks import Attention, Linear, Norm, Part, PlainMLP

TOWER, PROJECTOR = "vision_tower", "multi_modal_projector"  # the names of the parts vision_tower() counts

# embed_dim first: Qwen2-VL's vision hidden_size is the projector's output, its width is embed_dim
_SHAPE_FIELDS = (("embed_dim", "hidden_size", "width"), ("num_hidden_layers", "depth", "layers"),
                 ("num_attention_heads", "num_heads", "heads"))


def vision_tower(top: ConfigFields, text_hidden: int) -> tuple[tuple[Part, ...], bool]:
    """(parts, counted): the tower's parameters, or () and False when its shapes are not in the config."""
    v = top.section("vision_config")
    if v is None or not all(v.has(*names) for names in _SHAPE_FIELDS):
        return (), False
    if not (v.has("intermediate_size") or v.has("mlp_ratio")) or not v.has("patch_size", "spatial_patch_size"):
        return (), False
    hidden = v.int(*_SHAPE_FIELDS[0])
    layers = v.int(*_SHAPE_FIELDS[1], high=MAX_LAYERS)
    heads = v.int(*_SHAPE_FIELDS[2], high=MAX_HEADS)
    if hidden % heads:
        v.fail("num_attention_heads", heads, f"a divisor of the vision hidden size ({hidden})")
    inter = v.optional_int("intermediate_size")
    if inter is None:
        ratio = v.raw.get("mlp_ratio")
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio <= 64:
            v.fail("mlp_ratio", ratio, "a positive number (at most 64)")
        inter = int(hidden * ratio)
    patch = v.int("patch_size", "spatial_patch_size", high=4096)
    channels = v.int("num_channels", "in_channels", "in_chans", default=3, high=64)
    temporal = v.int("temporal_patch_size", default=1, high=64)
    parts: list[Part] = [(f"{TOWER}.patch_embed", Linear(hidden, channels * temporal * patch * patch, bias=True))]
    image = v.optional_int("image_size", low=patch, high=1 << 16)  # an image holds at least one patch
    if image is not None:
        parts.append((f"{TOWER}.position_embedding", Linear(hidden, (image // patch) ** 2)))
    attention = Attention(hidden=hidden, heads=heads, kv_heads=heads, head_dim=hidden // heads, input_size=hidden,
                          qkv_bias=True, o_bias=True)
    mlp, norm = PlainMLP(hidden, inter, bias=True), Norm(hidden, bias=True)
    for k in range(layers):
        p = f"{TOWER}.layers.{k}."
        parts += [(p + "norm1", norm), (p + "attn", attention), (p + "norm2", norm), (p + "mlp", mlp)]
    parts += [(f"{TOWER}.post_layernorm", norm), (PROJECTOR, Linear(text_hidden, hidden, bias=True))]
    return tuple(parts), True


def without_vision_tower(model: ModelConfig) -> ModelConfig:
    """The model as an engine that builds no vision tower loads it: no tower or projector weights (a model
    without a vision_config is returned as it is)."""
    if model.vision_weights == "none":
        return model
    front = tuple((name, block) for name, block in model.weights.front
                  if not (name == PROJECTOR or name.startswith(TOWER + ".")))
    return msgspec.structs.replace(model, weights=replace(model.weights, front=front), vision_weights="not_loaded")
