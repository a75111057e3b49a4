"""Nemotron-H / Nemotron-3: `hybrid_override_pattern` picks each layer: M Mamba-2, * attention,
- squared-ReLU MLP, E MoE (no cache for - and E). Nemotron-3 Super/Ultra ship one MTP step
(`num_nextn_predict_layers` 1) of `mtp_hybrid_override_pattern` / `mtp_layers_block_type` layers (* and E),
the first with enorm, hnorm and a column-parallel eh_proj, the last with a final norm: a NEXTN draft's.
The layers may instead be listed (`layers_block_type`, or `layer_types`), as mamba / attention / mlp / moe or, as
transformers 5 saves them, linear_attention / full_attention / mlp / moe."""

from __future__ import annotations

from kvcache.models.model_config import LayerKind, ModelConfig
from kvcache.models.decoder import ModelSource, describe, num_layers, read_heads, weight_layout, with_mtp
from kvcache.models.feed_forward import moe_block
from kvcache.models.fields import MAX_EXPERTS, MAX_HEAD_DIM, MAX_HEADS, ConfigFields, with_transformers5_names
from kvcache.models.generic import attention_block, text_model_type
from kvcache.models.weight_blocks import Block, Layer, Linear, Mamba2Mixer, Norm, PlainMLP

_KINDS: dict[str, LayerKind] = {"M": "mamba2", "*": "full_attention", "-": "mlp", "E": "mlp"}
# A listed layer's letter, under the older names and transformers 5's (which renames mamba and attention).
_LETTERS = with_transformers5_names({"mamba": "M", "attention": "*", "mlp": "-", "moe": "E"})
_LISTS = ("layers_block_type", "layer_types")
_MTP_LISTS = ("mtp_layers_block_type", "mtp_layer_types")


def mamba2_mixer(t: ConfigFields, hidden: int, *, heads: int, head_dim: int) -> Mamba2Mixer:
    """A Mamba-2 mixer whose heads the caller read (families name them differently)."""
    groups = t.int("n_groups", "mamba_n_groups", "mamba_ngroups", high=MAX_HEADS)
    if heads % groups:  # B and C are shared by heads // groups heads each
        t.fail("n_groups" if t.has("n_groups") else "mamba_n_groups", groups, f"a divisor of the {heads} Mamba heads")
    return Mamba2Mixer(hidden=hidden, heads=heads, head_dim=head_dim, groups=groups,
                       state=t.int("ssm_state_size", "mamba_d_state", "state_size", high=MAX_HEAD_DIM),
                       conv_kernel=t.conv_kernel("conv_kernel", "mamba_d_conv", "mamba_conv_kernel"),
                       conv_bias=t.flag("use_conv_bias", "mamba_conv_bias", default=True),
                       proj_bias=t.flag("mamba_proj_bias", "use_bias"))


def mamba2_cache_fields(m: Mamba2Mixer) -> dict[str, int]:
    return dict(mamba_num_heads=m.heads, mamba_head_dim=m.head_dim, ssm_state_size=m.state,
                mamba_n_groups=m.groups, mamba_conv_kernel=m.conv_kernel)


def _listed_pattern(t: ConfigFields, listed_names: tuple[str, ...], pattern_name: str, n: int | None) -> str | None:
    """A layer pattern spelled as letters (`pattern_name`) or as a list of block types (any of `listed_names`)."""
    listed = t.mapped_list(*listed_names, table=_LETTERS, length=n)
    pattern = t.text(pattern_name, default="") or None
    if listed is None:
        return pattern
    letters = "".join(listed)
    if pattern is not None and pattern != letters:
        named = next(name for name in listed_names if t.has(name))
        t.fail(pattern_name, pattern, f"the layers {named} lists ({letters}), when both are given")
    return letters


def read_nemotron_h(src: ModelSource) -> ModelConfig:
    t = src.text
    listed = next((t.raw[name] for name in _LISTS if isinstance(t.raw.get(name), list)), None)
    n = num_layers(t) if listed is None or t.has("num_hidden_layers") else len(listed)  # transformers 5 drops the count
    pattern = _listed_pattern(t, _LISTS, "hybrid_override_pattern", n)
    if pattern is None:
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
    mtp_pattern = _mtp_pattern(t)
    blocks: dict[str, Block] = {"M": mamba}
    if "*" in pattern + mtp_pattern:
        blocks["*"] = attention_block(t, heads, text_model_type(src))
    if "-" in pattern:
        blocks["-"] = PlainMLP(hidden, t.int("intermediate_size"), t.flag("mlp_bias"))
    if "E" in pattern + mtp_pattern:
        blocks["E"] = moe_block(t, hidden, t.int("n_routed_experts", "num_experts", high=MAX_EXPERTS), score_bias=True,
                                gated=False)
    norm = Norm(hidden)
    layers = {c: Layer((("norm", norm), ("mixer", blocks[c]))) for c in set(pattern)}
    weights = weight_layout(src, tuple(layers[c] for c in pattern), hidden, embed_name="backbone.embeddings",
                            final_norm="backbone.norm_f", layer_prefix="backbone.layers.{i}.")
    model = describe(src, kinds=tuple(_KINDS[c] for c in pattern), heads=heads, weights=weights,
                     **mamba2_cache_fields(mamba))
    return with_mtp(model, _mtp_layers(mtp_pattern, blocks, hidden), tuple(_KINDS[c] for c in mtp_pattern),
                    prefix="mtp.layers.{i}.")


def _mtp_pattern(t: ConfigFields) -> str:
    """The MTP step's layers ('' without MTP): attention (*) and MoE (E) only, as SGLang 0.5.23 builds them;
    ['attention', 'moe'] when the config has MTP but does not list them (the config class's default)."""
    if not t.int("num_nextn_predict_layers", default=0, low=0, high=1):
        return ""
    pattern = _listed_pattern(t, _MTP_LISTS, "mtp_hybrid_override_pattern", None) or "*E"
    if set(pattern) - {"*", "E"}:
        listed = next((name for name in _MTP_LISTS if t.has(name)), None)
        if listed is not None:
            t.fail(listed, t.raw[listed], "only attention and moe layers (full_attention and moe, as transformers 5 "
                                          "writes them): the MTP step's")
        t.fail("mtp_hybrid_override_pattern", pattern, "only the letters * and E (attention and MoE MTP layers)")
    return pattern


def _mtp_layers(pattern: str, blocks: dict[str, Block], hidden: int) -> tuple[Layer, ...]:
    norm = Norm(hidden)
    first = (("enorm", norm), ("hnorm", norm), ("eh_proj", Linear(hidden, 2 * hidden, column_parallel=True)))
    return tuple(Layer((*(first if j == 0 else ()), ("norm", norm), ("mixer", blocks[c]),
                        *((("final_layernorm", norm),) if j == len(pattern) - 1 else ())))
                 for j, c in enumerate(pattern))
