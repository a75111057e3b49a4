"""KVCacheConfigurator: profile, plan, build; one call, one immutable result.

A target worker profiles through its MemoryProbe, plans with the pure planner (paying
for any draft pools too), and builds its pools and allocator. A draft worker is given
the target's request table, allocator and plan (`shared`): it skips profiling and
builds only its own KV pool, with the same token capacity.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec
import torch

from kvcache.sizing.advice import suggest_fixes, suggest_kv_cache_memory
from kvcache.allocators.protocol import AllocatorFactory, TokenAllocator
from kvcache.memory.device_buffers import Arena
from kvcache.inputs.dtypes import KV_CACHE_DTYPES, KVCacheDtype
from kvcache.errors import ConfigError, DoesNotFitError, KVCacheMemoryTooLargeError, WeightsLeaveNoRoomError
from kvcache.memory.memory_budget import MemoryBudget, compute_budget, derive_mem_fraction_static
from kvcache.memory.host_memory import host_memory_bytes
from kvcache.memory.memory_probe import MemoryProbe
from kvcache.models.model_config import ModelConfig
from kvcache.inputs.parallel import ParallelState
from kvcache.sizing.planning import PlanRequest, plan_pool_sizes
from kvcache.pools.builder import KVPool, WorkerPools, build_worker_pools
from kvcache.sizing.pool_config import MemoryPoolConfig
from kvcache.sizing.pool_layout import CacheLayout, worker_cache_layout
from kvcache.pools import RecurrentStatePool, ReqToTokenPool
from kvcache.memory.runtime_reserve import RuntimeShape, default_mem_fraction_static
from kvcache.runtime.eligibility import PostCaptureEligibility, post_capture_eligibility, post_capture_reserve_mib
from kvcache.inputs.sizing_settings import SizingSettings
from kvcache.inputs.speculative_defaults import default_max_running_requests
from kvcache.sizing.state_slots import state_slots_per_request
from kvcache.runtime.streams import ForwardStream


class KVCacheConfigResult(msgspec.Struct, frozen=True, kw_only=True, eq=False):
    """What the model runner keeps: the plan, the formats, the pools and the allocator."""

    memory_pool_config: MemoryPoolConfig
    model_dtype: Any  # torch.dtype
    kv_cache_dtype: Any  # KVCacheDtype
    req_to_token_pool: ReqToTokenPool
    token_to_kv_pool: Any  # KVPool
    token_to_kv_pool_allocator: Any  # TokenAllocator
    state_pool: RecurrentStatePool | None
    arena: Arena  # the one allocation every buffer this worker built is a view of

    @property
    def allocated_bytes(self) -> int:
        """Bytes this worker allocated: its arena (shared objects excluded)."""
        return self.arena.nbytes

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
    model_dtype: torch.dtype
    kv_cache_dtype: KVCacheDtype
    device: torch.device
    memory_probe: MemoryProbe
    allocator_factory: AllocatorFactory
    forward_stream: ForwardStream
    layer_ids: range | None = None
    pool_name_prefix: str = ""
    draft_layout: CacheLayout | None = None
    shared: SharedTargetCache | None = None

    # ---- the one public method -------------------------------------------
    def configure(self, *, pre_model_load_memory: int) -> KVCacheConfigResult:
        """Profile (unless shared), plan, build. `pre_model_load_memory` is the free bytes
        the probe reported before weights were loaded."""
        layout = self.layout()
        ranks = self.parallel_state.agreement  # all ranks succeed, or all raise the same error
        shared = self.shared
        if shared is not None:
            return ranks.run_everywhere(lambda: self._configure_from_shared(layout, shared))
        plan = self._plan(layout, pre_model_load_memory)
        pools = ranks.run_everywhere(lambda: self._build(plan, layout))
        self.memory_probe.note_allocation(pools.nbytes)
        assert pools.req_to_token_pool is not None
        return self._result(plan, pools, pools.req_to_token_pool, pools.allocator)

    # ---- parts (public for reports and tests, pure) ----------------------
    def layout(self, kv_cache_dtype: KVCacheDtype | None = None) -> CacheLayout:
        """This worker's pools, from its layer specs."""
        return worker_cache_layout(
            model_config=self.model_config, parallel_state=self.parallel_state,
            kv_cache_dtype=kv_cache_dtype or self.kv_cache_dtype, model_dtype=self.model_dtype,
            mamba_ssm_dtype=self.settings.mamba_ssm_dtype, layer_ids=self.layer_ids, prefix=self.pool_name_prefix,
        )

    def mem_fraction_static(self, total_bytes: int | None = None) -> float:
        """The user's value, or SGLang's rule for this card (or one of total_bytes; kvcache.memory.runtime_reserve)."""
        s, p = self.settings, self.parallel_state
        if s.mem_fraction_static is not None:
            return s.mem_fraction_static
        total = self.memory_probe.total_bytes() if total_bytes is None else total_bytes
        if self.post_capture_resize().active:  # the resize trims the pools after capture (kvcache.runtime)
            return derive_mem_fraction_static(total, post_capture_reserve_mib(tp_size=p.tp_size, pp_size=p.pp_size))
        return default_mem_fraction_static(total, RuntimeShape(
            cuda_graphs=self.device.type != "cpu" and not s.disable_cuda_graph,
            chunked_prefill_size=s.chunked_prefill_size, cuda_graph_max_bs=s.cuda_graph_max_bs,
            tp_size=p.tp_size, pp_size=p.pp_size, attention_dp_size=p.attention_dp_size,
            uses_mla=any(g.spec.pool_kind == "mla" for g in self.layout().kv_groups),
            max_total_tokens=s.max_total_tokens, max_running_requests=s.max_running_requests,
        ))

    def post_capture_resize(self) -> PostCaptureEligibility:
        """Whether this worker's pools are resized after CUDA-graph capture, and why (not)."""
        return post_capture_eligibility(
            server_args=self.settings, device_type=self.device.type, is_draft_worker=self.shared is not None,
            layout=self.layout(), kv_cache_dtype=self.kv_cache_dtype,
        )

    def plan_request(self, layout: CacheLayout, budget: MemoryBudget, draft_layout: CacheLayout | None = None) -> PlanRequest:
        """The planner's input for this layout and budget (and the draft's pools, if any)."""
        a = self.settings
        context = self.model_config.context_length(a.context_length, allow_long_context=a.allow_long_context)
        extra = a.speculative_num_draft_tokens
        draft = draft_layout or self.draft_layout
        groups = layout.kv_groups + (draft.kv_groups if draft else ())
        state = None
        if layout.state is not None:
            state = layout.state.demand(
                slots_per_request=state_slots_per_request(
                    architecture=self.model_config.architecture, disable_radix_cache=a.disable_radix_cache,
                    page_size=a.page_size, disable_overlap_schedule=a.disable_overlap_schedule),
                memory_ratio=a.mamba_full_memory_ratio, max_slots=a.max_mamba_cache_size,
            )
        return PlanRequest(
            budget=budget, page_size=a.page_size, context_length=context,
            req_to_token_row_width=context + extra, kv_pools=tuple(g.demand() for g in groups),
            swa_ratio=a.swa_full_tokens_ratio, state=state,
            max_total_tokens=a.max_total_tokens,
            max_running_requests=default_max_running_requests(a.max_running_requests, a.speculative_algorithm),
            attention_dp_size=self.parallel_state.attention_dp_size,
        )

    # ---- internals --------------------------------------------------------
    def _build(self, plan: MemoryPoolConfig, layout: CacheLayout, shared: SharedTargetCache | None = None) -> WorkerPools:
        """Build the pools on the forward stream and wait for them (a draft reuses the target's table and allocator)."""
        with self.forward_stream:
            pools = build_worker_pools(
                plan=plan, layout=layout, device=self.device, allocator_factory=self.allocator_factory,
                shared_req_to_token_pool=shared.req_to_token_pool if shared else None,
                shared_allocator=shared.token_to_kv_pool_allocator if shared else None,
            )
        self.forward_stream.synchronize()
        return pools

    def _plan(self, layout: CacheLayout, free_before: int) -> MemoryPoolConfig:
        """Plan with the ranks' smallest free memory; every rank then holds the smallest stage's tokens."""
        ranks = self.parallel_state.agreement
        memory = ranks.agree_on_memory(free_before_load=free_before, free_after_load=self.memory_probe.free_bytes(),
                                       total_bytes=self.memory_probe.total_bytes())
        plan, request = ranks.run_everywhere(
            lambda: self._plan_this_rank(layout, memory.free_before_load, memory.free_after_load, memory.total))
        (agreed,) = ranks.min_int64((plan.max_total_num_tokens,))
        return ranks.run_everywhere(lambda: _capped(plan, request, agreed))  # every rank, re-planning or not

    def plans_alone(self, *, free_before_load: int, free_after_load: int) -> bool:
        """Whether this rank's KV cache would plan with these free bytes (pure: no other rank asked, nothing
        built, no advice searched); the runner checks a --tp-size it suggests with it."""
        total = self.memory_probe.total_bytes()
        fraction = None if self.settings.kv_cache_memory is not None else self.mem_fraction_static(total)
        try:
            budget = compute_budget(total_bytes=total, free_before_load=free_before_load,
                                    free_after_load=free_after_load, mem_fraction_static=fraction,
                                    kv_cache_memory=self.settings.kv_cache_memory)
            plan_pool_sizes(self.plan_request(self.layout(), budget))
        except DoesNotFitError:
            return False
        return True

    def _plan_this_rank(self, layout: CacheLayout, free_before: int, free_after: int,
                        total: int) -> tuple[MemoryPoolConfig, PlanRequest]:
        a = self.settings
        fraction = None if a.kv_cache_memory is not None else self.mem_fraction_static(total)  # the agreed card

        def budget_for(f: float) -> int:
            return compute_budget(total_bytes=total, free_before_load=free_before, free_after_load=free_after,
                                  mem_fraction_static=f, kv_cache_memory=None).budget_bytes

        try:
            budget = compute_budget(
                total_bytes=total, free_before_load=free_before, free_after_load=free_after,
                mem_fraction_static=fraction, kv_cache_memory=a.kv_cache_memory,
            )
        except KVCacheMemoryTooLargeError as exc:
            limit = MemoryBudget(budget_bytes=free_after, total_bytes=total, free_before_load_bytes=free_before,
                                 free_after_load_bytes=free_after, mem_fraction_static=None,
                                 kv_cache_memory_bytes=free_after)
            raise exc.with_suggestions(suggest_kv_cache_memory(
                self.plan_request(layout, limit), free_after, kv_cache_memory=a.kv_cache_memory,
                host_total_bytes=total if self.device.type == "cpu" else None, host_memory=host_memory_bytes())) from None
        except WeightsLeaveNoRoomError as exc:
            empty = MemoryBudget(budget_bytes=0, total_bytes=total, free_before_load_bytes=free_before,
                                 free_after_load_bytes=free_after, mem_fraction_static=fraction, kv_cache_memory_bytes=None)
            raise exc.with_suggestions(self._suggestions(layout, self.plan_request(layout, empty), _safe(budget_for))) from None
        request = self.plan_request(layout, budget)
        try:
            plan = plan_pool_sizes(request)
        except DoesNotFitError as exc:
            fixes = exc.suggestions + self._suggestions(layout, request, _safe(budget_for) if fraction else None)
            raise exc.with_suggestions(fixes) from None
        return plan, request

    def _suggestions(self, layout: CacheLayout, request: PlanRequest, budget_for: Any) -> tuple[str, ...]:
        fp8 = None
        if self.kv_cache_dtype.bits > 8:
            fp8_dtype = KV_CACHE_DTYPES["fp8_e4m3"]
            try:
                fp8_draft = self.draft_layout.with_kv_dtype(fp8_dtype) if self.draft_layout else None
                fp8 = self.plan_request(self.layout(fp8_dtype), request.budget, fp8_draft)
            except ConfigError:  # no fp8 layout for this model (a DSA rank fp8's tiles do not divide): not a fix
                fp8 = None
        limit = request.budget.free_after_load_bytes if self.settings.kv_cache_memory is not None else None
        return suggest_fixes(request, budget_for_fraction=budget_for, kv_cache_memory_limit=limit, fp8_request=fp8,
                             fraction_for_limit=self.mem_fraction_static if self.device.type == "cpu" else None,
                             host_memory=host_memory_bytes() if self.device.type == "cpu" else None)

    def _configure_from_shared(self, layout: CacheLayout, shared: SharedTargetCache) -> KVCacheConfigResult:
        plan = shared.memory_pool_config
        for group in layout.kv_groups:
            try:
                pool_plan = plan.pool(group.name)
            except KeyError:
                raise ConfigError(
                    f"the target's plan has no pool {group.name!r} for this draft worker (it has "
                    f"{[p.name for p in plan.kv_pools]}): the target must be configured with this draft's layout"
                ) from None
            if pool_plan.bytes_per_token != group.bytes_per_token:
                raise ConfigError(
                    f"draft pool {group.name!r} costs {group.bytes_per_token} bytes/token but the target paid for "
                    f"{pool_plan.bytes_per_token}: target and draft were configured with different settings"
                )
        if layout.state is not None:
            raise ConfigError("a draft worker with recurrent-state layers cannot share the target's request table")
        pools = self._build(plan, layout, shared)
        self.memory_probe.note_allocation(pools.nbytes)
        return self._result(plan, pools, shared.req_to_token_pool, shared.token_to_kv_pool_allocator)

    def _result(self, plan: MemoryPoolConfig, pools: WorkerPools, req_pool: ReqToTokenPool, allocator: TokenAllocator) -> KVCacheConfigResult:
        return KVCacheConfigResult(
            memory_pool_config=plan, model_dtype=self.model_dtype, kv_cache_dtype=self.kv_cache_dtype,
            req_to_token_pool=req_pool, token_to_kv_pool=pools.token_to_kv_pool,
            token_to_kv_pool_allocator=allocator, state_pool=pools.state_pool, arena=pools.arena,
        )


def _capped(plan: MemoryPoolConfig, request: PlanRequest, max_tokens: int) -> MemoryPoolConfig:
    """The plan re-made for at most `max_tokens` tokens (the ranks' agreed count), or as it is."""
    if plan.max_total_num_tokens <= max_tokens:
        return plan
    return plan_pool_sizes(msgspec.structs.replace(request, max_total_tokens=max_tokens))


def _safe(budget_for: Any) -> Any:
    """A budget function that answers 0 where the weights would leave no room."""
    def wrapped(f: float) -> int:
        try:
            return budget_for(f)
        except DoesNotFitError:
            return 0
    return wrapped
