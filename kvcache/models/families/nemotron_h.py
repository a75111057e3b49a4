"""Nemotron-H / Nemotron-3: `hybrid_override_pattern` picks each layer: M Mamba-2, * attention,
- squared-ReLU MLP, E MoE (no cache for - and E)."""

from __future__ import annotations

from kvcache.models.model_config import LayerKind, ModelConfig
from kvcache.models.decoder import (
    ModelSource,
    describe,
    moe_block,
    num_layers,
    read_heads,
    weight_layout,
)
from kvcache.models.fields import MAX_EXPERTS, MAX_HEAD_DIM, MAX_HEADS, ConfigFields
from kvcache.models.generic import attention_block, text_model_type
from kvcache.models.weight_blocks import Block, Layer, Mamba2Mixer, Norm, PlainMLP

_KINDS: dict[str, LayerKind] = {"M": "mamba2", "*": "full_attention", "-": "mlp", "E": "mlp"}


def mamba2_mixer(t: ConfigFields, hidden: int, *, heads: int, head_dim: int) -> Mamba2Mixer:
    """A Mamba-2 mixer whose heads the caller read (families name them differently)."""
    return Mamba2Mixer(hidden=hidden, heads=heads, head_dim=head_dim,
                       groups=t.int("n_groups", "mamba_n_groups", "mamba_ngroups", high=MAX_HEADS),
                       state=t.int("ssm_state_size", "mamba_d_state", "state_size", high=MAX_HEAD_DIM),
                       conv_kernel=t.int("conv_kernel", "mamba_d_conv", "mamba_conv_kernel", high=64),
                       conv_bias=t.flag("use_conv_bias", "mamba_conv_bias", default=True),
                       proj_bias=t.flag("mamba_proj_bias", "use_bias"))


def mamba2_cache_fields(m: Mamba2Mixer) -> dict[str, int]:
    return dict(mamba_num_heads=m.heads, mamba_head_dim=m.head_dim, ssm_state_size=m.state,
                mamba_n_groups=m.groups, mamba_conv_kernel=m.conv_kernel)


def read_nemotron_h(src: ModelSource) -> ModelConfig:
    t = src.text
    listed = t.raw.get("layers_block_type")
    n = num_layers(t) if not isinstance(listed, list) or t.has("num_hidden_layers") else len(listed)
    blocks_listed = t.text_list("layers_block_type", length=n)
    if blocks_listed is not None and not t.has("hybrid_override_pattern"):  # Nemotron-3 Ultra spells it out
        letters = {"mamba": "M", "attention": "*", "mlp": "-", "moe": "E"}
        for i, b in enumerate(blocks_listed):
            if b not in letters:
                t.fail(f"layers_block_type[{i}]", b, "one of mamba, attention, mlp, moe")
        pattern = "".join(letters[b] for b in blocks_listed)
    else:
        pattern = t.text("hybrid_override_pattern")
    if len(pattern) != n:
        t.fail("hybrid_override_pattern", f"{len(pattern)} layers", f"one letter per layer (num_hidden_layers is {n})")
    unknown = sorted(set(pattern) - set(_KINDS))
    if unknown:
        t.fail("hybrid_override_pattern", pattern, f"only the letters M, *, -, E (found {unknown})")
    heads = read_heads(t)
    hidden = heads.hidden
    mamba = mamba2_mixer(t, hidden, heads=t.int("mamba_num_heads", high=MAX_HEADS),
                         head_dim=t.int("mamba_head_dim", high=MAX_HEAD_DIM))
    blocks: dict[str, Block] = {"M": mamba}
    if "*" in pattern:
        blocks["*"] = attention_block(t, heads, text_model_type(src))
    if "-" in pattern:
        blocks["-"] = PlainMLP(hidden, t.int("intermediate_size"), t.flag("mlp_bias"))
    if "E" in pattern:
        blocks["E"] = moe_block(t, hidden, t.int("n_routed_experts", "num_experts", high=MAX_EXPERTS), score_bias=True,
                                gated=False)
    norm = Norm(hidden)
    layers = {c: Layer((("norm", norm), ("mixer", blocks[c]))) for c in set(pattern)}
    weights = weight_layout(src, tuple(layers[c] for c in pattern), hidden, embed_name="backbone.embeddings",
                            final_norm="backbone.norm_f", layer_prefix="backbone.layers.{i}.")
    return describe(src, kinds=tuple(_KINDS[c] for c in pattern), heads=heads, weights=weights,
                    **mamba2_cache_fields(mamba))
