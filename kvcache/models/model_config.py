"""ModelConfig: what KV sizing needs from a Hugging Face config.json, read once.

`kvcache.models.hf_config.model_config_from_hf(path or dict)` reads it once through the family
registry (or the generic decoder reader): the cache description here and the per-rank weight
layout in `weights`. It keeps the raw HF dict it came from. This module imports no reader, so the
readers can build a ModelConfig without an import circle.
"""

from __future__ import annotations

from typing import Any, Literal, Mapping

import msgspec

from kvcache.errors import ConfigError

from kvcache.models.weights_layout import WeightLayout

LayerKind = Literal[
    "full_attention", "sliding_attention", "chunked_attention", "mla", "linear_attention", "kda", "mamba2",
    "attention_mamba2", "mlp",
]
KV_LAYER_KINDS: frozenset[str] = frozenset(
    {"full_attention", "sliding_attention", "chunked_attention", "mla", "attention_mamba2"})
STATE_LAYER_KINDS: frozenset[str] = frozenset({"linear_attention", "kda", "mamba2", "attention_mamba2"})
VisionWeights = Literal["none", "counted", "not_counted", "not_loaded"]  # not_loaded: the engine builds no tower
# the DSA indexer key's fp8 values per float32 scale: the reader refuses an index_head_dim that is not a
# multiple of it, and the indexer key cache is sized by it (kvcache.sizing.layer_specs)
INDEX_SCALE_BLOCK = 128


class ModelConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One model's shape, as far as caching goes. Built by `kvcache.models.hf_config.model_config_from_hf`."""

    name: str
    architecture: str
    model_type: str
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    v_head_dim: int
    vocab_size: int
    max_position_embeddings: int
    checkpoint_dtype: str | None
    layer_kinds: tuple[LayerKind, ...]
    weights: WeightLayout
    sliding_window: int | None = None
    # Llama-4: chunked local attention keeps the tokens of the current chunk only
    attention_chunk_size: int | None = None
    # MLA (DeepSeek-V2/V3, Kimi-K2); DeepSeek-V3.2 adds the indexer's fp8 key cache
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    index_head_dim: int | None = None
    # gated-delta-net linear attention (Qwen3-Next, Qwen3.5) and Kimi delta attention (KDA)
    linear_num_key_heads: int | None = None
    linear_num_value_heads: int | None = None
    linear_key_head_dim: int | None = None
    linear_value_head_dim: int | None = None
    linear_conv_kernel_dim: int | None = None
    # Mamba-2 (Nemotron-H)
    mamba_num_heads: int | None = None
    mamba_head_dim: int | None = None
    ssm_state_size: int | None = None
    mamba_n_groups: int | None = None
    mamba_conv_kernel: int | None = None
    # speculative decoding: the cache kinds of the MTP (NEXTN) layers the checkpoint holds, one per layer of
    # weights.nextn_layers; only a NEXTN draft loads and caches them (nextn_draft), as in SGLang 0.5.23
    nextn_layer_kinds: tuple[LayerKind, ...] = ()
    is_draft_head: bool = False
    nextn_of_target: bool = False  # a NEXTN draft: its weights are the target's MTP layers
    # multimodal: the vision tower's weights are counted when its config gives its shapes
    vision_weights: VisionWeights = "none"
    # numerics a forward pass needs (validated like every other field)
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10_000.0
    hf_config: dict[str, Any] = msgspec.field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.layer_kinds) != self.num_hidden_layers:
            raise ConfigError(
                f"{self.name}: {len(self.layer_kinds)} layer kinds for {self.num_hidden_layers} layers"
            )
        if not self.nextn_of_target and len(self.nextn_layer_kinds) != len(self.weights.nextn_layers):
            raise ConfigError(
                f"{self.name}: {len(self.nextn_layer_kinds)} NEXTN layer kinds for {len(self.weights.nextn_layers)} layers"
            )

    def nextn_draft(self) -> "ModelConfig":
        """The model's own next-token-prediction layers as a draft model (NEXTN / MTP)."""
        kinds = self.nextn_layer_kinds
        if not kinds:
            declared = _declared_mtp_field(self.hf_config)
            what = (f"declares MTP layers ({declared}) that this engine does not model for {self.architecture}"
                    if declared else "has no next-token-prediction layers (MTP) in its config.json")
            raise ConfigError(
                f"{self.name} {what}; NEXTN is modelled for the MTP layers of DeepSeek-V3/V3.2, GLM-5, Qwen3-Next, "
                "Qwen3.5, MiMo and Nemotron-3 Super/Ultra; use EAGLE with --speculative-draft-model instead"
            )
        return msgspec.structs.replace(
            self, name=f"{self.name} (NEXTN)", num_hidden_layers=len(kinds), layer_kinds=kinds,
            nextn_layer_kinds=(), is_draft_head=True, nextn_of_target=True,
        )

    @property
    def kv_layer_count(self) -> int:
        """Layers that keep per-token KV (full, sliding or MLA attention)."""
        return sum(kind in KV_LAYER_KINDS for kind in self.layer_kinds)

    @property
    def is_hybrid(self) -> bool:
        return len({k for k in self.layer_kinds if k != "mlp"}) > 1 or any(
            k in STATE_LAYER_KINDS for k in self.layer_kinds
        )

    def context_length(self, requested: int | None, *, allow_long_context: bool = False) -> int:
        """The engine's context length: the model's, or a requested one that does not exceed it."""
        if requested is None:
            return self.max_position_embeddings
        if requested > self.max_position_embeddings and not allow_long_context:
            raise ConfigError(
                f"--context-length {requested} is longer than {self.name}'s max_position_embeddings "
                f"{self.max_position_embeddings}; use at most {self.max_position_embeddings}, or pass "
                "--allow-long-context if the model really extrapolates"
            )
        return requested


def _declared_mtp_field(hf: Mapping[str, Any]) -> str | None:
    """'name value' of a positive MTP layer count in config.json (or its text_config), else None."""
    text = hf.get("text_config")
    for section in (hf, text if isinstance(text, Mapping) else {}):
        for name in ("num_nextn_predict_layers", "mtp_num_hidden_layers"):
            value = section.get(name)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return f"{name} {value}"
    return None
