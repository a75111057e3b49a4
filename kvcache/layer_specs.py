"""Layer specs: one small frozen type per layer kind, each owning its cache bytes.

Per-token kinds (full and sliding attention, MLA) know `bytes_per_token`; recurrent
kinds (Mamba-2, gated delta net) know `bytes_per_request`. `model_layer_specs`
derives a rank's specs from ModelConfig + ParallelState + the KV dtype.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

import torch

from kvcache.dtypes import KVCacheDtype
from kvcache.errors import UnsupportedModelError
from kvcache.model_config import ModelConfig
from kvcache.parallel import ParallelState


def kv_bytes_per_token(kv_heads: int, head_dim: int, v_head_dim: int, dtype: KVCacheDtype) -> int:
    """K and V of one token in one MHA/GQA layer."""
    return dtype.bytes_for(kv_heads * head_dim) + dtype.bytes_for(kv_heads * v_head_dim)


@dataclass(frozen=True, slots=True)
class FullAttentionSpec:
    """MHA/GQA: K and V of kv_heads heads per token. Pool kind 'full'."""

    kv_heads: int
    head_dim: int
    v_head_dim: int
    dtype: KVCacheDtype

    pool_kind = "full"

    @property
    def bytes_per_token(self) -> int:
        return kv_bytes_per_token(self.kv_heads, self.head_dim, self.v_head_dim, self.dtype)


@dataclass(frozen=True, slots=True)
class SlidingWindowSpec:
    """Sliding-window attention: like full attention, but only `window` tokens stay live."""

    kv_heads: int
    head_dim: int
    v_head_dim: int
    dtype: KVCacheDtype
    window: int

    pool_kind = "swa"

    @property
    def bytes_per_token(self) -> int:
        return kv_bytes_per_token(self.kv_heads, self.head_dim, self.v_head_dim, self.dtype)


@dataclass(frozen=True, slots=True)
class MLASpec:
    """Multi-head latent attention: one latent of kv_lora_rank + qk_rope_head_dim per token."""

    kv_lora_rank: int
    qk_rope_head_dim: int
    dtype: KVCacheDtype

    pool_kind = "mla"

    @property
    def bytes_per_token(self) -> int:
        return self.dtype.bytes_for(self.kv_lora_rank + self.qk_rope_head_dim)


@dataclass(frozen=True, slots=True)
class RecurrentStateSpec:
    """Per-request state of a Mamba-2 or gated-delta-net layer: a conv window and an SSM state."""

    kind: str
    conv_shape: tuple[int, ...]
    ssm_shape: tuple[int, ...]
    conv_dtype: torch.dtype
    ssm_dtype: torch.dtype

    pool_kind = "state"

    @property
    def bytes_per_request(self) -> int:
        return prod(self.conv_shape) * self.conv_dtype.itemsize + prod(self.ssm_shape) * self.ssm_dtype.itemsize


TokenSpec = FullAttentionSpec | SlidingWindowSpec | MLASpec
LayerSpec = TokenSpec | RecurrentStateSpec


@dataclass(frozen=True, slots=True)
class LayerPlacement:
    """One cached layer: its global index in the model and its spec (MLP-only layers have none)."""

    layer_id: int
    spec: LayerSpec


def model_layer_specs(
    model: ModelConfig,
    parallel: ParallelState,
    kv_dtype: KVCacheDtype,
    *,
    model_dtype: torch.dtype,
    ssm_dtype: torch.dtype = torch.float32,
    layer_ids: range | None = None,
) -> tuple[LayerPlacement, ...]:
    """The specs of this rank's cached layers (its pipeline range unless `layer_ids` is given)."""
    ids = layer_ids if layer_ids is not None else parallel.layer_range(model.num_hidden_layers)
    placements: list[LayerPlacement] = []
    for i in ids:
        spec = _spec_for(model.layer_kinds[i], model, parallel, kv_dtype, model_dtype, ssm_dtype)
        if spec is not None:
            placements.append(LayerPlacement(layer_id=i, spec=spec))
    return tuple(placements)


def _spec_for(
    kind: str, m: ModelConfig, p: ParallelState, kv: KVCacheDtype, model_dtype: torch.dtype, ssm_dtype: torch.dtype
) -> LayerSpec | None:
    heads = p.heads_per_rank(m.num_key_value_heads)
    if kind == "full_attention":
        return FullAttentionSpec(heads, m.head_dim, m.v_head_dim, kv)
    if kind == "sliding_attention":
        assert m.sliding_window is not None
        return SlidingWindowSpec(heads, m.head_dim, m.v_head_dim, kv, m.sliding_window)
    if kind == "mla":
        assert m.kv_lora_rank is not None and m.qk_rope_head_dim is not None
        return MLASpec(m.kv_lora_rank, m.qk_rope_head_dim, kv)
    if kind == "linear_attention":
        return _gated_delta_net_spec(m, p, model_dtype, ssm_dtype)
    if kind == "mamba2":
        return _mamba2_spec(m, p, model_dtype, ssm_dtype)
    if kind == "mlp":
        return None
    raise UnsupportedModelError(f"{m.name}: layer kind {kind!r} has no cache spec")


def _gated_delta_net_spec(m: ModelConfig, p: ParallelState, conv_dtype: torch.dtype, ssm_dtype: torch.dtype) -> RecurrentStateSpec:
    """Qwen3-Next linear attention: conv over q, k (key heads) and v (value heads); state per value head."""
    assert m.linear_num_key_heads and m.linear_num_value_heads and m.linear_key_head_dim
    assert m.linear_value_head_dim and m.linear_conv_kernel_dim
    k_heads = p.split_per_rank(m.linear_num_key_heads, "linear_num_key_heads")
    v_heads = p.split_per_rank(m.linear_num_value_heads, "linear_num_value_heads")
    conv_dim = 2 * k_heads * m.linear_key_head_dim + v_heads * m.linear_value_head_dim
    return RecurrentStateSpec(
        kind="gated_delta_net",
        conv_shape=(conv_dim, m.linear_conv_kernel_dim - 1),
        ssm_shape=(v_heads, m.linear_key_head_dim, m.linear_value_head_dim),
        conv_dtype=conv_dtype,
        ssm_dtype=ssm_dtype,
    )


def _mamba2_spec(m: ModelConfig, p: ParallelState, conv_dtype: torch.dtype, ssm_dtype: torch.dtype) -> RecurrentStateSpec:
    """Mamba-2: conv over x (heads x head_dim), B and C (groups x state); SSM state per head."""
    assert m.mamba_num_heads and m.mamba_head_dim and m.ssm_state_size and m.mamba_n_groups and m.mamba_conv_kernel
    heads = p.split_per_rank(m.mamba_num_heads, "mamba_num_heads")
    # groups that do not split over TP are extended to one per rank and sharded, as SGLang and vLLM do
    groups = -(-m.mamba_n_groups // p.attention_tp_size)
    conv_dim = heads * m.mamba_head_dim + 2 * groups * m.ssm_state_size
    return RecurrentStateSpec(
        kind="mamba2",
        conv_shape=(conv_dim, m.mamba_conv_kernel - 1),
        ssm_shape=(heads, m.mamba_head_dim, m.ssm_state_size),
        conv_dtype=conv_dtype,
        ssm_dtype=ssm_dtype,
    )
