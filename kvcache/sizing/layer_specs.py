"""Layer specs: one small frozen type per layer kind, each owning its cache bytes.

Per-token kinds (full and sliding attention, MLA) know `bytes_per_token`; recurrent kinds (Mamba-2, gated delta
net) know `bytes_per_request`. `model_layer_specs` derives a rank's specs from ModelConfig + ParallelState + KV dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvcache.sizing.dsa_latent import DSAFp8Latent
from kvcache.inputs.dtypes import FLOAT32, DType, KVCacheDtype
from kvcache.errors import ConfigError, ModelConfigFieldError, UnsupportedModelError
from kvcache.models.model_config import INDEX_SCALE_BLOCK, STATE_LAYER_KINDS, ModelConfig
from kvcache.inputs.parallel import ParallelState
from kvcache.arithmetic import ceil_div
from kvcache.sizing.tensor_plan import PlannedTensor, row_bytes, tensor


def cache_row(name: str, heads: int, dim: int, dtype: KVCacheDtype) -> tuple[PlannedTensor, ...]:
    """One token's [heads, dim] cache tensor in a KV dtype: the data, and FP4's scale bytes beside it."""
    data = tensor(name, (heads, dtype.data_elements(dim)), dtype.storage_dtype.name)
    if not dtype.scale_group:
        return (data,)
    return data, tensor(f"{name}_scales", (heads, dtype.scale_elements(dim)), "uint8")


@dataclass(frozen=True, slots=True)
class AttentionSpec:
    """MHA/GQA K and V of kv_heads heads per token: what full and sliding-window attention share."""

    kv_heads: int
    head_dim: int
    v_head_dim: int
    dtype: KVCacheDtype

    def row_tensors(self) -> tuple[PlannedTensor, ...]:
        """One token's tensors in one layer: K (and its FP4 scales), then V (and its scales)."""
        return cache_row("k", self.kv_heads, self.head_dim, self.dtype) + cache_row("v", self.kv_heads, self.v_head_dim, self.dtype)

    @property
    def bytes_per_token(self) -> int:
        return row_bytes(self.row_tensors())


@dataclass(frozen=True, slots=True)
class FullAttentionSpec(AttentionSpec):
    """Full attention: every token stays live. Pool kind 'full'."""

    pool_kind = "full"


@dataclass(frozen=True, slots=True)
class SlidingWindowSpec(AttentionSpec):
    """Sliding-window attention: like full attention, but only `window` tokens stay live."""

    window: int

    pool_kind = "swa"


@dataclass(frozen=True, slots=True)
class MLASpec:
    """Multi-head latent attention: one latent of kv_lora_rank + qk_rope_head_dim per token.

    DeepSeek-V3.2 (sparse attention) adds the indexer's key per token: index_head_dim fp8
    bytes plus a float32 scale per 128 (SGLang 0.5.23's DSA pool), whatever the KV dtype;
    with an fp8_e4m3 KV cache its latent is packed with scales and a bfloat16 RoPE part
    (kvcache.sizing.dsa_latent), as SGLang 0.5.23 stores it.
    """

    kv_lora_rank: int
    qk_rope_head_dim: int
    dtype: KVCacheDtype
    index_head_dim: int = 0

    pool_kind = "mla"

    @property
    def index_bytes_per_token(self) -> int:
        """The indexer's fp8 key and its float32 scales (0 without an indexer)."""
        return self.index_head_dim + self.index_head_dim // INDEX_SCALE_BLOCK * 4

    def row_tensors(self) -> tuple[PlannedTensor, ...]:
        """One token's tensors in one layer: the latent (plain, FP4 with scales, or DSA's packed fp8 row), then
        the indexer's key row (uint8: fp8 keys and their float32 scales) for a sparse-attention model."""
        packed = self.packed_latent
        if packed is None:
            latent = cache_row("latent", 1, self.kv_lora_rank + self.qk_rope_head_dim, self.dtype)
        else:
            latent = (tensor("latent", (1, packed.row_bytes), "uint8"),)
        index = (tensor("index_k", (self.index_bytes_per_token,), "uint8"),) if self.index_head_dim else ()
        return latent + index

    @property
    def packed_latent(self) -> DSAFp8Latent | None:
        """The packed fp8 latent layout of a sparse-attention model in fp8_e4m3, else None (plain rows)."""
        if self.index_head_dim and self.dtype.name == "fp8_e4m3":
            return DSAFp8Latent(self.kv_lora_rank, self.qk_rope_head_dim)
        return None

    @property
    def latent_bytes_per_token(self) -> int:
        """One token's latent (compressed KV and RoPE key) in one layer, scales included."""
        return self.bytes_per_token - self.index_bytes_per_token

    @property
    def bytes_per_token(self) -> int:
        return row_bytes(self.row_tensors())


@dataclass(frozen=True, slots=True)
class RecurrentStateSpec:
    """Per-request state of a Mamba-2 or gated-delta-net layer: a conv window and an SSM state."""

    kind: str
    conv_shape: tuple[int, ...]
    ssm_shape: tuple[int, ...]
    conv_dtype: DType
    ssm_dtype: DType

    pool_kind = "state"

    def slot_tensors(self) -> tuple[PlannedTensor, ...]:
        """One request slot's tensors in one layer: the SSM state first (the wider dtype keeps alignment), then
        the conv window."""
        return (tensor("ssm", self.ssm_shape, self.ssm_dtype.name),
                tensor("conv", self.conv_shape, self.conv_dtype.name))

    @property
    def bytes_per_request(self) -> int:
        return row_bytes(self.slot_tensors())


TokenSpec = FullAttentionSpec | SlidingWindowSpec | MLASpec
LayerSpec = TokenSpec | RecurrentStateSpec


@dataclass(frozen=True, slots=True)
class LayerPlacement:
    """One cached layer: its global index in the model and its spec (MLP-only layers have none)."""

    layer_id: int
    spec: LayerSpec


def tensor_parallel_rules(model: ModelConfig) -> tuple[tuple[str, int, bool], ...]:
    """What attention TP must split evenly, as SGLang 0.5.23's layers assert: (what, count, may_replicate).

    Query heads split; KV heads split, or replicate when TP is a multiple of them; MLA's latent is whole on every
    rank; linear-attention and Mamba heads split; Mamba-2 groups split unless there is one (MambaMixer2 asserts so
    in SGLang's layers/attention/mamba/mamba.py and vLLM's mamba_mixer2.py).
    """
    rules: list[tuple[str, int, bool]] = []
    if model.kv_layer_count:
        rules.append(("attention heads (num_attention_heads)", model.num_attention_heads, False))
        if "mla" not in model.layer_kinds:
            rules.append(("KV heads (num_key_value_heads)", model.num_key_value_heads, True))
    for field in ("linear_num_key_heads", "linear_num_value_heads", "mamba_num_heads"):
        value = getattr(model, field)
        if value and any(k in STATE_LAYER_KINDS for k in model.layer_kinds):
            rules.append((field, value, False))
    if (model.mamba_n_groups or 0) > 1 and any(k in STATE_LAYER_KINDS for k in model.layer_kinds):
        rules.append(("Mamba groups (n_groups)", model.mamba_n_groups, False))
    return tuple(rules)


def _fits(tp: int, count: int, may_replicate: bool) -> bool:
    return count % tp == 0 or (may_replicate and tp % count == 0)


MAX_TP_SIZE = 1024


def tensor_parallel_sizes(model: ModelConfig, up_to: int = MAX_TP_SIZE) -> list[int]:
    """The attention TP sizes 1..up_to that split the model's heads (tensor_parallel_rules), ascending."""
    rules = tensor_parallel_rules(model)
    return [t for t in range(1, up_to + 1) if all(_fits(t, c, r) for _, c, r in rules)]


def check_tensor_parallel(model: ModelConfig, attention_tp: int) -> None:
    """Refuse an attention TP size that does not split the model's heads, listing the sizes that do."""
    rules = tensor_parallel_rules(model)
    broken = [(what, count, rep) for what, count, rep in rules if not _fits(attention_tp, count, rep)]
    if not broken:
        return
    working = tensor_parallel_sizes(model)
    why = "; ".join(f"its {count} {what} must divide by it" + (" or it by them" if rep else "")
                    for what, count, rep in broken)
    raise ConfigError(
        f"--tp-size {attention_tp} (attention TP) does not fit {model.name}: {why}; "
        f"attention TP sizes that work: {', '.join(map(str, working[:16]))}"
    )


# Layers that run two mixers side by side (Falcon-H1; Zamba-2's hybrid layers) cache for both.
WINDOW_KINDS = frozenset({"sliding_attention", "chunked_attention"})  # attend a window: a pool of their own, or not
PARALLEL_MIXERS: dict[str, tuple[str, str]] = {"attention_mamba2": ("full_attention", "mamba2")}


def model_layer_specs(
    model: ModelConfig,
    parallel: ParallelState,
    kv_dtype: KVCacheDtype,
    *,
    model_dtype: DType,
    ssm_dtype: DType = FLOAT32,
    layer_ids: range | None = None,
    window_pools: bool = True,
) -> tuple[LayerPlacement, ...]:
    """The specs of this rank's cached layers (its pipeline range unless `layer_ids` is given).

    With `window_pools` False (the engine keeps one full pool, as SGLang 0.5.23 does outside its hybrid-SWA
    list) a sliding or chunked layer caches every token like a full one: its window limits what it attends,
    not what the pool holds."""
    check_tensor_parallel(model, parallel.attention_tp_size)
    ids = layer_ids if layer_ids is not None else parallel.layer_range(model.num_hidden_layers)
    placements: list[LayerPlacement] = []
    for i in ids:
        for kind in PARALLEL_MIXERS.get(model.layer_kinds[i], (model.layer_kinds[i],)):
            if not window_pools and kind in WINDOW_KINDS:
                kind = "full_attention"
            spec = _spec_for(kind, model, parallel, kv_dtype, model_dtype, ssm_dtype)
            if spec is not None:
                placements.append(LayerPlacement(layer_id=i, spec=spec))
    return tuple(placements)


def _spec_for(
    kind: str, m: ModelConfig, p: ParallelState, kv: KVCacheDtype, model_dtype: DType, ssm_dtype: DType
) -> LayerSpec | None:
    heads = p.heads_per_rank(m.num_key_value_heads)
    if kind == "full_attention":
        return FullAttentionSpec(heads, m.head_dim, m.v_head_dim, kv)
    if kind == "sliding_attention":
        return SlidingWindowSpec(heads, m.head_dim, m.v_head_dim, kv, _needed(m, "sliding_window"))
    if kind == "chunked_attention":
        # Llama-4's chunked local attention: only the current chunk's tokens stay live, so it is
        # a sliding pool of attention_chunk_size tokens (SGLang 0.5.23 sizes it the same way)
        chunk = _needed(m, "attention_chunk_size")
        return SlidingWindowSpec(heads, m.head_dim, m.v_head_dim, kv, chunk)
    if kind == "mla":
        return MLASpec(_needed(m, "kv_lora_rank"), _needed(m, "qk_rope_head_dim"),
                       kv, index_head_dim=m.index_head_dim or 0)
    if kind in ("linear_attention", "kda"):
        return _gated_delta_net_spec(m, p, model_dtype, ssm_dtype, kind)
    if kind == "mamba2":
        return _mamba2_spec(m, p, model_dtype, ssm_dtype)
    if kind == "mlp":
        return None
    raise UnsupportedModelError(f"{m.name}: layer kind {kind!r} has no cache spec")


def _needed(m: ModelConfig, field: str, *, low: int = 1) -> int:
    """A ModelConfig field a layer kind needs, checked as an integer >= low (ModelConfigFieldError otherwise).

    The config.json readers check these already; this guards a ModelConfig built or replaced by hand,
    where an `assert` would be an AssertionError (or, under `python -O`, a silently wrong size)."""
    value = getattr(m, field)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        need = "a positive integer" if low == 1 else f"an integer of at least {low}"
        raise ModelConfigFieldError(
            f"{m.name}: ModelConfig field '{field}' is {value!r}; expected {need} "
            f"(config.json's {field} or its alias), which its {', '.join(sorted(set(m.layer_kinds) - {'mlp'}))} layers need"
        )
    return value


def _gated_delta_net_spec(m: ModelConfig, p: ParallelState, conv_dtype: DType, ssm_dtype: DType,
                          kind: str) -> RecurrentStateSpec:
    """Delta-rule linear attention (Qwen3-Next's gated delta net, Kimi's KDA): conv over q, k (key heads)
    and v (value heads); state per value head. SGLang 0.5.23 shapes both the same way."""
    k_heads = p.split_per_rank(_needed(m, "linear_num_key_heads"), "linear_num_key_heads")
    v_heads = p.split_per_rank(_needed(m, "linear_num_value_heads"), "linear_num_value_heads")
    key_dim, value_dim = _needed(m, "linear_key_head_dim"), _needed(m, "linear_value_head_dim")
    conv_dim = 2 * k_heads * key_dim + v_heads * value_dim
    return RecurrentStateSpec(
        kind="gated_delta_net" if kind == "linear_attention" else "kda",
        conv_shape=(conv_dim, _needed(m, "linear_conv_kernel_dim", low=2) - 1),
        ssm_shape=(v_heads, key_dim, value_dim),
        conv_dtype=conv_dtype,
        ssm_dtype=ssm_dtype,
    )


def _mamba2_spec(m: ModelConfig, p: ParallelState, conv_dtype: DType, ssm_dtype: DType) -> RecurrentStateSpec:
    """Mamba-2: conv over x (heads x head_dim), B and C (groups x state); SSM state per head."""
    heads = p.split_per_rank(_needed(m, "mamba_num_heads"), "mamba_num_heads")
    head_dim, state = _needed(m, "mamba_head_dim"), _needed(m, "ssm_state_size")
    # groups split over TP (tensor_parallel_rules); a single group is copied to every rank, as SGLang and
    # vLLM do; 0 for Mamba-1: B and C come after the conv, so it convolves x only
    groups = ceil_div(_needed(m, "mamba_n_groups", low=0), p.attention_tp_size)
    conv_dim = heads * head_dim + 2 * groups * state
    return RecurrentStateSpec(
        kind="mamba2",
        conv_shape=(conv_dim, _needed(m, "mamba_conv_kernel", low=2) - 1),
        ssm_shape=(heads, head_dim, state),
        conv_dtype=conv_dtype,
        ssm_dtype=ssm_dtype,
    )
