"""KVCacheConfigurator: profile, plan, build; one call, one immutable result.

A target worker profiles through its MemoryProbe, plans with the pure planner (paying
for any draft pools too), and builds its pools and allocator. A draft worker
(`is_draft_worker`) is given the target's request table, allocator and plan when it
configures (`shared`): it skips profiling and builds only its own KV pool, with the same
token capacity. Its sizing is known before the target's cache exists, so a draft whose
weights do not fit is refused before the target builds anything.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec
import torch

from kvcache.pools.allocator_protocol import AllocatorFactory, TokenAllocator
from kvcache.engines import EngineRules
from kvcache.engines.sglang import SGLANG
from kvcache.errors import KVCacheError
from kvcache.inputs.dtypes import DType, KVCacheDtype
from kvcache.inputs.parallel import ParallelState
from kvcache.inputs.sizing_settings import SizingSettings
from kvcache.memory.device_buffers import Arena, ArenaBacking
from kvcache.memory.memory_probe import MemoryProbe
from kvcache.models.model_config import ModelConfig
from kvcache.pools import RecurrentStatePool, ReqToTokenPool
from kvcache.pools.builder import KVPool, WorkerPools, build_worker_pools
from kvcache.runtime.streams import ForwardStream
from kvcache.sizing.agreed_plan import check_draft_shares, plan_as_the_ranks_agree
from kvcache.sizing.pool_config import MemoryPoolConfig
from kvcache.sizing.pool_layout import CacheLayout
from kvcache.sizing.worker_sizing import WorkerSizing
from kvcache.sizing.worker_memory import WorkerMemory


class KVCacheConfigResult(msgspec.Struct, frozen=True, kw_only=True, eq=False):
    """What the model runner keeps: the plan, the formats, the pools and the allocator. After a live resize of the
    pools (kvcache.runtime.live_resize) the runner keeps `resized()`'s: the resized plan and the fresh allocator."""

    memory_pool_config: MemoryPoolConfig  # the plan the pools hold now: as built, or a live resize's
    model_dtype: DType
    kv_cache_dtype: KVCacheDtype
    req_to_token_pool: ReqToTokenPool
    token_to_kv_pool: KVPool
    token_to_kv_pool_allocator: TokenAllocator
    state_pool: RecurrentStatePool | None
    arena: Arena  # the one allocation every buffer this worker built is a view of
    # What this rank's memory held when it was built, before the ranks agreed on the smallest; a resize keeps it
    # (the resized plan is every rank's agreed one, and a rank's own count before that agreement is not kept).
    own_max_total_num_tokens: int
    # This rank's own readings around its weights, before the ranks agreed on the smallest (the plan's budget holds
    # the agreed ones): what this rank's report pairs with its own weights, so its memory lines add up.
    own_memory: WorkerMemory
    allocator_outside_arena_bytes: int = 0  # a live resize's fresh allocator's index lists, beside the arena

    @property
    def allocated_bytes(self) -> int:
        """Bytes this worker holds on the device now: its arena's mapped bytes (all of it as built; after a live
        resize less the KV tails it released, or more the tails it mapped again) and a resize's fresh allocator's
        index lists, carved from an arena of their own beside it. Shared objects are excluded."""
        return self.arena.mapped_bytes + self.allocator_outside_arena_bytes

    def resized(self, plan: MemoryPoolConfig, allocator: TokenAllocator) -> "KVCacheConfigResult":
        """This result once its pools were resized live to `plan` (kvcache.runtime.live_resize, which resized the
        pools in place): `plan`, and `allocator`, the fresh one built for it, whose index lists lie outside the
        arena (the old allocator's stay in it, mapped)."""
        return msgspec.structs.replace(self, memory_pool_config=plan, token_to_kv_pool_allocator=allocator,
                                       allocator_outside_arena_bytes=allocator.nbytes)

    @property
    def max_total_num_tokens(self) -> int:
        return self.memory_pool_config.max_total_num_tokens

    @property
    def max_running_requests(self) -> int:
        return self.memory_pool_config.max_running_requests


@dataclass(frozen=True, slots=True, kw_only=True)
class SharedTargetCache:
    """What a draft worker takes from its target: same token indices, same request rows."""

    req_to_token_pool: ReqToTokenPool
    token_to_kv_pool_allocator: TokenAllocator
    memory_pool_config: MemoryPoolConfig


@dataclass(frozen=True, slots=True, kw_only=True)
class KVCacheConfigurator:
    """Sizes and builds one worker's KV cache. Typed fields only; one public method.

    Sizing knobs come from `settings` alone and parallel sizes from `parallel_state`
    alone; the allocator comes from `allocator_factory`, and the pools are built on
    `forward_stream`, so a container (or a test) decides each of them.
    """

    settings: SizingSettings
    model_config: ModelConfig
    parallel_state: ParallelState
    model_dtype: DType
    kv_cache_dtype: KVCacheDtype
    device: torch.device
    memory_probe: MemoryProbe
    allocator_factory: AllocatorFactory
    forward_stream: ForwardStream
    engine: EngineRules = SGLANG  # the engine whose rules the plan follows (kvcache.engines)
    layer_ids: range | None = None
    pool_name_prefix: str = ""
    draft_layout: CacheLayout | None = None
    is_draft_worker: bool = False  # configure() then takes the target's cache (`shared`)
    arena_backing: ArenaBacking | None = None  # the arena's CUDA storage: VMM when a post-capture resize trims it

    # ---- the one public method -------------------------------------------
    def configure(self, *, pre_model_load_memory: int, shared: SharedTargetCache | None = None) -> KVCacheConfigResult:
        """Profile, plan, build; a draft builds from its target's `shared` cache instead. `pre_model_load_memory`
        is the free bytes the probe reported before weights were loaded."""
        if (shared is not None) != self.is_draft_worker:
            raise KVCacheError("a draft worker configures from its target's cache (shared=), and only a draft does; "
                               f"this one is_draft_worker={self.is_draft_worker}, shared={shared is not None}")
        sizing = self.sizing
        layout = sizing.layout()
        ranks = self.parallel_state.agreement  # all ranks succeed, or all raise the same error
        if shared is not None:
            return ranks.run_everywhere(lambda: self._configure_from_shared(layout, shared))
        plan, own_tokens, own_memory = self._plan(sizing, pre_model_load_memory)
        pools = ranks.run_everywhere(lambda: self._build(plan, layout))
        self.memory_probe.note_allocation(pools.nbytes)
        assert pools.req_to_token_pool is not None
        return self._result(plan, pools, pools.req_to_token_pool, pools.allocator, own_tokens, own_memory)

    @property
    def sizing(self) -> WorkerSizing:
        """This worker's pure sizing questions (kvcache.sizing.worker_sizing), from the same fields."""
        return WorkerSizing(
            settings=self.settings, model_config=self.model_config, parallel_state=self.parallel_state,
            model_dtype=self.model_dtype, kv_cache_dtype=self.kv_cache_dtype, device_type=self.device.type,
            layer_ids=self.layer_ids, pool_name_prefix=self.pool_name_prefix, draft_layout=self.draft_layout,
            is_draft_worker=self.is_draft_worker, engine=self.engine,
        )

    # ---- internals --------------------------------------------------------
    def _build(self, plan: MemoryPoolConfig, layout: CacheLayout, shared: SharedTargetCache | None = None) -> WorkerPools:
        """Build the pools on the forward stream and wait for them (a draft reuses the target's table and allocator)."""
        with self.forward_stream:
            pools = build_worker_pools(
                plan=plan, layout=layout, device=self.device, allocator_factory=self.allocator_factory,
                shared_req_to_token_pool=shared.req_to_token_pool if shared else None,
                shared_allocator=shared.token_to_kv_pool_allocator if shared else None, backing=self.arena_backing,
            )
        self.forward_stream.synchronize()
        return pools

    def _plan(self, sizing: WorkerSizing, free_before: int) -> tuple[MemoryPoolConfig, int, WorkerMemory]:
        """Plan as the ranks agree (kvcache.sizing.agreed_plan) from this rank's readings: the plan, this rank's own
        tokens before agreeing, and its own memory readings. `plan --pp-size` agrees the same way."""
        probe = self.memory_probe
        own = WorkerMemory(total_bytes=probe.total_bytes(), free_before_load=free_before,
                           free_after_load=probe.free_bytes(), reported_total_bytes=probe.device_capacity_bytes())
        agreed = plan_as_the_ranks_agree(sizing, own, self.parallel_state.agreement)
        return agreed.plan, agreed.own_tokens, agreed.own_memory

    def _configure_from_shared(self, layout: CacheLayout, shared: SharedTargetCache) -> KVCacheConfigResult:
        plan = shared.memory_pool_config
        check_draft_shares(plan, layout)
        pools = self._build(plan, layout, shared)
        self.memory_probe.note_allocation(pools.nbytes)
        return self._result(plan, pools, shared.req_to_token_pool, shared.token_to_kv_pool_allocator,
                            plan.max_total_num_tokens, WorkerMemory.of_budget(plan.budget))

    def _result(self, plan: MemoryPoolConfig, pools: WorkerPools, req_pool: ReqToTokenPool, allocator: TokenAllocator,
                own_tokens: int, own_memory: WorkerMemory) -> KVCacheConfigResult:
        return KVCacheConfigResult(
            memory_pool_config=plan, model_dtype=self.model_dtype, kv_cache_dtype=self.kv_cache_dtype,
            req_to_token_pool=req_pool, token_to_kv_pool=pools.token_to_kv_pool,
            token_to_kv_pool_allocator=allocator, state_pool=pools.state_pool, arena=pools.arena,
            own_max_total_num_tokens=own_tokens, own_memory=own_memory,
        )

