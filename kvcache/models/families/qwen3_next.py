"""Gated-delta-net hybrids: Qwen3-Next (every full_attention_interval-th layer is attention) and
Qwen3.5-style configs (`layer_types` naming linear_attention layers).

Attention layers are gated (q doubled for the output gate) with q/k norms; linear layers
keep a per-request conv window and a delta-rule state (see layer_specs). The checkpoint's one MTP
layer (`mtp.`: two norms and fc before a full-attention decoder layer, a final norm) is a NEXTN draft's.
"""

from __future__ import annotations

from kvcache.models.model_config import LayerKind, ModelConfig
from kvcache.models.decoder import (
    ModelSource, describe, listed_layer_kinds, mixed_layers, num_layers, read_heads, weight_layout, with_mtp,
)
from kvcache.models.feed_forward import ffn_blocks
from kvcache.models.fields import MAX_HEAD_DIM, MAX_HEADS, MAX_LAYERS, ConfigFields
from kvcache.models.generic import attention_block, text_model_type
from kvcache.models.weight_blocks import Block, GatedDeltaNet, Layer, Linear, Norm

_KINDS = frozenset({"full_attention", "linear_attention"})


def gated_delta_net(t: ConfigFields, hidden: int) -> GatedDeltaNet:
    key_heads, value_heads = t.int("linear_num_key_heads", high=MAX_HEADS), t.int("linear_num_value_heads", high=MAX_HEADS)
    if value_heads % key_heads:  # each key head serves value_heads // key_heads value heads
        t.fail("linear_num_value_heads", value_heads, f"a multiple of linear_num_key_heads ({key_heads})")
    return GatedDeltaNet(hidden=hidden, key_heads=key_heads, value_heads=value_heads,
                         key_dim=t.int("linear_key_head_dim", high=MAX_HEAD_DIM),
                         value_dim=t.int("linear_value_head_dim", high=MAX_HEAD_DIM),
                         conv_kernel=t.conv_kernel("linear_conv_kernel_dim"))


def linear_state_fields(gdn: GatedDeltaNet) -> dict[str, int]:
    """The cache fields of a delta-rule layer (gated delta net or KDA)."""
    return dict(linear_num_key_heads=gdn.key_heads, linear_num_value_heads=gdn.value_heads,
                linear_key_head_dim=gdn.key_dim, linear_value_head_dim=gdn.value_dim,
                linear_conv_kernel_dim=gdn.conv_kernel)


def _layer_kinds(t: ConfigFields, n: int) -> tuple[LayerKind, ...]:
    listed = listed_layer_kinds(t, n, allowed=_KINDS)
    if listed is not None:
        return listed
    interval = t.int("full_attention_interval", high=MAX_LAYERS)
    return tuple("full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n))


def mtp_layer(t: ConfigFields, attention: Block, ffn: Block, hidden: int) -> tuple[Layer, ...]:
    """The MTP layer SGLang 0.5.23 drafts with (one, whatever mtp_num_hidden_layers says, unless it is 0):
    named as the checkpoint names it under `mtp.`."""
    if not t.int("mtp_num_hidden_layers", "num_nextn_predict_layers", default=1, low=0, high=MAX_LAYERS):
        return ()
    norm = Norm(hidden)
    decoder = mixed_layers((("self_attn", attention),), (ffn,), hidden)[0]
    return (Layer((("pre_fc_norm_embedding", norm), ("pre_fc_norm_hidden", norm), ("fc", Linear(hidden, 2 * hidden)),
                   *((f"layers.0.{name}", block) for name, block in decoder.parts), ("norm", norm))),)


def read_qwen3_next(src: ModelSource) -> ModelConfig:
    t = src.text
    heads, n = read_heads(t), num_layers(t)
    kinds = _layer_kinds(t, n)
    attention = attention_block(t, heads, text_model_type(src), qk_norm=True,
                                gated=t.flag("attn_output_gate", default=True))
    gdn = gated_delta_net(t, heads.hidden)
    ffns = ffn_blocks(t, heads.hidden, n, model_type="qwen3_next")
    mixers = tuple(("self_attn", attention) if k == "full_attention" else ("linear_attn", gdn) for k in kinds)
    weights = weight_layout(src, mixed_layers(mixers, ffns, heads.hidden), heads.hidden)
    model = describe(src, kinds=kinds, heads=heads, weights=weights, **linear_state_fields(gdn))
    mtp = mtp_layer(t, attention, ffns[-1], heads.hidden)
    return with_mtp(model, mtp, ("full_attention",) * len(mtp), prefix="mtp.")
