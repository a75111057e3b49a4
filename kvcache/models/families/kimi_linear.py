"""Kimi-Linear: Kimi delta attention (KDA) layers with a recurrent state, MLA on the others; MoE.

`linear_attn_config` lists the KDA and full-attention layers 1-based, with the KDA heads. transformers 5
writes the same model without it: `layer_types` (linear_attention for KDA, full_attention for MLA, 0-based
by position) and flat `linear_num_heads` / `linear_head_dim` / `linear_conv_kernel_dim`; a config that has
both must say the same in both. A KDA layer keeps a conv window over q, k and v (num_heads x head_dim each)
and a head_dim x head_dim state per head, as SGLang 0.5.23's KimiLinearStateShape sizes it.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvcache.models.model_config import LayerKind, ModelConfig
from kvcache.models.decoder import Heads, ModelSource, describe, hidden_size, mixed_layers, num_layers, weight_layout
from kvcache.models.feed_forward import ffn_blocks
from kvcache.models.families.deepseek import mla_attention, mla_cache_fields
from kvcache.models.fields import MAX_HEAD_DIM, MAX_HEADS, ConfigFields
from kvcache.models.weight_blocks import ParamSpec, Shard, linear


@dataclass(frozen=True, slots=True)
class KimiDeltaAttention:
    """KDA: q/k/v projections each with a short depthwise conv, low-rank forget and output gates, per-head decay."""

    hidden: int
    heads: int
    head_dim: int
    conv_kernel: int

    def specs(self, name: str, shard: Shard) -> list[ParamSpec]:
        width, d = shard.split(self.heads) * self.head_dim, self.head_dim
        out: list[ParamSpec] = []
        for p in ("q", "k", "v"):
            out += linear(f"{name}.{p}_proj", width, self.hidden)
            out.append(ParamSpec(f"{name}.{p}_conv1d.weight", (width, 1, self.conv_kernel)))
        for gate in ("f", "g"):
            out += linear(f"{name}.{gate}_a_proj", d, self.hidden) + linear(f"{name}.{gate}_b_proj", width, d)
        return (out + linear(f"{name}.b_proj", shard.split(self.heads), self.hidden)
                + [ParamSpec(f"{name}.A_log", (shard.split(self.heads),)), ParamSpec(f"{name}.dt_bias", (width,)),
                   ParamSpec(f"{name}.o_norm.weight", (d,))]
                + linear(f"{name}.o_proj", self.hidden, width))


_KINDS: dict[str, LayerKind] = {"linear_attention": "kda", "full_attention": "mla"}


def _layer_kinds(t: ConfigFields, lin: ConfigFields | None, n: int) -> tuple[LayerKind, ...]:
    """Each layer KDA or MLA: from linear_attn_config's 1-based lists, or transformers 5's layer_types."""
    listed = t.mapped_list("layer_types", table=_KINDS, length=n)
    if lin is None:
        if listed is None:
            t.fail("linear_attn_config", None, "an object listing kda_layers / full_attn_layers and the KDA heads "
                                               "(or transformers 5's layer_types with linear_num_heads, "
                                               "linear_head_dim and linear_conv_kernel_dim)")
        return listed
    full = set(lin.int_list("full_attn_layers", low=1, high=n) or ())
    kda = set(lin.int_list("kda_layers", low=1, high=n) or ()) or set(range(1, n + 1)) - full
    if full & kda or len(full | kda) != n:
        lin.fail("kda_layers", sorted(kda), f"with full_attn_layers, each of the {n} layers (1-based) exactly once")
    kinds: tuple[LayerKind, ...] = tuple("kda" if i + 1 in kda else "mla" for i in range(n))
    if listed is not None and listed != kinds:
        t.fail("layer_types", list(t.raw["layer_types"]), "linear_attention exactly at linear_attn_config.kda_layers "
                                                          f"(1-based {sorted(kda)}), when both are given")
    return kinds


def _kda_size(t: ConfigFields, lin: ConfigFields | None, nested: str, flat: str, *, conv: bool = False) -> int:
    """One KDA size: linear_attn_config's, else transformers 5's flat field; where both are given they agree."""
    def read(f: ConfigFields, name: str) -> int:
        return f.conv_kernel(name) if conv else f.int(name, high=MAX_HEADS if name.endswith("heads") else MAX_HEAD_DIM)
    if lin is None:
        return read(t, flat)
    value = read(lin, nested)
    t.repeats(flat, value, f"linear_attn_config.{nested}", read=lambda name: read(t, name))
    return value


def _refuse_kimi_k3_parts(t: ConfigFields) -> None:
    """transformers 5's Kimi-Linear class also describes Kimi-K3's parts; their weights are not sized here."""
    if t.flag("mla_use_output_gate"):
        t.fail("mla_use_output_gate", True, "false: Kimi-K3's gated MLA output is not sized here")
    if t.int("attn_res_block_size", default=0, low=0, high=MAX_HEADS):
        t.fail("attn_res_block_size", t.raw["attn_res_block_size"],
               "0: Kimi-K3's attention residuals are not sized here")
    dense = t.optional_int("dense_ffn_hidden")
    if dense is not None and dense != t.int("intermediate_size"):
        t.fail("dense_ffn_hidden", dense, f"intermediate_size ({t.int('intermediate_size')}), the dense MLP's width")


def read_kimi_linear(src: ModelSource) -> ModelConfig:
    t = src.text
    hidden, n = hidden_size(t), num_layers(t)
    lin = t.section("linear_attn_config")
    kinds = _layer_kinds(t, lin, n)
    _refuse_kimi_k3_parts(t)
    heads = t.int("num_attention_heads", high=MAX_HEADS)
    mla = mla_attention(t, hidden, heads)
    delta = KimiDeltaAttention(hidden, _kda_size(t, lin, "num_heads", "linear_num_heads"),
                               _kda_size(t, lin, "head_dim", "linear_head_dim"),
                               _kda_size(t, lin, "short_conv_kernel_size", "linear_conv_kernel_dim", conv=True))
    ffns = ffn_blocks(t, hidden, n, model_type="kimi_linear", score_bias=True)
    mixers = tuple(("self_attn", mla if k == "mla" else delta) for k in kinds)
    weights = weight_layout(src, mixed_layers(mixers, ffns, hidden), hidden)
    return describe(src, kinds=kinds, heads=Heads(hidden, heads, heads, mla.nope_dim + mla.rope_dim), weights=weights,
                    v_head_dim=mla.v_dim, **mla_cache_fields(mla),
                    linear_num_key_heads=delta.heads, linear_num_value_heads=delta.heads,
                    linear_key_head_dim=delta.head_dim, linear_value_head_dim=delta.head_dim,
                    linear_conv_kernel_dim=delta.conv_kernel)
