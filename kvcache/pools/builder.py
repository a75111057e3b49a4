"""Build the pools a plan describes, on any device, from one arena; check them against the plan.

Each worker makes one allocation (kvcache.memory.device_buffers.Arena) of the plan's `arena_bytes`
and carves the plan's tensor list (MemoryPoolConfig.worker_slots) from it in one pass; the pools
and the allocator are given their part of the plan and those views by name, and allocate nothing.
Two guards raise PlanMismatchError: before the arena, that the bytes the plan charges are its tensor
list's (check_charged_bytes); after the build, that every tensor held is the view carved for it, name
by name (check_against_plan). If any step fails, nothing stays allocated.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from typing import Any

import torch

from kvcache.pools.allocator_protocol import AllocatorFactory, TokenAllocator
from kvcache.pools.planned_views import Views, carve_slots
from kvcache.byte_units import format_bytes
from kvcache.memory.device_buffers import Arena, ArenaBacking
from kvcache.errors import PlanMismatchError, PoolBuildError, PoolOutOfMemoryError
from kvcache.sizing.layer_specs import MLASpec, TokenSpec
from kvcache.memory.out_of_memory import is_out_of_memory
from kvcache.sizing.pool_config import KVPoolPlan, MemoryPoolConfig
from kvcache.sizing.pool_layout import CacheLayout
from kvcache.memory.torch_dtypes import dtype_name
from kvcache.sizing.tensor_plan import PlannedSlot
from kvcache.pools import HybridSWAKVPool, MHATokenToKVPool, MLATokenToKVPool, RecurrentStatePool, ReqToTokenPool

KVPool = MHATokenToKVPool | MLATokenToKVPool | HybridSWAKVPool


@dataclass(frozen=True, slots=True)
class WorkerPools:
    """What one worker allocated: its arena, attention pool, state pool, and (target only) table and allocator."""

    arena: Arena
    kv_pools: dict[str, MHATokenToKVPool | MLATokenToKVPool]
    token_to_kv_pool: KVPool | None  # None: a pure state-space model holds no per-token KV
    state_pool: RecurrentStatePool | None
    req_to_token_pool: ReqToTokenPool | None
    allocator: TokenAllocator | None

    @property
    def nbytes(self) -> int:
        """Bytes this worker allocated: its one arena (shared objects it did not build count zero)."""
        return self.arena.nbytes

    def named_tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor this worker built, by the plan's name, in arena order (MemoryPoolConfig.worker_slots)."""
        out: dict[str, torch.Tensor] = {}
        if self.req_to_token_pool is not None:
            out.update(self.req_to_token_pool.named_tensors())
        if self.allocator is not None:
            out.update(self.allocator.named_tensors())  # type: ignore[attr-defined]
        if self.state_pool is not None:
            out.update(self.state_pool.named_tensors())
        for pool in self.kv_pools.values():
            out.update(pool.named_tensors())
        return out


def kv_pool(plan: KVPoolPlan, spec: TokenSpec, *, device: torch.device,
            views: Views | None = None) -> MHATokenToKVPool | MLATokenToKVPool:
    """The per-token pool holding `plan`'s part of the plan, given the layer spec its planned row came from (how
    values are stored); on `views` (the worker's carve) or, given None, an arena of its own."""
    if isinstance(spec, MLASpec):
        return MLATokenToKVPool(plan=plan, spec=spec, device=device, views=views)
    return MHATokenToKVPool(plan=plan, spec=spec, device=device, views=views)


def build_worker_pools(
    *, plan: MemoryPoolConfig, layout: CacheLayout, device: torch.device, allocator_factory: AllocatorFactory,
    shared_req_to_token_pool: ReqToTokenPool | None = None, shared_allocator: TokenAllocator | None = None,
    backing: ArenaBacking | None = None,
) -> WorkerPools:
    """Allocate this worker's pools from the plan in one arena (on `backing`'s storage when given). A target
    builds the table and allocator; a draft is given the target's. On any failure, drop everything and re-raise it; only the
    device refusing memory (kvcache.memory.out_of_memory) becomes PoolOutOfMemoryError, anything else is a bug."""
    draft = shared_req_to_token_pool is not None
    slots = plan.worker_slots(draft=draft)
    check_charged_bytes(plan, slots, draft=draft)  # before a byte is allocated
    arena: Arena | None = None
    views: Views | None = None
    try:
        arena = Arena(plan.arena_bytes(draft=draft), device, backing=backing)
        views = carve_slots(arena, slots)  # the plan's tensor list, in one pass
        pools = _build_in(arena, views, plan, layout, device, allocator_factory, shared_req_to_token_pool,
                          shared_allocator)
        check_against_plan(pools, views, slots)
    except BaseException as exc:  # whatever failed, nothing built stays allocated
        arena = views = pools = None  # type: ignore[assignment]
        traceback.clear_frames(exc.__traceback__)  # the error keeps no buffer alive
        if device.type == "cuda":
            torch.cuda.empty_cache()
        if not is_out_of_memory(exc):
            raise
        raise PoolOutOfMemoryError(
            f"building the KV pools ({format_bytes(plan.total_bytes)} planned) failed part-way on {device}: "
            f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}; everything built so far was freed. "
            "Lower --mem-fraction-static (e.g. by 0.05) or set --kv-cache-memory below what is free"
        ) from exc
    if device.type == "cuda":
        torch.cuda.empty_cache()  # temporaries of the build (the allocator's initial ids) leave no cached segment
    return pools


def _build_in(
    arena: Arena, views: Views, plan: MemoryPoolConfig, layout: CacheLayout, device: torch.device,
    allocator_factory: AllocatorFactory, shared_req_to_token_pool: ReqToTokenPool | None,
    shared_allocator: TokenAllocator | None,
) -> WorkerPools:
    req_pool = shared_req_to_token_pool
    if req_pool is None:
        req_pool = ReqToTokenPool(slot=plan.req_to_token_slot(), device=device, views=views)
    kv_pools = {g.name: kv_pool(plan.pool(g.name), g.spec, device=device, views=views) for g in layout.kv_groups}
    window = plan.window_pool(draft=shared_req_to_token_pool is not None)
    state_pool = None
    if layout.state is not None:
        assert plan.state_pool is not None
        state_pool = RecurrentStatePool(plan=plan.state_pool, device=device, views=views)
    if shared_allocator is not None:
        allocator = shared_allocator
        token_to_kv_pool = _attention_pool(kv_pools, window, allocator)
    elif window is not None:  # the hybrid pool needs the allocator's full -> SWA map first
        allocator = allocator_factory(plan=plan, device=device, kvcache=None, views=views)
        token_to_kv_pool = _attention_pool(kv_pools, window, allocator)
        allocator.attach_kvcache(token_to_kv_pool)  # type: ignore[attr-defined]
    elif not kv_pools:  # a pure state-space model: the allocator's token ids index no KV bytes
        token_to_kv_pool = None
        allocator = allocator_factory(plan=plan, device=device, kvcache=None, views=views)
    else:
        token_to_kv_pool = _attention_pool(kv_pools, None, None)
        allocator = allocator_factory(plan=plan, device=device, kvcache=token_to_kv_pool, views=views)
    return WorkerPools(
        arena=arena, kv_pools=kv_pools, token_to_kv_pool=token_to_kv_pool,
        state_pool=state_pool,
        req_to_token_pool=req_pool if shared_req_to_token_pool is None else None,
        allocator=allocator if shared_allocator is None else None,
    )


def check_charged_bytes(plan: MemoryPoolConfig, slots: tuple[PlannedSlot, ...], *, draft: bool) -> None:
    """The one invariant of the arena's bytes that the one-pass carve does not make true: the bytes the plan charges
    for each buffer (worker_buffers, from bytes per token and per slot: what the planner fit to the budget and
    arena_bytes sizes the arena by) are the sum of its tensor list's slots (worker_slots: what is carved). Carving
    the list from an arena of arena_bytes makes the rest equal by construction. PlanMismatchError, naming the
    buffers, when a plan (built by hand, or decoded from JSON) charges other bytes than its tensors take."""
    listed: dict[str, int] = {}
    for s in slots:
        listed[s.buffer] = listed.get(s.buffer, 0) + s.nbytes
    charged = plan.worker_buffers(draft=draft)
    if listed != charged:
        diff = [k for k in dict.fromkeys([*charged, *listed]) if charged.get(k) != listed.get(k)]
        raise PlanMismatchError(
            f"the plan charges other bytes than its tensors take in {len(diff)} of {len(charged)} buffers "
            "(name: charged, tensors): " + ", ".join(f"{k}: {charged.get(k, 0):,} B, {listed.get(k, 0):,} B" for k in diff[:4])
        )


def check_against_plan(pools: WorkerPools, views: Views, slots: tuple[PlannedSlot, ...]) -> None:
    """The guard after the build: the tensors the pools and the allocator hold are the plan's, name by name (shape
    and dtype), each the very view carved for it (none allocated on its own), or PlanMismatchError. The pools check
    the views they take against their planned slots; an allocator from another factory need not."""
    planned = {t.name: (t.shape, t.dtype) for s in slots for t in s.tensors}
    held = pools.named_tensors()
    built = {name: (tuple(t.shape), dtype_name(t.dtype)) for name, t in held.items()}
    if built != planned:
        diff = [k for k in list(planned) + [k for k in built if k not in planned] if built.get(k) != planned.get(k)]
        raise PlanMismatchError(
            f"the KV tensors built differ from the plan in {len(diff)} of {len(planned)} (name: built, planned): "
            + ", ".join(f"{k}: {built.get(k)}, {planned.get(k)}" for k in diff[:4])
        )
    own = [name for name, t in held.items() if t is not views[name]]
    if own:
        raise PlanMismatchError(
            f"{len(own)} of the KV tensors built are not the views carved from the worker's arena (allocated on their "
            f"own, outside the plan's bytes): {', '.join(own[:4])}"
        )


def _attention_pool(pools: dict[str, Any], window: KVPoolPlan | None, allocator: TokenAllocator | None) -> KVPool:
    """The pool the model's attention reads: hybrid over this worker's full and window pools when the plan pairs
    them (MemoryPoolConfig.window_pool, the same fact that makes the allocator SWA-paired), else its one pool."""
    if window is not None:
        assert allocator is not None
        full = [name for name in pools if name != window.name]
        if len(full) != 1:
            raise PoolBuildError(f"a window pool pairs with one full pool, got {sorted(pools)}")
        return HybridSWAKVPool(full=pools[full[0]], swa=pools[window.name],
                               full_to_swa=allocator.full_to_swa_index_mapping)  # type: ignore[attr-defined]
    if len(pools) != 1:
        raise PoolBuildError(f"expected one attention pool, got {sorted(pools)}")
    return next(iter(pools.values()))
