"""A model's parameter tensors, per rank, from its Hugging Face config: names and shapes, no device.

The dummy loader allocates exactly these, so the bytes it reports are the bytes a
real checkpoint of the same architecture would occupy on this rank.

Tensor parallelism (how SGLang and vLLM shard): column-parallel outputs (q/k/v,
gate/up, experts' intermediate, in-projections) and the vocab of embedding and
lm_head are split by tp_size, rounded up; row-parallel inputs (o/down/out
projections) likewise; a rank holds max(1, kv_heads // tp_size) KV heads (one
replicated head when kv_heads < tp_size); norms, routers and small replicated
linears (MLA's down-projections, eh_proj, EAGLE's fc) stay whole.

Shapes are [out, in] like torch.nn.Linear; a layer's routed experts are two
stacked tensors, gate_up [experts, 2 * intermediate, hidden] and down
[experts, hidden, intermediate], the fused layout MoE kernels read.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from fnmatch import fnmatchcase
from typing import Any


@dataclass(frozen=True, slots=True)
class ParamSpec:
    """One parameter tensor as this rank holds it; `quantized` marks a linear weight stored narrow."""

    name: str
    shape: tuple[int, ...]
    quantized: bool = False

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


# ---- reading the config --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Config:
    """The HF dict, read so that a missing field names itself and the architecture."""

    raw: Mapping[str, Any]
    arch: str

    def need(self, field: str) -> int:
        value = self.raw.get(field)
        if value is None:
            raise ValueError(f"{self.arch} config is missing {field!r}, needed to describe its weights")
        return int(value)

    def opt(self, field: str, default: int) -> int:
        value = self.raw.get(field)
        return default if value is None else int(value)

    def flag(self, field: str, default: bool = False) -> bool:
        value = self.raw.get(field)
        return default if value is None else bool(value)


@dataclass(frozen=True, slots=True)
class _Shard:
    """Per-rank sizes under tensor parallelism."""

    tp: int

    def split(self, n: int) -> int:
        """A column- or row-parallel (or vocab-parallel) dimension: ceil(n / tp), padded like vocab."""
        return -(-n // self.tp)

    def kv_heads(self, n: int) -> int:
        """KV heads per rank; replicated to one when there are fewer heads than ranks."""
        return max(1, n // self.tp)


# ---- building blocks (names are full; `quantized` here means "a quantizable linear weight") ------


def _norm(name: str, size: int) -> ParamSpec:
    return ParamSpec(f"{name}.weight", (size,), False)


def _linear(name: str, out: int, inp: int, *, bias: bool = False, quantizable: bool = True) -> list[ParamSpec]:
    specs = [ParamSpec(f"{name}.weight", (out, inp), quantizable)]
    return specs + [ParamSpec(f"{name}.bias", (out,), False)] if bias else specs


@dataclass(frozen=True, slots=True)
class _Attention:
    """Multi-head / grouped-query attention as one config describes it."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    input_size: int
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False
    gated: bool = False
    sinks: bool = False

    def specs(self, p: str, s: _Shard) -> list[ParamSpec]:
        """q/k/v/o (q doubled when gated: Qwen3-Next's output gate); the o bias is whole (row-parallel)."""
        q = s.split(self.heads) * self.head_dim
        kv = s.kv_heads(self.kv_heads) * self.head_dim
        specs = _linear(f"{p}q_proj", q * (2 if self.gated else 1), self.input_size, bias=self.qkv_bias)
        specs += _linear(f"{p}k_proj", kv, self.input_size, bias=self.qkv_bias)
        specs += _linear(f"{p}v_proj", kv, self.input_size, bias=self.qkv_bias)
        specs += _linear(f"{p}o_proj", self.hidden, q, bias=self.o_bias)
        if self.qk_norm:
            specs += [_norm(f"{p}q_norm", self.head_dim), _norm(f"{p}k_norm", self.head_dim)]
        if self.sinks:
            specs.append(ParamSpec(f"{p}sinks", (s.split(self.heads),), False))
        return specs


def _attention(c: _Config, *, input_size: int | None = None, **flags: bool) -> _Attention:
    """Attention sizes from the usual fields; head_dim defaults to hidden // heads."""
    hidden, heads = c.need("hidden_size"), c.need("num_attention_heads")
    head_dim = c.opt("head_dim", c.opt("attention_head_dim", hidden // heads))
    return _Attention(hidden=hidden, heads=heads, kv_heads=c.opt("num_key_value_heads", heads), head_dim=head_dim,
                      input_size=input_size or hidden, **flags)


def _gated_mlp(p: str, hidden: int, inter: int, s: _Shard, *, bias: bool = False) -> list[ParamSpec]:
    i = s.split(inter)
    return (_linear(f"{p}gate_proj", i, hidden, bias=bias) + _linear(f"{p}up_proj", i, hidden, bias=bias)
            + _linear(f"{p}down_proj", hidden, i, bias=bias))


def _experts(p: str, n: int, hidden: int, inter: int, s: _Shard, *, bias: bool = False) -> list[ParamSpec]:
    """n routed experts, stacked; TP splits each expert's intermediate (every rank holds all experts)."""
    i = s.split(inter)
    specs = [ParamSpec(f"{p}experts.gate_up_proj", (n, 2 * i, hidden), True),
             ParamSpec(f"{p}experts.down_proj", (n, hidden, i), True)]
    if bias:
        specs += [ParamSpec(f"{p}experts.gate_up_proj_bias", (n, 2 * i), False),
                  ParamSpec(f"{p}experts.down_proj_bias", (n, hidden), False)]
    return specs


def _router(name: str, n: int, hidden: int, *, bias: bool = False) -> list[ParamSpec]:
    """A replicated router; checkpoints keep it in the model dtype, so never quantizable."""
    return _linear(name, n, hidden, bias=bias, quantizable=False)


# ---- architectures ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Layout:
    """How one architecture lays out its tensors: the layers, the two ends, and any NEXTN layers."""

    num_layers: int
    layer: Callable[[int], list[ParamSpec]]
    hidden: int
    vocab: int
    tied: bool
    embed_name: str = "model.embed_tokens.weight"
    final_norm: str = "model.norm"
    lm_head_vocab: int | None = None
    num_nextn: int = 0
    nextn_layer: Callable[[int], list[ParamSpec]] | None = None


def _layout(c: _Config, layer: Callable[[int], list[ParamSpec]], *, tied_default: bool = False,
            num_layers: int | None = None, **ends: Any) -> _Layout:
    """A layout with the fields every config has; `ends` overrides names, lm_head vocab and NEXTN layers."""
    return _Layout(num_layers=c.need("num_hidden_layers") if num_layers is None else num_layers, layer=layer,
                   hidden=c.need("hidden_size"), vocab=c.need("vocab_size"),
                   tied=c.flag("tie_word_embeddings", tied_default), **ends)


def _llama_like(c: _Config, s: _Shard) -> _Layout:
    """Llama, Mistral, Qwen2 (qkv bias), Qwen3 (q/k norms over head_dim): attention + gated MLP, 2 norms."""
    model_type = str(c.raw.get("model_type", ""))
    bias = c.flag("attention_bias")
    attn = _attention(c, qkv_bias=bias or model_type == "qwen2", o_bias=bias, qk_norm=model_type == "qwen3")
    hidden, inter, mlp_bias = attn.hidden, c.need("intermediate_size"), c.flag("mlp_bias")

    def layer(i: int) -> list[ParamSpec]:
        p = f"model.layers.{i}."
        return ([_norm(f"{p}input_layernorm", hidden)] + attn.specs(f"{p}self_attn.", s)
                + [_norm(f"{p}post_attention_layernorm", hidden)]
                + _gated_mlp(f"{p}mlp.", hidden, inter, s, bias=mlp_bias))

    return _layout(c, layer)


def _mixtral(c: _Config, s: _Shard) -> _Layout:
    """Mixtral: Llama attention; num_local_experts gated experts behind a router."""
    attn = _attention(c)
    hidden, inter, n = attn.hidden, c.need("intermediate_size"), c.need("num_local_experts")

    def layer(i: int) -> list[ParamSpec]:
        p = f"model.layers.{i}."
        return ([_norm(f"{p}input_layernorm", hidden)] + attn.specs(f"{p}self_attn.", s)
                + [_norm(f"{p}post_attention_layernorm", hidden)] + _router(f"{p}mlp.gate", n, hidden)
                + _experts(f"{p}mlp.", n, hidden, inter, s))

    return _layout(c, layer)


def _gemma2(c: _Config, s: _Shard) -> _Layout:
    """Gemma-2: Llama-shaped layers with norms before and after both attention and MLP; tied by default."""
    attn = _attention(c)
    hidden, inter = attn.hidden, c.need("intermediate_size")
    norms = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm")

    def layer(i: int) -> list[ParamSpec]:
        p = f"model.layers.{i}."
        return ([_norm(f"{p}{n}", hidden) for n in norms] + attn.specs(f"{p}self_attn.", s)
                + _gated_mlp(f"{p}mlp.", hidden, inter, s))

    return _layout(c, layer, tied_default=True)


def _deepseek(c: _Config, s: _Shard) -> _Layout:
    """DeepSeek-V2/V3: MLA attention; dense MLP for the first first_k_dense_replace layers, MoE after."""
    hidden, heads, layers = c.need("hidden_size"), c.need("num_attention_heads"), c.need("num_hidden_layers")
    nope, rope, v_dim = c.need("qk_nope_head_dim"), c.need("qk_rope_head_dim"), c.need("v_head_dim")
    kv_rank, q_rank = c.need("kv_lora_rank"), c.raw.get("q_lora_rank")
    first_dense, freq = c.opt("first_k_dense_replace", 0), c.opt("moe_layer_freq", 1)
    routed = c.opt("n_routed_experts", 0)
    score_bias = c.raw.get("topk_method") == "noaux_tc" or c.raw.get("model_type") == "deepseek_v3"
    h = s.split(heads)

    def attention(p: str) -> list[ParamSpec]:
        if q_rank is None:
            q = _linear(f"{p}q_proj", h * (nope + rope), hidden)
        else:
            q = (_linear(f"{p}q_a_proj", int(q_rank), hidden) + [_norm(f"{p}q_a_layernorm", int(q_rank))]
                 + _linear(f"{p}q_b_proj", h * (nope + rope), int(q_rank)))
        return q + (_linear(f"{p}kv_a_proj_with_mqa", kv_rank + rope, hidden) + [_norm(f"{p}kv_a_layernorm", kv_rank)]
                    + _linear(f"{p}kv_b_proj", h * (nope + v_dim), kv_rank) + _linear(f"{p}o_proj", hidden, h * v_dim))

    def moe(p: str) -> list[ParamSpec]:
        inter, shared = c.need("moe_intermediate_size"), c.opt("n_shared_experts", 0)
        specs = _router(f"{p}gate", routed, hidden)
        if score_bias:
            specs.append(ParamSpec(f"{p}gate.e_score_correction_bias", (routed,), False))
        specs += _experts(p, routed, hidden, inter, s)
        return specs + (_gated_mlp(f"{p}shared_experts.", hidden, inter * shared, s) if shared else [])

    def is_moe(i: int) -> bool:
        return routed > 0 and i >= first_dense and i % freq == 0

    def body(p: str, i: int) -> list[ParamSpec]:
        mlp = moe(f"{p}mlp.") if is_moe(i) else _gated_mlp(f"{p}mlp.", hidden, c.need("intermediate_size"), s)
        return ([_norm(f"{p}input_layernorm", hidden)] + attention(f"{p}self_attn.")
                + [_norm(f"{p}post_attention_layernorm", hidden)] + mlp)

    def nextn_layer(k: int) -> list[ParamSpec]:
        """Numbered after the main layers as in the checkpoint; the decoder layer is of the last layer's kind."""
        p = f"model.layers.{layers + k}."
        return ([_norm(f"{p}enorm", hidden), _norm(f"{p}hnorm", hidden)]
                + _linear(f"{p}eh_proj", hidden, 2 * hidden, quantizable=False)
                + body(p, layers - 1) + [_norm(f"{p}shared_head.norm", hidden)])

    return _layout(c, lambda i: body(f"model.layers.{i}.", i),
                   num_nextn=c.opt("num_nextn_predict_layers", 0), nextn_layer=nextn_layer)


def _gpt_oss(c: _Config, s: _Shard) -> _Layout:
    """gpt-oss: biased attention with per-head sinks; biased experts behind a biased router."""
    attn = _attention(c, qkv_bias=True, o_bias=True, sinks=True)
    hidden, inter, n = attn.hidden, c.need("intermediate_size"), c.need("num_local_experts")

    def layer(i: int) -> list[ParamSpec]:
        p = f"model.layers.{i}."
        return ([_norm(f"{p}input_layernorm", hidden)] + attn.specs(f"{p}self_attn.", s)
                + [_norm(f"{p}post_attention_layernorm", hidden)] + _router(f"{p}mlp.router", n, hidden, bias=True)
                + _experts(f"{p}mlp.", n, hidden, inter, s, bias=True))

    return _layout(c, layer)


def _gated_delta_net(p: str, c: _Config, s: _Shard, hidden: int) -> list[ParamSpec]:
    """Qwen3-Next linear attention: fused q/k/v/z and b/a projections, a depthwise conv over q/k/v, per-head decay."""
    kh, vh = s.split(c.need("linear_num_key_heads")), s.split(c.need("linear_num_value_heads"))
    kd, vd = c.need("linear_key_head_dim"), c.need("linear_value_head_dim")
    conv_dim = 2 * kh * kd + vh * vd
    return (_linear(f"{p}in_proj_qkvz", 2 * kh * kd + 2 * vh * vd, hidden) + _linear(f"{p}in_proj_ba", 2 * vh, hidden)
            + [ParamSpec(f"{p}conv1d.weight", (conv_dim, 1, c.need("linear_conv_kernel_dim")), False),
               ParamSpec(f"{p}dt_bias", (vh,), False), ParamSpec(f"{p}A_log", (vh,), False), _norm(f"{p}norm", vd)]
            + _linear(f"{p}out_proj", hidden, vh * vd))


def _qwen3_next(c: _Config, s: _Shard) -> _Layout:
    """Qwen3-Next: gated full attention every full_attention_interval-th layer, gated delta net elsewhere; MoE."""
    attn = _attention(c, qk_norm=True, gated=True, qkv_bias=c.flag("attention_bias"))
    hidden, interval = attn.hidden, c.need("full_attention_interval")
    dense_only = set(c.raw.get("mlp_only_layers") or ())
    step, experts = c.opt("decoder_sparse_step", 1), c.opt("num_experts", 0)

    def mlp(p: str, i: int) -> list[ParamSpec]:
        if i in dense_only or experts == 0 or (i + 1) % step != 0:
            return _gated_mlp(p, hidden, c.need("intermediate_size"), s)
        shared = c.opt("shared_expert_intermediate_size", 0)
        specs = _router(f"{p}gate", experts, hidden) + _experts(p, experts, hidden, c.need("moe_intermediate_size"), s)
        if shared:
            specs += _gated_mlp(f"{p}shared_expert.", hidden, shared, s) + _router(f"{p}shared_expert_gate", 1, hidden)
        return specs

    def layer(i: int) -> list[ParamSpec]:
        p = f"model.layers.{i}."
        mixer = (attn.specs(f"{p}self_attn.", s) if (i + 1) % interval == 0
                 else _gated_delta_net(f"{p}linear_attn.", c, s, hidden))
        return ([_norm(f"{p}input_layernorm", hidden)] + mixer + [_norm(f"{p}post_attention_layernorm", hidden)]
                + mlp(f"{p}mlp.", i))

    return _layout(c, layer)


def _mamba2(p: str, c: _Config, s: _Shard, hidden: int) -> list[ParamSpec]:
    """A Mamba-2 mixer: in_proj to [z, x, B, C, dt], a depthwise conv over [x, B, C], per-head dt/A/D, gated norm."""
    heads = s.split(c.need("mamba_num_heads"))
    inner = heads * c.need("mamba_head_dim")
    bc = 2 * s.kv_heads(c.need("n_groups")) * c.need("ssm_state_size")
    proj_bias = c.flag("mamba_proj_bias", c.flag("use_bias"))
    conv = [ParamSpec(f"{p}conv1d.weight", (inner + bc, 1, c.need("conv_kernel")), False)]
    if c.flag("use_conv_bias", True):
        conv.append(ParamSpec(f"{p}conv1d.bias", (inner + bc,), False))
    per_head = [ParamSpec(f"{p}{n}", (heads,), False) for n in ("dt_bias", "A_log", "D")]
    return (_linear(f"{p}in_proj", 2 * inner + bc + heads, hidden, bias=proj_bias) + conv + per_head
            + [_norm(f"{p}norm", inner)] + _linear(f"{p}out_proj", hidden, inner, bias=proj_bias))


def _nemotron_h(c: _Config, s: _Shard) -> _Layout:
    """Nemotron-H: hybrid_override_pattern picks each layer: M Mamba-2, * attention, - squared-ReLU MLP."""
    pattern = c.raw.get("hybrid_override_pattern")
    if not pattern:
        raise ValueError(f"{c.arch} config is missing 'hybrid_override_pattern', needed to describe its weights")
    hidden = c.need("hidden_size")
    attn = _attention(c, qkv_bias=c.flag("attention_bias"), o_bias=c.flag("attention_bias"))

    def mixer(p: str, kind: str) -> list[ParamSpec]:
        if kind == "M":
            return _mamba2(p, c, s, hidden)
        if kind == "*":
            return attn.specs(p, s)
        if kind == "-":
            inter, bias = s.split(c.need("intermediate_size")), c.flag("mlp_bias")
            return _linear(f"{p}up_proj", inter, hidden, bias=bias) + _linear(f"{p}down_proj", hidden, inter, bias=bias)
        raise ValueError(f"{c.arch} hybrid_override_pattern has layer kind {kind!r}; supported: 'M', '*', '-'")

    def layer(i: int) -> list[ParamSpec]:
        p = f"backbone.layers.{i}."
        return [_norm(f"{p}norm", hidden)] + mixer(f"{p}mixer.", pattern[i])

    return _layout(c, layer, num_layers=len(pattern), embed_name="backbone.embeddings.weight",
                   final_norm="backbone.norm_f")


def _eagle3(c: _Config, s: _Shard) -> _Layout:
    """EAGLE-3 draft head: fc fuses three target hidden states, one layer attends over [embedding, hidden].

    Its configs say nothing about sharing the target's embedding, so the head counts its
    own embed_tokens (vocab_size x hidden); a caller that shares passes include_embedding=False.
    The lm_head is draft_vocab_size rows when given. fc belongs to the one layer it feeds.
    """
    hidden = c.need("hidden_size")
    attn = _attention(c, input_size=2 * hidden)
    fc_in = 3 * c.opt("target_hidden_size", hidden)

    def layer(i: int) -> list[ParamSpec]:
        p = "midlayer."
        return (_linear("fc", hidden, fc_in, bias=c.flag("bias"), quantizable=False)
                + [_norm(f"{p}input_layernorm", hidden), _norm(f"{p}hidden_norm", hidden)]
                + attn.specs(f"{p}self_attn.", s) + [_norm(f"{p}post_attention_layernorm", hidden)]
                + _gated_mlp(f"{p}mlp.", hidden, c.need("intermediate_size"), s))

    return _layout(c, layer, num_layers=1, embed_name="embed_tokens.weight", final_norm="norm",
                   lm_head_vocab=c.opt("draft_vocab_size", c.need("vocab_size")))


_BY_ARCHITECTURE: dict[str, Callable[[_Config, _Shard], _Layout]] = {
    "LlamaForCausalLM": _llama_like, "MistralForCausalLM": _llama_like, "Qwen2ForCausalLM": _llama_like,
    "Qwen3ForCausalLM": _llama_like, "MixtralForCausalLM": _mixtral, "Gemma2ForCausalLM": _gemma2,
    "DeepseekV2ForCausalLM": _deepseek, "DeepseekV3ForCausalLM": _deepseek, "GptOssForCausalLM": _gpt_oss,
    "Qwen3NextForCausalLM": _qwen3_next, "NemotronHForCausalLM": _nemotron_h,
}
_BY_MODEL_TYPE: dict[str, Callable[[_Config, _Shard], _Layout]] = {
    "llama": _llama_like, "mistral": _llama_like, "qwen2": _llama_like, "qwen3": _llama_like, "mixtral": _mixtral,
    "gemma2": _gemma2, "deepseek_v2": _deepseek, "deepseek_v3": _deepseek, "gpt_oss": _gpt_oss,
    "qwen3_next": _qwen3_next, "nemotron_h": _nemotron_h,
}


def _layout_for(hf_config: Mapping[str, Any], shard: _Shard) -> _Layout:
    """Dispatch: an EAGLE-3 head first (its model_type is the target's), then architectures[0], then model_type."""
    archs = [str(a) for a in hf_config.get("architectures") or ()]
    model_type = str(hf_config.get("model_type", ""))
    name = archs[0] if archs else model_type or "<no architectures or model_type>"
    if any("Eagle3" in a for a in archs):
        return _eagle3(_Config(hf_config, name), shard)
    build = _BY_ARCHITECTURE.get(name) or _BY_MODEL_TYPE.get(model_type)
    if build is None:
        supported = ", ".join([*_BY_ARCHITECTURE, "*Eagle3*"])
        raise ValueError(f"no weight layout for architecture {name!r} (model_type {model_type!r}); "
                         f"supported: {supported}")
    return build(_Config(hf_config, name), shard)


# ---- quantization ------------------------------------------------------------------------------------


def _excluded(name: str, patterns: Sequence[str]) -> bool:
    """A module pattern (glob, or 're:' regex as compressed-tensors writes) covers a tensor of that module."""
    for pattern in patterns:
        if pattern.startswith("re:"):
            if re.match(pattern[3:], name):
                return True
        elif fnmatchcase(name, pattern) or fnmatchcase(name, f"{pattern}.*"):
            return True
    return False


def _resolve_quantization(specs: list[ParamSpec], hf_config: Mapping[str, Any]) -> tuple[ParamSpec, ...]:
    """Keep `quantized` only on quantizable weights the checkpoint's quantization_config does not exempt."""
    quant = hf_config.get("quantization_config") or {}
    patterns = [str(p) for key in ("modules_to_not_convert", "ignored_layers", "ignore") for p in quant.get(key) or ()]
    return tuple(replace(spec, quantized=bool(quant) and not _excluded(spec.name, patterns)) if spec.quantized else spec
                 for spec in specs)


# ---- public ----------------------------------------------------------------------------------------------


def _checked_range(start: int, end: int | None, count: int, what: str) -> range:
    stop = count if end is None else end
    if not 0 <= start <= stop <= count:
        raise ValueError(f"layer range [{start}, {stop}) is outside the model's {count} {what}")
    return range(start, stop)


def parameter_specs(
    hf_config: Mapping[str, Any], *, tp_size: int = 1, layer_start: int = 0, layer_end: int | None = None,
    include_embedding: bool = True, include_lm_head: bool = True, nextn: bool = False,
) -> tuple[ParamSpec, ...]:
    """This rank's parameter tensors: layers [layer_start, layer_end), the ends by the flags.

    The final norm lives with lm_head (the last pipeline stage). Tied embeddings count
    once, unless this stage has lm_head without the embedding. nextn=True: only the
    NEXTN/MTP layers (range indexes them); they share the target's embedding and lm_head.
    """
    if tp_size < 1:
        raise ValueError(f"tp_size must be at least 1, got {tp_size}")
    shard = _Shard(tp_size)
    layout = _layout_for(hf_config, shard)
    if nextn:
        if layout.num_nextn == 0 or layout.nextn_layer is None:
            raise ValueError("nextn=True but the config has no NEXTN layers "
                             "('num_nextn_predict_layers' is missing or 0)")
        nextn_layer = layout.nextn_layer
        layers = _checked_range(layer_start, layer_end, layout.num_nextn, "NEXTN layers")
        return _resolve_quantization([t for k in layers for t in nextn_layer(k)], hf_config)
    layers = _checked_range(layer_start, layer_end, layout.num_layers, "layers")
    vocab = shard.split(layout.vocab)
    specs = [ParamSpec(layout.embed_name, (vocab, layout.hidden), False)] if include_embedding else []
    specs += [t for i in layers for t in layout.layer(i)]
    if include_lm_head:
        specs.append(_norm(layout.final_norm, layout.hidden))
        head_vocab = vocab if layout.lm_head_vocab is None else shard.split(layout.lm_head_vocab)
        if not (layout.tied and include_embedding and layout.lm_head_vocab is None):
            specs.append(ParamSpec("lm_head.weight", (head_vocab, layout.hidden), False))
    return _resolve_quantization(specs, hf_config)


def count_parameters(
    hf_config: Mapping[str, Any], *, tp_size: int = 1, layer_start: int = 0, layer_end: int | None = None,
    include_embedding: bool = True, include_lm_head: bool = True, nextn: bool = False,
) -> int:
    """Parameters this rank holds: the sum of parameter_specs' element counts."""
    specs = parameter_specs(hf_config, tp_size=tp_size, layer_start=layer_start, layer_end=layer_end,
                            include_embedding=include_embedding, include_lm_head=include_lm_head, nextn=nextn)
    return sum(spec.numel for spec in specs)
