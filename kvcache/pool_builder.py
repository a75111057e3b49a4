"""Build the pools a plan describes, on any device; free everything if any step fails."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from kvcache.allocators.protocol import AllocatorFactory, TokenAllocator
from kvcache.byte_units import format_bytes
from kvcache.errors import PoolBuildError
from kvcache.layer_specs import FullAttentionSpec, MLASpec, SlidingWindowSpec
from kvcache.pool_config import MemoryPoolConfig
from kvcache.pool_layout import CacheLayout, KVPoolGroup
from kvcache.pools import HybridSWAKVPool, MHATokenToKVPool, MLATokenToKVPool, RecurrentStatePool, ReqToTokenPool

KVPool = MHATokenToKVPool | MLATokenToKVPool | HybridSWAKVPool


@dataclass(frozen=True, slots=True)
class WorkerPools:
    """What one worker allocated: its attention pool, state pool, and (target only) table and allocator."""

    token_to_kv_pool: KVPool
    state_pool: RecurrentStatePool | None
    req_to_token_pool: ReqToTokenPool | None
    allocator: TokenAllocator | None

    @property
    def nbytes(self) -> int:
        """Bytes this worker allocated (shared objects it did not build count zero)."""
        total = self.token_to_kv_pool.nbytes
        if self.state_pool is not None:
            total += self.state_pool.nbytes
        if self.req_to_token_pool is not None:
            total += self.req_to_token_pool.nbytes
        if self.allocator is not None:
            total += int(self.allocator.nbytes)
        return total


def _build_kv_group(group: KVPoolGroup, plan: MemoryPoolConfig, device: torch.device) -> MHATokenToKVPool | MLATokenToKVPool:
    size = plan.pool(group.name).num_tokens
    spec = group.spec
    if isinstance(spec, MLASpec):
        return MLATokenToKVPool(
            size=size, page_size=plan.page_size, dtype=spec.dtype, kv_lora_rank=spec.kv_lora_rank,
            qk_rope_head_dim=spec.qk_rope_head_dim, layer_ids=group.layer_ids, device=device,
        )
    assert isinstance(spec, (FullAttentionSpec, SlidingWindowSpec))
    return MHATokenToKVPool(
        size=size, page_size=plan.page_size, dtype=spec.dtype, kv_heads=spec.kv_heads, head_dim=spec.head_dim,
        v_head_dim=spec.v_head_dim, layer_ids=group.layer_ids, device=device,
    )


def build_worker_pools(
    *, plan: MemoryPoolConfig, layout: CacheLayout, device: torch.device, allocator_factory: AllocatorFactory,
    shared_req_to_token_pool: ReqToTokenPool | None = None, shared_allocator: TokenAllocator | None = None,
) -> WorkerPools:
    """Allocate this worker's pools from the plan. A target builds the table and allocator;
    a draft is given the target's. On any failure, drop everything built and raise PoolBuildError."""
    built: list[Any] = []
    try:
        req_pool = shared_req_to_token_pool
        if req_pool is None:
            req_pool = ReqToTokenPool(
                size=plan.max_running_requests, max_context_len=plan.req_to_token_row_width, device=device,
                with_state_slots=plan.state_pool is not None,
            )
            built.append(req_pool)
        kv_pools = {g.name: _build_kv_group(g, plan, device) for g in layout.kv_groups}
        built.extend(kv_pools.values())
        state_pool = None
        if layout.state is not None:
            assert plan.state_pool is not None
            state_pool = RecurrentStatePool(
                num_slots=plan.state_pool.num_slots, spec=layout.state.spec,
                layer_ids=layout.state.layer_ids, device=device,
            )
            built.append(state_pool)
        allocator = shared_allocator
        if allocator is None:
            allocator = allocator_factory(plan=plan, device=device)
            built.append(allocator)
        token_pool = _attention_pool(layout, kv_pools, allocator)
    except (torch.OutOfMemoryError, RuntimeError, MemoryError) as exc:
        built.clear()
        kv_pools = {}
        if device.type == "cuda":
            torch.cuda.empty_cache()
        raise PoolBuildError(
            f"building the KV pools ({format_bytes(plan.total_bytes)} planned) failed part-way on {device}: "
            f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}; everything built so far was freed. "
            "Lower --mem-fraction-static (e.g. by 0.05) or set --kv-cache-memory below what is free"
        ) from exc
    return WorkerPools(
        token_to_kv_pool=token_pool, state_pool=state_pool,
        req_to_token_pool=req_pool if shared_req_to_token_pool is None else None,
        allocator=allocator if shared_allocator is None else None,
    )


def _attention_pool(layout: CacheLayout, pools: dict[str, Any], allocator: Any) -> KVPool:
    swa = [g for g in layout.kv_groups if g.paired_with_full]
    if swa:
        full = next(g for g in layout.kv_groups if not g.paired_with_full)
        return HybridSWAKVPool(full=pools[full.name], swa=pools[swa[0].name],
                               full_to_swa=allocator.full_to_swa_index_mapping)
    if len(pools) != 1:
        raise PoolBuildError(f"expected one attention pool, got {sorted(pools)}")
    return next(iter(pools.values()))
