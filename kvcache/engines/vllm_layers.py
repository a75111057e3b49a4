"""A rank's cached layers as vLLM 0.34.0's planner sees them (its KVCacheSpecs): each layer's kind and page, from the
project's layer specs with the state dtypes vLLM keeps, and the settings a page and a request's blocks depend on.
kvcache.engines.vllm_plan groups them and counts the blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvcache.arithmetic import ceil_div
from kvcache.engines import vllm_rules
from kvcache.errors import ConfigError
from kvcache.inputs.dtypes import DType, KVCacheDtype
from kvcache.inputs.parallel import ParallelState
from kvcache.models.model_config import ModelConfig
from kvcache.sizing.layer_specs import (
    FullAttentionSpec, LayerPlacement, MLASpec, RecurrentStateSpec, SlidingWindowSpec, model_layer_specs,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class VllmSettings:
    """The vLLM settings a plan depends on besides memory."""

    max_model_len: int
    block_size: int | None = None  # --block-size; None: vLLM's default (vllm_rules.DEFAULT_BLOCK_SIZE)
    max_num_batched_tokens: int = 8192  # vllm_rules.default_max_num_batched_tokens for the card
    max_concurrent_batches: int = 1 + vllm_rules.ASYNC_SCHEDULING_EXTRA_BATCHES
    mamba_cache_mode: str = "none"  # "align" where prefix caching is on (vLLM's default), else "none"
    mamba_checkpoint: vllm_rules.MambaCheckpoint = vllm_rules.MambaCheckpoint()  # what align mode adds (vllm_rules)

    @property
    def mamba_blocks_per_request(self) -> int:
        """Blocks a request holds in each Mamba group (vLLM's MambaSpec.max_memory_usage_bytes / page): one state
        in "none"; in "align" the running state, the last block-aligned one and the prefill checkpoint blocks."""
        if self.mamba_cache_mode == "align":
            return 2 + self.mamba_checkpoint.blocks
        return 1

    @property
    def max_in_flight_tokens(self) -> int:
        """Tokens scheduled but not yet settled: what a sliding window keeps beyond its window."""
        return self.max_concurrent_batches * self.max_num_batched_tokens


@dataclass(frozen=True, slots=True, kw_only=True)
class VllmLayer:
    """One cached layer as vLLM's planner sees it (its KVCacheSpec): a kind and its page."""

    kind: str  # "full", "sliding", "chunked", "mla" or "mamba"
    token_bytes: int = 0  # attention kinds: bytes of one token
    state_bytes: int = 0  # mamba: bytes of one request's state
    window: int = 0  # sliding: the window; chunked: the chunk
    block_size: int = 0
    padded_page: int = 0  # 0: not padded

    @property
    def page_bytes(self) -> int:
        """Bytes of one block of this layer (vLLM's page_size_bytes)."""
        if self.padded_page:
            return self.padded_page
        return self.state_bytes if self.kind == "mamba" else self.block_size * self.token_bytes

    def blocks_per_request(self, settings: VllmSettings) -> int:
        """Blocks a request of max_model_len holds at most (vLLM's max_memory_usage_bytes / page)."""
        if self.kind == "mamba":
            return settings.mamba_blocks_per_request
        tokens = settings.max_model_len
        if self.kind == "sliding":
            live = min(self.window - 1 + settings.max_in_flight_tokens, tokens)
            return ceil_div(live, self.block_size) + 1  # the window may start mid-block
        if self.kind == "chunked":
            return ceil_div(min(self.window + settings.max_in_flight_tokens, tokens), self.block_size)
        return ceil_div(tokens, self.block_size)


def vllm_layer_specs(model: ModelConfig, parallel: ParallelState, kv_dtype: KVCacheDtype, *,
                     model_dtype: DType) -> tuple[LayerPlacement, ...]:
    """The project's layer specs of this rank with the recurrent state dtypes vLLM keeps (vllm_rules)."""
    if kv_dtype.bits < 8:
        raise ConfigError(f"--kv-cache-dtype {kv_dtype.name} is not modelled for --engine vllm (vLLM 0.34.0 packs "
                          "FP4 its own way, nvfp4); use --kv-cache-dtype fp8_e4m3 or auto")
    vllm_rules.check_sparse_mla_kv_dtype(model, kv_dtype.name)
    state_kind = "kda" if "kda" in model.layer_kinds else "mamba"
    ssm = vllm_rules.ssm_state_dtype(model.architecture, model.hf_config, state_kind, model_dtype)
    return model_layer_specs(model, parallel, kv_dtype, model_dtype=model_dtype, ssm_dtype=ssm)


def vllm_layers(placements: tuple[LayerPlacement, ...], layer_kinds: tuple[str, ...]) -> tuple[VllmLayer, ...]:
    """The project's layer specs as vLLM's kinds (block sizes unset). A window layer of a model whose
    layer_kinds say chunked_attention (Llama-4) is vLLM's chunked local attention; a sparse-attention
    MLA layer is two (its indexer's key and its latent)."""
    layers = []
    for p in placements:
        spec = p.spec
        if isinstance(spec, FullAttentionSpec):
            layers.append(VllmLayer(kind="full", token_bytes=spec.bytes_per_token))
        elif isinstance(spec, SlidingWindowSpec):
            kind = "chunked" if layer_kinds[p.layer_id] == "chunked_attention" else "sliding"
            layers.append(VllmLayer(kind=kind, token_bytes=spec.bytes_per_token, window=spec.window))
        elif isinstance(spec, MLASpec) and spec.index_head_dim:
            layers.extend(sparse_mla_layers(spec))
        elif isinstance(spec, MLASpec):
            layers.append(VllmLayer(kind="mla", token_bytes=spec.bytes_per_token))
        elif isinstance(spec, RecurrentStateSpec):
            layers.append(VllmLayer(kind="mamba", state_bytes=spec.bytes_per_request))
    return tuple(layers)


def sparse_mla_layers(spec: MLASpec) -> tuple[VllmLayer, VllmLayer]:
    """A sparse-attention MLA layer's two caches as vLLM declares them, in its order: the indexer's key
    (DeepseekV32IndexerCache, index_head_dim + a float32 scale per 128 bytes, the formula MLASpec states),
    then the latent: plain values in the KV dtype, or for fp8 FlashMLA sparse's fp8_ds_mla row, which is the
    656-byte row MLASpec already states for SGLang (512 fp8 NoPE + 4 float32 scales + 64 bf16 RoPE values).
    Both are MLAAttentionSpecs of one block size, so they share one group."""
    return (VllmLayer(kind="mla", token_bytes=spec.index_bytes_per_token),
            VllmLayer(kind="mla", token_bytes=spec.latent_bytes_per_token))
