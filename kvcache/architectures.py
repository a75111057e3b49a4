"""Architecture readers: one small function per model family, HF dict -> ModelConfig.

A new architecture adds a reader and a line in `READERS`; the planner never
branches on model names. Missing fields fail with the field's name.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from kvcache.errors import UnsupportedModelError
from kvcache.model_config import LayerKind, ModelConfig

Reader = Callable[[Mapping[str, Any], str], ModelConfig]


def require(hf: Mapping[str, Any], field: str, name: str) -> Any:
    """hf[field], or an error that names the field and the model."""
    value = hf.get(field)
    if value is None:
        raise UnsupportedModelError(f"{name}: config.json has no {field!r}, which this architecture needs")
    return value


def _common(hf: Mapping[str, Any], name: str, layer_kinds: list[LayerKind], **extra: Any) -> ModelConfig:
    """Fields every family shares; GQA heads and head_dim as HF defines them."""
    heads = int(require(hf, "num_attention_heads", name))
    hidden = int(require(hf, "hidden_size", name))
    head_dim = int(hf.get("head_dim") or hf.get("attention_head_dim") or hidden // heads)
    fields: dict[str, Any] = dict(
        name=name,
        architecture=str((hf.get("architectures") or [hf.get("model_type")])[0]),
        model_type=str(hf.get("model_type", "")),
        hidden_size=hidden,
        num_hidden_layers=int(require(hf, "num_hidden_layers", name)),
        num_attention_heads=heads,
        num_key_value_heads=int(hf.get("num_key_value_heads") or heads),
        head_dim=head_dim,
        v_head_dim=head_dim,
        vocab_size=int(require(hf, "vocab_size", name)),
        max_position_embeddings=int(require(hf, "max_position_embeddings", name)),
        checkpoint_dtype=hf.get("torch_dtype") or hf.get("dtype"),
        layer_kinds=tuple(layer_kinds),
        hf_config=dict(hf),
    )
    fields.update(extra)
    return ModelConfig(**fields)


def _layers(hf: Mapping[str, Any], name: str) -> int:
    return int(require(hf, "num_hidden_layers", name))


def read_dense(hf: Mapping[str, Any], name: str) -> ModelConfig:
    """Llama, Qwen2/3, Mixtral, Mistral...: GQA; sliding only where the config turns it on.

    Mistral-style configs with `sliding_window` set (and no `use_sliding_window: false`)
    slide on every layer; Qwen2/3 slide on layers >= max_window_layers when
    `use_sliding_window` is true.
    """
    n = _layers(hf, name)
    window = hf.get("sliding_window")
    if "layer_types" in hf:
        return _from_layer_types(hf, name)
    if window and hf.get("use_sliding_window", True):
        first_sliding = int(hf.get("max_window_layers", 0)) if "use_sliding_window" in hf else 0
        kinds: list[LayerKind] = ["full_attention" if i < first_sliding else "sliding_attention" for i in range(n)]
        return _common(hf, name, kinds, sliding_window=int(window))
    return _common(hf, name, ["full_attention"] * n)


def _from_layer_types(hf: Mapping[str, Any], name: str) -> ModelConfig:
    """gpt-oss, Gemma-3 and newer configs list each layer's attention kind."""
    mapping: dict[str, LayerKind] = {"full_attention": "full_attention", "sliding_attention": "sliding_attention"}
    kinds: list[LayerKind] = []
    for i, kind in enumerate(hf["layer_types"]):
        if kind not in mapping:
            raise UnsupportedModelError(f"{name}: layer_types[{i}] = {kind!r} is not supported (full_attention, sliding_attention)")
        kinds.append(mapping[kind])
    window = int(require(hf, "sliding_window", name)) if "sliding_attention" in kinds else None
    return _common(hf, name, kinds, sliding_window=window)


def read_gemma(hf: Mapping[str, Any], name: str) -> ModelConfig:
    """Gemma-2 slides on even layers; Gemma-3 on all but every sliding_window_pattern-th."""
    if "layer_types" in hf:
        return _from_layer_types(hf, name)
    n = _layers(hf, name)
    window = int(require(hf, "sliding_window", name))
    pattern = hf.get("sliding_window_pattern")
    if pattern:
        kinds: list[LayerKind] = ["full_attention" if (i + 1) % int(pattern) == 0 else "sliding_attention" for i in range(n)]
    else:
        kinds = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)]
    return _common(hf, name, kinds, sliding_window=window)


def read_deepseek_mla(hf: Mapping[str, Any], name: str) -> ModelConfig:
    """DeepSeek-V2/V3, Kimi-K2: MLA caches one latent of kv_lora_rank + qk_rope_head_dim."""
    n = _layers(hf, name)
    rope = int(require(hf, "qk_rope_head_dim", name))
    nope = int(require(hf, "qk_nope_head_dim", name))
    return _common(
        hf, name, ["mla"] * n,
        kv_lora_rank=int(require(hf, "kv_lora_rank", name)),
        qk_rope_head_dim=rope,
        head_dim=nope + rope,
        v_head_dim=int(require(hf, "v_head_dim", name)),
        num_nextn_predict_layers=int(hf.get("num_nextn_predict_layers") or 0),
    )


def read_qwen3_next(hf: Mapping[str, Any], name: str) -> ModelConfig:
    """Qwen3-Next: every full_attention_interval-th layer is full attention, the rest gated delta net."""
    n = _layers(hf, name)
    interval = int(require(hf, "full_attention_interval", name))
    kinds: list[LayerKind] = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n)]
    return _common(
        hf, name, kinds,
        linear_num_key_heads=int(require(hf, "linear_num_key_heads", name)),
        linear_num_value_heads=int(require(hf, "linear_num_value_heads", name)),
        linear_key_head_dim=int(require(hf, "linear_key_head_dim", name)),
        linear_value_head_dim=int(require(hf, "linear_value_head_dim", name)),
        linear_conv_kernel_dim=int(require(hf, "linear_conv_kernel_dim", name)),
    )


_NEMOTRON_PATTERN: dict[str, LayerKind] = {"M": "mamba2", "*": "full_attention", "-": "mlp", "E": "mlp"}


def read_nemotron_h(hf: Mapping[str, Any], name: str) -> ModelConfig:
    """Nemotron-H: hybrid_override_pattern, M = Mamba-2, * = attention, - = MLP (no cache)."""
    pattern = str(require(hf, "hybrid_override_pattern", name))
    n = _layers(hf, name)
    if len(pattern) != n:
        raise UnsupportedModelError(f"{name}: hybrid_override_pattern has {len(pattern)} layers, num_hidden_layers is {n}")
    unknown = sorted(set(pattern) - set(_NEMOTRON_PATTERN))
    if unknown:
        raise UnsupportedModelError(f"{name}: hybrid_override_pattern holds {unknown}; supported: M, *, -, E")
    return _common(
        hf, name, [_NEMOTRON_PATTERN[c] for c in pattern],
        mamba_num_heads=int(require(hf, "mamba_num_heads", name)),
        mamba_head_dim=int(require(hf, "mamba_head_dim", name)),
        ssm_state_size=int(require(hf, "ssm_state_size", name)),
        mamba_n_groups=int(require(hf, "n_groups", name)),
        mamba_conv_kernel=int(require(hf, "conv_kernel", name)),
    )


def read_eagle_head(hf: Mapping[str, Any], name: str) -> ModelConfig:
    """EAGLE/EAGLE-3 draft heads: Llama-shaped decoder layers (usually one)."""
    config = read_dense(hf, name)
    from msgspec.structs import replace

    return replace(config, is_draft_head=True)


READERS: dict[str, Reader] = {
    "LlamaForCausalLM": read_dense,
    "MistralForCausalLM": read_dense,
    "MixtralForCausalLM": read_dense,
    "Qwen2ForCausalLM": read_dense,
    "Qwen2MoeForCausalLM": read_dense,
    "Qwen3ForCausalLM": read_dense,
    "Qwen3MoeForCausalLM": read_dense,
    "GptOssForCausalLM": read_dense,
    "Gemma2ForCausalLM": read_gemma,
    "Gemma3ForCausalLM": read_gemma,
    "DeepseekV2ForCausalLM": read_deepseek_mla,
    "DeepseekV3ForCausalLM": read_deepseek_mla,
    "KimiK2ForCausalLM": read_deepseek_mla,
    "Qwen3NextForCausalLM": read_qwen3_next,
    "NemotronHForCausalLM": read_nemotron_h,
    "LlamaForCausalLMEagle": read_eagle_head,
    "LlamaForCausalLMEagle3": read_eagle_head,
}


def read_architecture(hf: Mapping[str, Any], *, name: str) -> ModelConfig:
    """Dispatch on architectures[0]; an unknown one fails with the list that is supported."""
    archs = hf.get("architectures")
    if not archs:
        raise UnsupportedModelError(f"{name}: config.json has no 'architectures' list, so its family is unknown")
    reader = READERS.get(str(archs[0]))
    if reader is None:
        raise UnsupportedModelError(
            f"{name}: architecture {archs[0]!r} is not supported; supported: {', '.join(sorted(READERS))}"
        )
    return reader(hf, name)
