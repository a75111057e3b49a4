"""Parameter tensors of a model, from its HF config: names, per-rank shapes, and kind.

Pure description (no device): the dummy loader allocates exactly these. Shapes are
per rank under tensor parallelism: column-parallel outputs (q/k/v/gate/up, experts'
intermediate) and the vocab are split (rounded up), row-parallel inputs (o/down)
likewise, KV heads are max(1, kv_heads // tp), norms are replicated.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Any, Callable, Iterator, Literal, Mapping

ParamKind = Literal["embedding", "norm", "linear", "expert", "router", "bias", "other"]


@dataclass(frozen=True, slots=True)
class ParamSpec:
    """One parameter tensor. `kind` says how a quantized checkpoint stores it."""

    name: str
    shape: tuple[int, ...]
    kind: ParamKind

    @property
    def numel(self) -> int:
        return prod(self.shape)


def _get(hf: Mapping[str, Any], field: str) -> Any:
    value = hf.get(field)
    if value is None:
        raise ValueError(f"config.json has no {field!r}, which counting this model's parameters needs")
    return value


def _split(n: int, tp: int) -> int:
    return -(-n // tp)


@dataclass(frozen=True, slots=True)
class _Dims:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tp: int

    @property
    def q_out(self) -> int:
        return _split(self.heads, self.tp) * self.head_dim

    @property
    def kv_out(self) -> int:
        return max(1, self.kv_heads // self.tp) * self.head_dim


def _dims(hf: Mapping[str, Any], tp: int) -> _Dims:
    hidden = int(_get(hf, "hidden_size"))
    heads = int(_get(hf, "num_attention_heads"))
    head_dim = int(hf.get("head_dim") or hf.get("attention_head_dim") or hidden // heads)
    return _Dims(hidden, heads, int(hf.get("num_key_value_heads") or heads), head_dim, int(_get(hf, "vocab_size")), tp)


Layer = Callable[[Mapping[str, Any], _Dims, int, str], Iterator[ParamSpec]]


def _attention(hf: Mapping[str, Any], d: _Dims, p: str, *, in_dim: int | None = None, gated_q: bool = False) -> Iterator[ParamSpec]:
    """GQA attention: q/k/v/o, biases when attention_bias (or Qwen2), q/k norms for Qwen3."""
    h = in_dim or d.hidden
    q_out = d.q_out * (2 if gated_q else 1)
    yield ParamSpec(f"{p}.q_proj.weight", (q_out, h), "linear")
    yield ParamSpec(f"{p}.k_proj.weight", (d.kv_out, h), "linear")
    yield ParamSpec(f"{p}.v_proj.weight", (d.kv_out, h), "linear")
    yield ParamSpec(f"{p}.o_proj.weight", (d.hidden, d.q_out), "linear")
    model_type = hf.get("model_type", "")
    if hf.get("attention_bias") or model_type == "qwen2":
        yield ParamSpec(f"{p}.q_proj.bias", (q_out,), "bias")
        yield ParamSpec(f"{p}.k_proj.bias", (d.kv_out,), "bias")
        yield ParamSpec(f"{p}.v_proj.bias", (d.kv_out,), "bias")
        if hf.get("attention_bias") and model_type == "gpt_oss":
            yield ParamSpec(f"{p}.o_proj.bias", (d.hidden,), "bias")
    if model_type in ("qwen3", "qwen3_moe", "qwen3_next"):
        yield ParamSpec(f"{p}.q_norm.weight", (d.head_dim,), "norm")
        yield ParamSpec(f"{p}.k_norm.weight", (d.head_dim,), "norm")
    if model_type == "gpt_oss":
        yield ParamSpec(f"{p}.sinks", (_split(d.heads, d.tp),), "other")


def _mlp(d: _Dims, p: str, inter: int, *, gated: bool = True, kind: ParamKind = "linear") -> Iterator[ParamSpec]:
    i = _split(inter, d.tp)
    if gated:
        yield ParamSpec(f"{p}.gate_proj.weight", (i, d.hidden), kind)
    yield ParamSpec(f"{p}.up_proj.weight", (i, d.hidden), kind)
    yield ParamSpec(f"{p}.down_proj.weight", (d.hidden, i), kind)


def _experts(d: _Dims, p: str, n: int, inter: int) -> Iterator[ParamSpec]:
    """n routed experts, each a gated MLP, stored as stacked [n, out, in] tensors."""
    i = _split(inter, d.tp)
    yield ParamSpec(f"{p}.experts.gate_up_proj", (n, 2 * i, d.hidden), "expert")
    yield ParamSpec(f"{p}.experts.down_proj", (n, d.hidden, i), "expert")


def _norms(d: _Dims, p: str, names: tuple[str, ...] = ("input_layernorm", "post_attention_layernorm")) -> Iterator[ParamSpec]:
    for n in names:
        yield ParamSpec(f"{p}.{n}.weight", (d.hidden,), "norm")


def _dense_layer(hf: Mapping[str, Any], d: _Dims, i: int, p: str) -> Iterator[ParamSpec]:
    """Llama, Mistral, Qwen2/3, Gemma-2/3, Mixtral, gpt-oss decoder layers."""
    yield from _attention(hf, d, f"{p}.self_attn")
    model_type = hf.get("model_type", "")
    if model_type in ("gemma2", "gemma3", "gemma3_text"):
        yield from _norms(d, p, ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm"))
    else:
        yield from _norms(d, p)
    experts = hf.get("num_local_experts") or hf.get("num_experts")
    inter = int(_get(hf, "intermediate_size")) if not hf.get("moe_intermediate_size") or not experts else int(hf["moe_intermediate_size"])
    if experts:
        yield ParamSpec(f"{p}.mlp.router.weight", (int(experts), d.hidden), "router")
        yield from _experts(d, f"{p}.mlp", int(experts), inter)
        if model_type == "gpt_oss":
            yield ParamSpec(f"{p}.mlp.router.bias", (int(experts),), "bias")
            yield ParamSpec(f"{p}.mlp.experts.gate_up_proj_bias", (int(experts), 2 * _split(inter, d.tp)), "bias")
            yield ParamSpec(f"{p}.mlp.experts.down_proj_bias", (int(experts), d.hidden), "bias")
    else:
        yield from _mlp(d, f"{p}.mlp", inter)


def _deepseek_layer(hf: Mapping[str, Any], d: _Dims, i: int, p: str) -> Iterator[ParamSpec]:
    """DeepSeek-V2/V3 MLA attention; dense MLP for the first first_k_dense_replace layers, MoE after."""
    rope, nope = int(_get(hf, "qk_rope_head_dim")), int(_get(hf, "qk_nope_head_dim"))
    v_dim, rank = int(_get(hf, "v_head_dim")), int(_get(hf, "kv_lora_rank"))
    heads = _split(d.heads, d.tp)
    a = f"{p}.self_attn"
    q_lora = hf.get("q_lora_rank")
    if q_lora:
        yield ParamSpec(f"{a}.q_a_proj.weight", (int(q_lora), d.hidden), "linear")
        yield ParamSpec(f"{a}.q_a_layernorm.weight", (int(q_lora),), "norm")
        yield ParamSpec(f"{a}.q_b_proj.weight", (heads * (nope + rope), int(q_lora)), "linear")
    else:
        yield ParamSpec(f"{a}.q_proj.weight", (heads * (nope + rope), d.hidden), "linear")
    yield ParamSpec(f"{a}.kv_a_proj_with_mqa.weight", (rank + rope, d.hidden), "linear")
    yield ParamSpec(f"{a}.kv_a_layernorm.weight", (rank,), "norm")
    yield ParamSpec(f"{a}.kv_b_proj.weight", (heads * (nope + v_dim), rank), "linear")
    yield ParamSpec(f"{a}.o_proj.weight", (d.hidden, heads * v_dim), "linear")
    yield from _norms(d, p)
    if i < int(hf.get("first_k_dense_replace", 0)) or not hf.get("n_routed_experts"):
        yield from _mlp(d, f"{p}.mlp", int(_get(hf, "intermediate_size")))
        return
    experts, inter = int(hf["n_routed_experts"]), int(_get(hf, "moe_intermediate_size"))
    yield ParamSpec(f"{p}.mlp.gate.weight", (experts, d.hidden), "router")
    if hf.get("topk_method") == "noaux_tc":
        yield ParamSpec(f"{p}.mlp.gate.e_score_correction_bias", (experts,), "bias")
    yield from _experts(d, f"{p}.mlp", experts, inter)
    shared = int(hf.get("n_shared_experts") or 0)
    if shared:
        yield from _mlp(d, f"{p}.mlp.shared_experts", inter * shared)


def _qwen3_next_layer(hf: Mapping[str, Any], d: _Dims, i: int, p: str) -> Iterator[ParamSpec]:
    """Qwen3-Next: gated full attention every full_attention_interval-th layer, gated delta net otherwise; MoE."""
    if (i + 1) % int(_get(hf, "full_attention_interval")) == 0:
        yield from _attention(hf, d, f"{p}.self_attn", gated_q=True)
    else:
        kh, vh = _split(int(_get(hf, "linear_num_key_heads")), d.tp), _split(int(_get(hf, "linear_num_value_heads")), d.tp)
        kd, vd = int(_get(hf, "linear_key_head_dim")), int(_get(hf, "linear_value_head_dim"))
        conv_dim = 2 * kh * kd + vh * vd
        a = f"{p}.linear_attn"
        yield ParamSpec(f"{a}.in_proj_qkvz.weight", (2 * kh * kd + 2 * vh * vd, d.hidden), "linear")
        yield ParamSpec(f"{a}.in_proj_ba.weight", (2 * vh, d.hidden), "linear")
        yield ParamSpec(f"{a}.conv1d.weight", (conv_dim, 1, int(_get(hf, "linear_conv_kernel_dim"))), "other")
        yield ParamSpec(f"{a}.dt_bias", (vh,), "other")
        yield ParamSpec(f"{a}.A_log", (vh,), "other")
        yield ParamSpec(f"{a}.norm.weight", (vd,), "norm")
        yield ParamSpec(f"{a}.out_proj.weight", (d.hidden, vh * vd), "linear")
    yield from _norms(d, p)
    experts, inter = int(_get(hf, "num_experts")), int(_get(hf, "moe_intermediate_size"))
    yield ParamSpec(f"{p}.mlp.gate.weight", (experts, d.hidden), "router")
    yield from _experts(d, f"{p}.mlp", experts, inter)
    yield from _mlp(d, f"{p}.mlp.shared_expert", int(_get(hf, "shared_expert_intermediate_size")))
    yield ParamSpec(f"{p}.mlp.shared_expert_gate.weight", (1, d.hidden), "router")


def _nemotron_h_layer(hf: Mapping[str, Any], d: _Dims, i: int, p: str) -> Iterator[ParamSpec]:
    """Nemotron-H: M = Mamba-2 mixer, * = attention, - = squared-ReLU MLP; one norm per layer."""
    kind = str(_get(hf, "hybrid_override_pattern"))[i]
    yield ParamSpec(f"{p}.norm.weight", (d.hidden,), "norm")
    m = f"{p}.mixer"
    if kind == "M":
        nh = _split(int(_get(hf, "mamba_num_heads")), d.tp)
        inner = nh * int(_get(hf, "mamba_head_dim"))
        gn = 2 * _split(int(_get(hf, "n_groups")), d.tp) * int(_get(hf, "ssm_state_size"))
        yield ParamSpec(f"{m}.in_proj.weight", (2 * inner + gn + nh, d.hidden), "linear")
        yield ParamSpec(f"{m}.conv1d.weight", (inner + gn, 1, int(_get(hf, "conv_kernel"))), "other")
        if hf.get("use_conv_bias", True):
            yield ParamSpec(f"{m}.conv1d.bias", (inner + gn,), "bias")
        for name in ("dt_bias", "A_log", "D"):
            yield ParamSpec(f"{m}.{name}", (nh,), "other")
        yield ParamSpec(f"{m}.norm.weight", (inner,), "norm")
        yield ParamSpec(f"{m}.out_proj.weight", (d.hidden, inner), "linear")
    elif kind == "*":
        yield from _attention(hf, d, m)
    else:
        yield from _mlp(d, m, int(_get(hf, "intermediate_size")), gated=False)


def _eagle3_layer(hf: Mapping[str, Any], d: _Dims, i: int, p: str) -> Iterator[ParamSpec]:
    """EAGLE-3 head layer: attention over [embedding, hidden] (2 x hidden in), a hidden norm."""
    yield from _attention(hf, d, f"{p}.self_attn", in_dim=2 * d.hidden)
    yield from _norms(d, p, ("input_layernorm", "hidden_norm", "post_attention_layernorm"))
    yield from _mlp(d, f"{p}.mlp", int(_get(hf, "intermediate_size")))


LAYERS: dict[str, Layer] = {
    "LlamaForCausalLM": _dense_layer, "MistralForCausalLM": _dense_layer, "MixtralForCausalLM": _dense_layer,
    "Qwen2ForCausalLM": _dense_layer, "Qwen2MoeForCausalLM": _dense_layer, "Qwen3ForCausalLM": _dense_layer,
    "Qwen3MoeForCausalLM": _dense_layer, "Gemma2ForCausalLM": _dense_layer, "Gemma3ForCausalLM": _dense_layer,
    "GptOssForCausalLM": _dense_layer, "LlamaForCausalLMEagle": _dense_layer,
    "DeepseekV2ForCausalLM": _deepseek_layer, "DeepseekV3ForCausalLM": _deepseek_layer, "KimiK2ForCausalLM": _deepseek_layer,
    "Qwen3NextForCausalLM": _qwen3_next_layer, "NemotronHForCausalLM": _nemotron_h_layer,
    "LlamaForCausalLMEagle3": _eagle3_layer,
}


TIED_BY_DEFAULT = "Gemma configs tie embeddings unless they say otherwise (transformers' Gemma default)."


def parameter_specs(
    hf_config: Mapping[str, Any], *, tp_size: int = 1, layer_start: int = 0, layer_end: int | None = None,
    include_embedding: bool = True, include_lm_head: bool = True, nextn: bool = False,
) -> tuple[ParamSpec, ...]:
    """This rank's parameter tensors. nextn=True: only the model's next-token-prediction layers
    (each a decoder layer plus enorm, hnorm, eh_proj and a head norm; embedding and head are shared)."""
    arch = str((hf_config.get("architectures") or ["?"])[0])
    layer = LAYERS.get(arch)
    if layer is None:
        raise ValueError(f"cannot count parameters of architecture {arch!r}; supported: {', '.join(sorted(LAYERS))}")
    d = _dims(hf_config, tp_size)
    n = int(_get(hf_config, "num_hidden_layers"))
    specs: list[ParamSpec] = []
    if nextn:
        for k in range(int(hf_config.get("num_nextn_predict_layers") or 0)):
            p = f"model.layers.{n + k}"
            specs += [ParamSpec(f"{p}.enorm.weight", (d.hidden,), "norm"), ParamSpec(f"{p}.hnorm.weight", (d.hidden,), "norm"),
                      ParamSpec(f"{p}.eh_proj.weight", (d.hidden, 2 * d.hidden), "linear"),
                      ParamSpec(f"{p}.shared_head.norm.weight", (d.hidden,), "norm")]
            specs += layer(hf_config, d, n - 1, p)
        return tuple(specs)
    vocab = _split(d.vocab, tp_size)
    tied = bool(hf_config.get("tie_word_embeddings", str(hf_config.get("model_type", "")).startswith("gemma")))
    if include_embedding:
        specs.append(ParamSpec("model.embed_tokens.weight", (vocab, d.hidden), "embedding"))
    for i in range(layer_start, n if layer_end is None else layer_end):
        specs += layer(hf_config, d, i, f"model.layers.{i}")
    if include_lm_head:
        specs.append(ParamSpec("model.norm.weight", (d.hidden,), "norm"))
        if arch == "LlamaForCausalLMEagle3":
            specs.append(ParamSpec("fc.weight", (d.hidden, 3 * d.hidden), "linear"))
            draft_vocab = int(hf_config.get("draft_vocab_size") or d.vocab)
            specs.append(ParamSpec("lm_head.weight", (_split(draft_vocab, tp_size), d.hidden), "embedding"))
        elif not (tied and include_embedding):
            specs.append(ParamSpec("lm_head.weight", (vocab, d.hidden), "embedding"))
    return tuple(specs)


def count_parameters(hf_config: Mapping[str, Any], **kwargs: Any) -> int:
    return sum(s.numel for s in parameter_specs(hf_config, **kwargs))
