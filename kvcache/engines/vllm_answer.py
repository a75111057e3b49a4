"""vLLM 0.34.0's answer for one rank of a dry run: its KV budget (which part is estimated) and its block plan.

vLLM gives the KV cache `ceil(total x gpu_memory_utilization)` (vllm/v1/worker/utils.py request_memory)
less what it measures at start-up (vllm/v1/worker/gpu_worker.py determine_available_memory): the
weights, the activation peak of its profile run, memory outside torch, and its CUDA graph estimate.
A dry run has the weights; the rest is estimated (`estimated_runtime_bytes`) and the answer says so.
"""

from __future__ import annotations

from dataclasses import replace
from math import ceil
from typing import Callable

import msgspec
from kvcache.engines import vllm_rules
from kvcache.engines.vllm_layers import VllmSettings, vllm_layer_specs
from kvcache.engines.vllm_plan import plan_vllm
from kvcache.byte_units import MiB
from kvcache.errors import BudgetBelowOneRequestError, ConfigError
from kvcache.inputs.dtypes import DType, KVCacheDtype
from kvcache.inputs.parallel import ParallelState
from kvcache.sizing.runtime_reserve import RuntimeShape, runtime_reserve_mib
from kvcache.models.model_config import ModelConfig


def vllm_available_bytes(*, total_bytes: int, gpu_memory_utilization: float, weights_bytes: int,
                         runtime_bytes: int) -> int:
    """vLLM's KV budget: ceil(total * gpu_memory_utilization) (its request_memory, in its float arithmetic)
    less what it measured besides the cache: weights, then the activation peak, non-torch memory and CUDA
    graphs (`runtime_bytes`, which a dry run can only estimate)."""
    return ceil(total_bytes * gpu_memory_utilization) - weights_bytes - runtime_bytes


def estimated_runtime_bytes(total_bytes: int, shape: RuntimeShape) -> int:
    """What vLLM measures at start-up besides weights and the cache -- the activation peak of its profile run,
    non-torch memory (CUDA context, NCCL) and its CUDA graph estimate -- which a dry run cannot measure: taken
    as the project's runtime reserve for the card (kvcache.sizing.runtime_reserve, SGLang 0.5.23's rule:
    chunked-prefill activations, communication, CUDA graphs, at least 10 GiB above 60 GiB)."""
    return ceil(runtime_reserve_mib(total_bytes, shape) * MiB)


class VllmGroupReport(msgspec.Struct, frozen=True, kw_only=True):
    """One KV cache group as the report shows it."""

    kind: str  # full, sliding, chunked, mla, mamba
    layers: int
    window: int  # sliding window or chunk (0: none)
    block_size: int  # tokens per block of this group (a smaller page takes more tokens)
    blocks_per_request: int


class VllmAnswer(msgspec.Struct, frozen=True, kw_only=True):
    """What vLLM 0.34.0 would allocate on one rank, and the numbers it came from (bytes are integers)."""

    version: str
    total_bytes: int
    gpu_memory_utilization: float
    requested_bytes: int  # ceil(total x gpu_memory_utilization)
    weights_bytes: int  # measured here (dummy weights)
    estimated_runtime_bytes: int  # ESTIMATED: activation peak + non-torch + CUDA graphs
    available_bytes: int  # requested - weights - runtime: vLLM's "Available KV cache memory"
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    enable_prefix_caching: bool
    mamba_cache_mode: str  # "align" (prefix caching on) or "none"; matters for Mamba / linear-attention layers only
    block_size: int
    groups: tuple[VllmGroupReport, ...]
    bytes_per_block: int
    bytes_per_token: int  # in the groups that hold every token (full attention, MLA)
    num_gpu_blocks: int
    blocks_per_request: int
    max_concurrency: float
    kv_cache_tokens: int


def vllm_answer(model: ModelConfig, parallel: ParallelState, kv_dtype: KVCacheDtype, *, model_dtype: DType,
                total_bytes: int, weights_bytes: int, runtime: RuntimeShape, max_model_len: int,
                gpu_memory_utilization: float | None = None, block_size: int | None = None,
                max_num_seqs: int | None = None, max_num_batched_tokens: int | None = None,
                enable_prefix_caching: bool | None = None, device_name: str = "") -> VllmAnswer:
    """vLLM's answer for this rank (None: vLLM's default; `device_name`, the card's, picks some defaults);
    BudgetBelowOneRequestError where vLLM refuses to start."""
    utilization = vllm_rules.DEFAULT_GPU_MEMORY_UTILIZATION if gpu_memory_utilization is None else gpu_memory_utilization
    vllm_rules.check_block_size(block_size)
    limits = vllm_rules.scheduler_limits(total_bytes=total_bytes, max_model_len=max_model_len, max_num_seqs=max_num_seqs,
                                         max_num_batched_tokens=max_num_batched_tokens, device_name=device_name)
    batched = limits.max_num_batched_tokens
    # the estimate's prefill chunk is vLLM's step: its profile run is a forward of max_num_batched_tokens
    runtime_bytes = estimated_runtime_bytes(total_bytes, msgspec.structs.replace(runtime, chunked_prefill_size=batched))
    available = vllm_available_bytes(total_bytes=total_bytes, gpu_memory_utilization=utilization,
                                     weights_bytes=weights_bytes, runtime_bytes=runtime_bytes)
    prefix_caching = (vllm_rules.default_prefix_caching(model.architecture) if enable_prefix_caching is None
                      else enable_prefix_caching)
    settings = VllmSettings(max_model_len=max_model_len, block_size=block_size, max_num_batched_tokens=batched,
                            max_concurrent_batches=parallel.pp_size + vllm_rules.ASYNC_SCHEDULING_EXTRA_BATCHES,
                            mamba_cache_mode="align" if prefix_caching else "none",
                            mamba_checkpoint=vllm_rules.mamba_checkpoint(model.architecture, model.hf_config))
    layers = vllm_layer_specs(model, parallel, kv_dtype, model_dtype=model_dtype)
    try:
        plan = plan_vllm(layers, model.layer_kinds, available_bytes=available, settings=settings)
    except BudgetBelowOneRequestError as exc:
        def starts(fraction: float, block: int | None, step: int = batched) -> bool:  # vLLM's plan with these
            measured = runtime_bytes if step == batched else estimated_runtime_bytes(
                total_bytes, msgspec.structs.replace(runtime, chunked_prefill_size=step))  # its profile run's step
            budget = vllm_available_bytes(total_bytes=total_bytes, gpu_memory_utilization=fraction,
                                          weights_bytes=weights_bytes, runtime_bytes=measured)
            try:
                plan_vllm(layers, model.layer_kinds, available_bytes=budget,
                          settings=replace(settings, block_size=block, max_num_batched_tokens=step))
            except (BudgetBelowOneRequestError, ConfigError):
                return False
            return True
        fixes = _start_fixes(starts, utilization, block_size)
        if max_num_batched_tokens is not None and batched > limits.max_num_seqs \
                and starts(utilization, block_size, limits.max_num_seqs):  # the step's activations took the budget
            lo, hi = limits.max_num_seqs, batched - 1  # at least max_num_seqs (SchedulerConfig's rule)
            while lo < hi:
                mid = (lo + hi + 1) // 2
                lo, hi = (mid, hi) if starts(utilization, block_size, mid) else (lo, mid - 1)
            fixes += (f"--max-num-batched-tokens {lo} (the largest that starts)",)
        raise exc.with_suggestions(fixes + exc.suggestions) from None
    return VllmAnswer(
        version=plan.version, total_bytes=total_bytes, gpu_memory_utilization=utilization,
        requested_bytes=ceil(total_bytes * utilization), weights_bytes=weights_bytes,
        estimated_runtime_bytes=runtime_bytes, available_bytes=available, max_model_len=max_model_len,
        max_num_seqs=limits.max_num_seqs, max_num_batched_tokens=batched, enable_prefix_caching=prefix_caching,
        mamba_cache_mode=settings.mamba_cache_mode, block_size=plan.block_size,
        groups=tuple(VllmGroupReport(kind=g.kind, layers=len(g.layer_pages), window=g.window, block_size=g.block_size,
                                     blocks_per_request=g.blocks_per_request) for g in plan.groups),
        bytes_per_block=plan.bytes_per_block, bytes_per_token=plan.bytes_per_token, num_gpu_blocks=plan.num_blocks, blocks_per_request=plan.blocks_per_request,
        max_concurrency=plan.max_concurrency, kv_cache_tokens=plan.kv_cache_tokens,
    )


def _start_fixes(starts: Callable[..., bool], utilization: float, block_size: int | None) -> tuple[str, ...]:
    """Where vLLM would refuse to start: the least --gpu-memory-utilization (to 0.001) above this one, and the largest
    --block-size (a multiple of its kernel block) below a given one, that start; each by bisection (a monotone
    question: more memory, or smaller blocks, never start fewer requests), so at most ~10 and ~log2(blocks) plans."""
    fixes = []
    lowest = int(utilization * 1000) + 1  # thousandths above the one given
    if lowest <= 1000 and starts(1.0, block_size):
        lo, hi = lowest, 1000
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if starts(mid / 1000, block_size) else (mid + 1, hi)
        fixes.append(f"--gpu-memory-utilization {lo / 1000:.3f} (the least that starts)")
    kernel = vllm_rules.FLASH_ATTN_KERNEL_BLOCK
    if block_size is not None and block_size > kernel and starts(utilization, kernel):
        lo, hi = 1, block_size // kernel - 1  # kernel blocks per block, below the one given
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if starts(utilization, mid * kernel) else (lo, mid - 1)
        fixes.append(f"--block-size {lo * kernel} (the largest that starts)")
    return tuple(fixes)
