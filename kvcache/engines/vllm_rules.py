"""vLLM 0.34.0's KV cache rules as data: defaults and per-architecture choices its planner starts from.

Each value cites the vLLM 0.34.0 source it follows (paths under the `vllm/` package). They hold
for a CUDA card with FlashAttention (FlashMLA for MLA), the layer-outer KV layout those backends
leave by default (LBNHC), no speculative decoding and no KV connector; prefix caching on, as vLLM turns
it on for every generative model with attention, which puts hybrid models' Mamba layers in mamba_cache_mode
"align". The planner that uses them is `kvcache.engines.vllm_plan`. The last section holds vLLM's start-up checks
on the settings a plan reads, in one place, each citing where vLLM refuses and naming a value that starts.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvcache.byte_units import GiB
from kvcache.errors import ConfigError
from kvcache.inputs.dtypes import FLOAT32, STATE_DTYPES, DType
from kvcache.models.model_config import ModelConfig

VLLM_VERSION = "0.34.0"

# config/cache.py CacheConfig.DEFAULT_BLOCK_SIZE; FlashAttention keeps it (attention/backends/flash_attn.py)
DEFAULT_BLOCK_SIZE = 64
# the smallest kernel block each backend takes (get_supported_kernel_block_sizes): FlashAttention
# MultipleOf(16), FlashMLA exactly 64; platforms/interface.py _align_hybrid_block_size aligns to them
FLASH_ATTN_KERNEL_BLOCK = 16
FLASH_MLA_KERNEL_BLOCK = 64
# _align_hybrid_block_size: MLA next to Mamba layers takes blocks in multiples of 128 tokens
MLA_MAMBA_BLOCK_ALIGNMENT = 128

# Sparse-attention MLA (DeepSeek-V3.2, GLM-5: models/deepseek_v32/, served on a Hopper card). Each layer
# caches two MLAAttentionSpecs of one block size: the latent (the FlashAttention MLA sparse backend keeps
# kv_lora_rank + qk_rope_head_dim values in the KV dtype; a quantized dtype goes to FlashMLA sparse, which
# stores the fp8_ds_mla row, MLAAttentionImpl.get_fp8_ds_mla_row_bytes) and the indexer's key
# (DeepseekV32IndexerCache: index_head_dim fp8 bytes + a float32 scale per 128, uint8, whatever the KV dtype).
# The indexer's kernel takes blocks of exactly 64 tokens (DeepseekV32IndexerBackend on CUDA), the sparse
# latent backends multiples of 64; a block size it cannot split fails vLLM's select_common_block_size.
SPARSE_MLA_KERNEL_BLOCK = 64
FP8_DS_MLA_HEAD_SIZE = 576  # the only latent width FlashMLA sparse serves with a RoPE part (512 + 64)
# KV dtypes a sparse MLA backend on Hopper accepts, as the project names them: FlashAttention MLA sparse
# takes auto / bfloat16 / float16; fp8 (e4m3) becomes fp8_ds_mla. float32 and fp8_e5m2 have no backend.
SPARSE_MLA_PLAIN_KV_DTYPES = frozenset({"bfloat16", "float16"})
SPARSE_MLA_FP8_KV_DTYPE = "fp8_e4m3"

# config/cache.py resolved_gpu_memory_utilization: 1.0 with the extensible KV cache (on by default
# on CUDA), CacheConfig.DEFAULT_GPU_MEMORY_UTILIZATION = 0.92 without it
DEFAULT_GPU_MEMORY_UTILIZATION = 1.0
GPU_MEMORY_UTILIZATION_WITHOUT_EXTENSIBLE_CACHE = 0.92

# config/vllm.py max_concurrent_batches: pipeline size, + 1 with async scheduling (on by default)
ASYNC_SCHEDULING_EXTRA_BATCHES = 1

# architectures whose Mamba SSM state vLLM keeps in float32 by default (model_executor/models/config.py:
# NemotronHForCausalLMConfig reads hf mamba_ssm_cache_dtype, else float32; Qwen3_5*Config read
# hf mamba_ssm_dtype); KDA's recurrent state is float32 (layers/mamba/mamba_utils.py kda_state_dtype);
# every other hybrid keeps both states in the model dtype (mamba_ssm_cache_dtype "auto")
SSM_DTYPE_FIELD = {
    "NemotronHForCausalLM": ("mamba_ssm_cache_dtype", "float32"),
    "Qwen3_5ForConditionalGeneration": ("mamba_ssm_dtype", None),
    "Qwen3_5MoeForConditionalGeneration": ("mamba_ssm_dtype", None),
    "Qwen3_5ForCausalLM": ("mamba_ssm_dtype", None),
    "Qwen3_5MoeForCausalLM": ("mamba_ssm_dtype", None),
}
FLOAT32_STATE_KINDS = frozenset({"kda"})

# engine/arg_utils.py: enable_prefix_caching unset takes model_config.is_prefix_caching_supported, True for every
# generative model, hybrids included (config/model.py); model_executor/models/config.py MambaModelConfig then sets
# mamba_cache_mode "align" (else "none"), and the Mamba block size becomes the attention block size
DEFAULT_ENABLE_PREFIX_CACHING = True
# ... but not for an attention-free model: is_prefix_caching_supported is False for attn_type "attention_free",
# the models whose class implements IsAttentionFree (models/mamba.py MambaForCausalLM, which FalconMambaForCausalLM
# maps to; models/mamba2.py Mamba2ForCausalLM), so their Mamba layers stay in mamba_cache_mode "none". An all-Mamba
# Granite-4 is still IsHybrid: prefix caching on.
ATTENTION_FREE_ARCHITECTURES = frozenset({"MambaForCausalLM", "FalconMambaForCausalLM", "Mamba2ForCausalLM"})


def default_prefix_caching(architecture: str) -> bool:
    """vLLM's enable_prefix_caching when the flag is not given (see ATTENTION_FREE_ARCHITECTURES)."""
    return DEFAULT_ENABLE_PREFIX_CACHING and architecture not in ATTENTION_FREE_ARCHITECTURES


@dataclass(frozen=True, slots=True)
class MambaCheckpoint:
    """What a model's recurrent layers declare for mamba_cache_mode "align" (vLLM's MambaSpec fields): the
    prefill checkpoint blocks each request holds per Mamba group, and the token alignment the layers' prefill
    checkpoints need of a block (None: a layer declares none, get_mamba_prefill_checkpoint_alignment)."""

    blocks: int = 0
    alignment: int | None = None


# layers/mamba/mamba_mixer2.py MambaMixer2.get_kv_cache_spec: num_prefill_checkpoint_blocks=1, and no
# get_prefill_checkpoint_alignment (the base's None); Bamba's layers are the same mixer (vLLM 0.34.0's registry
# lists BambaForCausalLM among the models removed in 0.23.0)
_MAMBA2_MIXER = MambaCheckpoint(blocks=1)
# layers/mamba/gdn/qwen_gdn_linear_attn.py: on Hopper the GDN prefill runs FlashInfer
# (_resolve_gdn_prefill_backend), whose checkpoints are aligned to 64 tokens
# (v1/attention/backends/gdn_attn.py FLASHINFER_GDN_CHECKPOINT_ALIGNMENT) and take one block
_GATED_DELTA_NET = MambaCheckpoint(blocks=1, alignment=64)
MAMBA_CHECKPOINTS = {
    **dict.fromkeys(("NemotronHForCausalLM", "NemotronHPuzzleForCausalLM", "FalconH1ForCausalLM",
                     "GraniteMoeHybridForCausalLM", "Zamba2ForCausalLM", "BambaForCausalLM"), _MAMBA2_MIXER),
    **dict.fromkeys(("Qwen3NextForCausalLM", "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration",
                     "Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM"), _GATED_DELTA_NET),
}
# models/kimi_k3/nvidia/kda.py: KDA prefills with FlashKDA on Hopper only for a bounded gate (linear_attn_config's
# gate_lower_bound) and head_dim 128 (is_flashkda_supported); its checkpoints align to 16 tokens
# (layers/mamba/kda_checkpoint.py). Otherwise Triton, which exports none; so does Jamba's Mamba-1 mixer.
FLASH_KDA = MambaCheckpoint(blocks=1, alignment=16)
FLASH_KDA_HEAD_DIM = 128


def mamba_checkpoint(architecture: str, hf_config: dict[str, object]) -> MambaCheckpoint:
    """The prefill checkpoint a hybrid's recurrent layers declare in vLLM's align mode, on a Hopper card."""
    if architecture == "KimiLinearForCausalLM":
        kda = hf_config.get("linear_attn_config")
        bounded = isinstance(kda, dict) and kda.get("gate_lower_bound") is not None
        return FLASH_KDA if bounded and kda.get("head_dim") == FLASH_KDA_HEAD_DIM else MambaCheckpoint()
    return MAMBA_CHECKPOINTS.get(architecture, MambaCheckpoint())


def _batch_tier(total_bytes: int, device_name: str) -> int:
    """engine/arg_utils.py get_batch_defaults' tier for the card: 2 from 160 GiB, 1 from 70 GiB unless an A100
    (its device name; vLLM keeps A100s on the small tier for throughput, as GB10, a Blackwell compute capability
    12.1 this project's card table does not hold), else 0."""
    if total_bytes >= 160 * GiB:
        return 2
    return 1 if total_bytes >= 70 * GiB and "a100" not in device_name.lower() else 0


def default_max_num_batched_tokens(total_bytes: int, device_name: str = "") -> int:
    """The API server's max_num_batched_tokens by card (engine/arg_utils.py get_batch_defaults): 16384 from
    160 GiB, 8192 from 70 GiB (H100/H200, not A100), else 2048."""
    return (2048, 8192, 16384)[_batch_tier(total_bytes, device_name)]


def ssm_state_dtype(architecture: str, hf_config: dict[str, object], kind: str, model_dtype: DType) -> DType:
    """The dtype vLLM keeps a recurrent layer's SSM (temporal) state in, by default (see SSM_DTYPE_FIELD)."""
    if kind in FLOAT32_STATE_KINDS:
        return FLOAT32
    field = SSM_DTYPE_FIELD.get(architecture)
    if field is None:
        return model_dtype
    name, fallback = field
    text = hf_config.get("text_config", hf_config)
    value = (text.get(name) if isinstance(text, dict) else None) or hf_config.get(name) or fallback
    return STATE_DTYPES.get(str(value), model_dtype) if value else model_dtype


def hybrid_manager_disabled(layer_kinds: tuple[str, ...]) -> bool:
    """vLLM turns its hybrid KV cache manager off for chunked local attention (Llama-4), by default
    (config/vllm.py, unless VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE): local layers then
    take full-attention blocks for every token (kv_cache_planning.py unify_hybrid_kv_cache_specs)."""
    return "chunked_attention" in layer_kinds


# ---- vLLM 0.34.0's start-up checks on the settings a plan reads: each refusal names the flag and a value that passes

def default_max_num_seqs(total_bytes: int, device_name: str = "") -> int:
    """The API server's max_num_seqs by card (engine/arg_utils.py get_batch_defaults, the same tiers as
    default_max_num_batched_tokens): 1024 from 70 GiB (not A100), else 256."""
    return (256, 1024, 1024)[_batch_tier(total_bytes, device_name)]


@dataclass(frozen=True, slots=True)
class SchedulerLimits:
    """vLLM's max_num_seqs and max_num_batched_tokens after its defaults."""

    max_num_seqs: int
    max_num_batched_tokens: int


def scheduler_limits(*, total_bytes: int, max_model_len: int, max_num_seqs: int | None,
                     max_num_batched_tokens: int | None, device_name: str = "") -> SchedulerLimits:
    """The scheduler's limits as vLLM sets them (engine/arg_utils.py _set_default_max_num_seqs_and_batched_tokens_args:
    unset max_num_batched_tokens takes the card's default, at most max_num_seqs x max_model_len); ConfigError where
    config/scheduler.py SchedulerConfig.verify_max_model_len refuses max_num_batched_tokens below max_num_seqs."""
    seqs = max_num_seqs or default_max_num_seqs(total_bytes, device_name)
    batched = max_num_batched_tokens or min(seqs * max_model_len,
                                            default_max_num_batched_tokens(total_bytes, device_name))
    if batched < seqs:
        def said(flag: str, value: int, given: int | None) -> str:
            return f"--{flag.replace('_', '-')} {value}" if given else f"{flag} {value} (vLLM's default for this card)"
        raise ConfigError(
            f"{said('max_num_batched_tokens', batched, max_num_batched_tokens)} is below "
            f"{said('max_num_seqs', seqs, max_num_seqs)}: vLLM {VLLM_VERSION}'s SchedulerConfig refuses it "
            f"(max_num_batched_tokens must be at least max_num_seqs); use --max-num-batched-tokens {seqs} "
            f"or --max-num-seqs {batched}")
    return SchedulerLimits(max_num_seqs=seqs, max_num_batched_tokens=batched)


def check_block_size(block_size: int | None) -> None:
    """ConfigError for a --block-size FlashAttention cannot split into its kernel blocks (MultipleOf(16),
    attention/backends/flash_attn.py get_supported_kernel_block_sizes)."""
    if block_size is not None and block_size % FLASH_ATTN_KERNEL_BLOCK:
        fix = max(FLASH_ATTN_KERNEL_BLOCK, block_size // FLASH_ATTN_KERNEL_BLOCK * FLASH_ATTN_KERNEL_BLOCK)
        raise ConfigError(f"--block-size {block_size} is not a multiple of {FLASH_ATTN_KERNEL_BLOCK} (vLLM "
                          f"{VLLM_VERSION}'s FlashAttention kernel block); try --block-size {fix}")


def max_model_len(model_name: str, derived: int, requested: int | None, *, allow_long: bool) -> int:
    """vLLM's max_model_len: the model's (max_position_embeddings) unless --max-model-len; ConfigError for a longer
    one, as config/model.py _get_and_verify_max_len refuses it unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 (here
    --allow-long-context)."""
    if requested is None:
        return derived
    if requested > derived and not allow_long:
        raise ConfigError(f"--max-model-len {requested} is greater than {model_name}'s derived max_model_len "
                          f"(max_position_embeddings {derived}), which vLLM {VLLM_VERSION} refuses; use "
                          f"--max-model-len {derived}, or --allow-long-context (vLLM's VLLM_ALLOW_LONG_MAX_MODEL_LEN=1)")
    return requested


def check_sparse_mla_spelling(spelling: str, sparse_mla: bool) -> None:
    """ConfigError for `--kv-cache-dtype fp8_e4m3` on a sparse-MLA model (DeepSeek-V3.2, GLM-5): spelled so, vLLM
    picks FlashInfer's sparse SM90 backend and its plain 576-byte fp8 rows (platforms/cuda.py tries FlashAttention
    MLA sparse, then FlashMLA sparse, which takes fp8 and fp8_ds_mla only, then FlashInfer's), not modelled; spelled
    `fp8` it is FlashMLA sparse's 656-byte fp8_ds_mla row, the one the plan holds (SPARSE_MLA_FP8_KV_DTYPE)."""
    if sparse_mla and spelling == SPARSE_MLA_FP8_KV_DTYPE:
        raise ConfigError(f"--kv-cache-dtype {spelling}: on a sparse-attention MLA model vLLM {VLLM_VERSION} picks "
                          "FlashInfer's sparse backend with plain fp8 rows for this spelling, which is not modelled; "
                          "use --kv-cache-dtype fp8 (FlashMLA sparse's fp8_ds_mla row) or auto")


def check_sparse_mla_kv_dtype(model: ModelConfig, kv_dtype: str) -> None:
    """ConfigError where vLLM has no sparse MLA backend on Hopper for this KV dtype (the project's name) or latent
    width (platforms/cuda.py: FlashAttention MLA sparse takes auto / bfloat16 / float16, FlashMLA sparse fp8 as its
    fp8_ds_mla row of FP8_DS_MLA_HEAD_SIZE values)."""
    if not model.index_head_dim:
        return
    if kv_dtype not in SPARSE_MLA_PLAIN_KV_DTYPES and kv_dtype != SPARSE_MLA_FP8_KV_DTYPE:
        raise ConfigError(f"--kv-cache-dtype {kv_dtype}: vLLM {VLLM_VERSION} has no sparse MLA backend "
                          f"for it ({model.architecture}); use --kv-cache-dtype auto, bfloat16 or fp8")
    width = (model.kv_lora_rank or 0) + (model.qk_rope_head_dim or 0)
    if kv_dtype == SPARSE_MLA_FP8_KV_DTYPE and width != FP8_DS_MLA_HEAD_SIZE:
        raise ConfigError(f"--kv-cache-dtype fp8: vLLM {VLLM_VERSION}'s fp8_ds_mla latent holds "
                          f"{FP8_DS_MLA_HEAD_SIZE} values, this model {width}; use --kv-cache-dtype auto")


def check_sparse_mla_block_size(sparse_mla: bool, block_size: int) -> None:
    """ConfigError for a block size the sparse MLA indexer cannot split into its 64-token kernel blocks
    (DeepseekV32IndexerBackend; select_common_block_size finds none)."""
    if sparse_mla and block_size % SPARSE_MLA_KERNEL_BLOCK:
        raise ConfigError(f"--block-size {block_size}: vLLM {VLLM_VERSION}'s sparse MLA indexer takes blocks of "
                          f"{SPARSE_MLA_KERNEL_BLOCK} tokens and finds no common block size; use --block-size "
                          f"{SPARSE_MLA_KERNEL_BLOCK} (or a multiple of it)")
