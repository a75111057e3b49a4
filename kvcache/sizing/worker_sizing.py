"""WorkerSizing: the one planning entry point. A worker's settings and the memory it sees in, its plan out.

Pure: no device, nothing allocated, no other rank asked. The configurator calls it (then builds
what it returns), `plan` calls it for every pipeline stage, and a sweep over cards calls it per
cell, so there is one road from numbers to a plan. What the ranks of one engine agree on is
`plan(memory, at_most_tokens=...)`: the same planning, capped at the smallest rank's tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import msgspec

from kvcache.errors import ConfigError, DoesNotFitError, KVCacheMemoryTooLargeError, WeightsLeaveNoRoomError
from kvcache.inputs.dtypes import KV_CACHE_DTYPES, DType, KVCacheDtype
from kvcache.inputs.parallel import ParallelState
from kvcache.inputs.sizing_settings import SizingSettings
from kvcache.inputs.speculative_defaults import default_max_running_requests
from kvcache.inputs.host_memory import host_memory_bytes
from kvcache.sizing.memory_budget import MemoryBudget, compute_budget, derive_mem_fraction_static
from kvcache.sizing.runtime_reserve import (RuntimeShape, default_chunked_prefill_size, default_mem_fraction_static,
                                          prefill_graph_token_cap)
from kvcache.models.model_config import ModelConfig
from kvcache.models.model_page_size import forced_page_size
from kvcache.sizing.advice import MORE_DEVICES, KeptFree, suggest_fixes, suggest_kv_cache_memory
from kvcache.sizing.reserve_knob_advice import reserve_knob_fixes
from kvcache.sizing.knob_search import fits, smallest_passing
from kvcache.sizing.engine_rules import EngineRules, MultimodalMemory
from kvcache.sizing.planning import max_total_tokens_fixes
from kvcache.sizing.plan_request import KVPoolDemand, PlanRequest
from kvcache.sizing.pool_config import MemoryPoolConfig
from kvcache.sizing.pool_layout import CacheLayout, worker_cache_layout
from kvcache.sizing.post_capture_eligibility import (
    PostCaptureEligibility, post_capture_eligibility, post_capture_reserve_mib,
)
from kvcache.sizing.state_slots import requested_state_slots, state_slots_per_request
from kvcache.sizing.worker_memory import WorkerMemory


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerSizing:
    """One worker's sizing questions: its pools, its mem_fraction_static, the planner's input, its plan."""

    settings: SizingSettings
    model_config: ModelConfig
    parallel_state: ParallelState
    model_dtype: DType
    kv_cache_dtype: KVCacheDtype
    device_type: str  # "cuda", "cpu" or "meta": CUDA graphs, post-capture resize and CPU advice depend on it
    engine: EngineRules  # the engine whose rules the plan follows (kvcache.engines holds them)
    layer_ids: range | None = None
    pool_name_prefix: str = ""
    draft_layout: CacheLayout | None = None  # a target with a draft pays for the draft's pools
    is_draft_worker: bool = False

    # ---- the entry point ---------------------------------------------------
    def plan(self, memory: WorkerMemory, *, at_most_tokens: int | None = None) -> MemoryPoolConfig:
        """The plan for this memory (at most `at_most_tokens` tokens: what the ranks agreed on); a DoesNotFitError
        carries values that would work, each checked by planning with it."""
        layout = self.layout()
        request = self._request(layout, memory)
        if at_most_tokens is not None and (request.max_total_tokens is None or at_most_tokens < request.max_total_tokens):
            request = msgspec.structs.replace(request, max_total_tokens=at_most_tokens)
        try:
            return self.engine.plan(request)
        except DoesNotFitError as exc:
            fraction = request.budget.mem_fraction_static
            more = self._suggestions(layout, request, self.budget_for(memory) if fraction else None, memory)
            if exc.suggestions:  # the planner named the value that works: more devices is no fix then
                more = tuple(s for s in more if s != MORE_DEVICES)
            raise exc.with_suggestions(exc.suggestions + more) from None

    def full_request_fixes(self, memory: WorkerMemory) -> tuple[str, ...]:
        """Where the engine runs a pool shorter than one full-context request (capping each request): values that
        would let one such request fit, each checked by planning with it (the fixes a refusal would name)."""
        layout = self.layout()
        request = self._request(layout, memory)
        fraction = request.budget.mem_fraction_static
        budget_for = self.budget_for(memory) if fraction else None
        return max_total_tokens_fixes(request) + self._suggestions(layout, request, budget_for, memory)

    def plan_or_none(self, memory: WorkerMemory) -> MemoryPoolConfig | None:
        """This worker's plan with this memory, or None where it does not plan (no advice searched)."""
        try:
            return self.engine.plan(self.plan_request(self.layout(), self.budget(memory)))
        except DoesNotFitError:
            return None

    # ---- the questions it answers -------------------------------------------
    def layout(self, kv_cache_dtype: KVCacheDtype | None = None) -> CacheLayout:
        """This worker's pools, from its layer specs."""
        return worker_cache_layout(
            model_config=self.model_config, parallel_state=self.parallel_state,
            kv_cache_dtype=kv_cache_dtype or self.kv_cache_dtype, model_dtype=self.model_dtype,
            mamba_ssm_dtype=self.settings.mamba_ssm_dtype, layer_ids=self.layer_ids, prefix=self.pool_name_prefix,
            window_pools=self.engine.window_pools(self.model_config, self.settings.hybrid_swa_memory).separate,
        )

    def mem_fraction_static(self, total_bytes: int) -> float:
        """The user's value, or SGLang's rule for a card of `total_bytes` (kvcache.sizing.runtime_reserve), cut
        for a multimodal model by the engine's rule (`multimodal()`). `total_bytes` is the card as SGLang reads
        it: nvidia-smi's total (WorkerMemory.device_capacity_bytes), not cudaMemGetInfo's."""
        if self.settings.mem_fraction_static is not None:
            return self.settings.mem_fraction_static
        return self.multimodal().cut_fraction(self.derived_fraction_before_multimodal_cut(total_bytes), total_bytes,
                                              post_capture=self.post_capture_resize().active)

    def derived_fraction_before_multimodal_cut(self, total_bytes: int) -> float:
        """SGLang's derived fraction for the card, before a multimodal cut (the report shows both)."""
        p = self.parallel_state
        if self.post_capture_resize().active:  # the resize trims the pools after capture (kvcache.runtime)
            return derive_mem_fraction_static(total_bytes, post_capture_reserve_mib(tp_size=p.tp_size, pp_size=p.pp_size))
        return default_mem_fraction_static(total_bytes, self.runtime_shape())

    def multimodal(self) -> MultimodalMemory:
        """What the engine keeps back for the model's multimodal side (off for text models and text-only serving)."""
        s = self.settings
        return self.engine.multimodal(self.model_config, enable_multimodal=s.enable_multimodal,
                                      language_model_only=s.language_model_only)

    def runtime_shape(self) -> RuntimeShape:
        """What the runtime reserve is sized for: graphs, prefill chunk, parallel sizes, MLA."""
        s, p = self.settings, self.parallel_state
        return RuntimeShape(
            cuda_graphs=self.device_type != "cpu" and not s.disable_cuda_graph,
            decode_cuda_graphs=not s.disable_decode_cuda_graph, decode_graph_cap_set=self.device_type != "cpu",
            chunked_prefill_size=s.chunked_prefill_size, cuda_graph_max_bs=s.cuda_graph_max_bs,
            tp_size=p.tp_size, pp_size=p.pp_size, attention_dp_size=p.attention_dp_size,
            uses_mla=any(g.spec.pool_kind == "mla" for g in self.layout().kv_groups),
            max_total_tokens=s.max_total_tokens, max_running_requests=s.max_running_requests,
            prefill_cuda_graphs=(self.multimodal().prefill_cuda_graphs and not s.disable_prefill_cuda_graph
                                 and not self.engine.no_prefill_graphs_reason(self.model_config)),
            prefill_graph_max_tokens=prefill_graph_token_cap(self.model_config.name),
        )

    def post_capture_resize(self) -> PostCaptureEligibility:
        """Whether this worker's pools are resized after CUDA-graph capture, and why (not)."""
        return post_capture_eligibility(
            server_args=self.settings, device_type=self.device_type, is_draft_worker=self.is_draft_worker,
            layout=self.layout(), kv_cache_dtype=self.kv_cache_dtype, multimodal_on=self.multimodal().on,
        )

    def budget(self, memory: WorkerMemory) -> MemoryBudget:
        """The KV budget for this memory (--kv-cache-memory, or the fraction of the card); raises when none."""
        s = self.settings
        return compute_budget(
            total_bytes=memory.total_bytes, free_before_load=memory.free_before_load,
            free_after_load=memory.free_after_load, reported_total_bytes=memory.reported_total_bytes,
            mem_fraction_static=None if s.kv_cache_memory is not None else self.mem_fraction_static(
                memory.device_capacity_bytes),
            kv_cache_memory=s.kv_cache_memory, reserved_bytes=self.multimodal().reserve_bytes,
        )

    def plan_request(self, layout: CacheLayout, budget: MemoryBudget, draft_layout: CacheLayout | None = None) -> PlanRequest:
        """The planner's input for this layout and budget (and the draft's pools, if any)."""
        a = self.settings
        context = self.model_config.context_length(a.context_length, allow_long_context=a.allow_long_context)
        default_chunk = None if self.device_type == "cpu" else default_chunked_prefill_size(budget.device_capacity_bytes)
        if (refusal := self.engine.startup_refusal(context, a, default_chunk)) is not None:
            raise ConfigError(refusal)
        draft = draft_layout or self.draft_layout
        demands = tuple(g.demand() for g in layout.kv_groups) + (self._draft_demands(layout, draft) if draft else ())
        state = None
        running = default_max_running_requests(a.max_running_requests, a.speculative_algorithm)
        if layout.state is not None:
            state = layout.state.demand(
                slots_per_request=state_slots_per_request(
                    architecture=self.model_config.architecture, disable_radix_cache=a.disable_radix_cache,
                    page_size=a.page_size, disable_overlap_schedule=a.disable_overlap_schedule),
                memory_ratio=a.mamba_full_memory_ratio,
                max_slots=requested_state_slots(max_mamba_cache_size=a.max_mamba_cache_size,
                                                disable_radix_cache=a.disable_radix_cache, max_running_requests=running,
                                                attention_dp_size=self.parallel_state.attention_dp_size),
            )
        return PlanRequest(
            budget=budget, page_size=a.page_size, context_length=context,
            req_to_token_row_width=self.engine.request_table_width(context, a), kv_pools=demands,
            swa_ratio=a.swa_full_tokens_ratio, state=state,
            max_total_tokens=a.max_total_tokens,
            max_running_requests=running,
            attention_dp_size=self.parallel_state.attention_dp_size, below_one_request=self.engine.below_one_request,
            minimums=self.engine.minimums,
        )

    # ---- internals -----------------------------------------------------------
    def _draft_demands(self, layout: CacheLayout, draft: CacheLayout) -> tuple[KVPoolDemand, ...]:
        """The draft's pools, each charged as the engine charges its budget for them (EngineRules'
        draft_charged_bytes_per_token: SGLang charges a STANDALONE draft at the target's bytes a layer)."""
        demands = tuple(g.demand() for g in draft.kv_groups)
        if len(layout.kv_groups) != 1 or len(demands) != 1 or layout.state is not None or draft.state is not None:
            return demands
        (target,), (pool,) = layout.kv_groups, demands
        charged = self.engine.draft_charged_bytes_per_token(
            target=(len(target.layer_ids), target.bytes_per_token), draft=(pool.num_layers, pool.bytes_per_token),
            kinds=(target.spec.pool_kind, pool.kind))
        return (msgspec.structs.replace(pool, charged_bytes_per_token=charged),) if charged is not None else demands

    def _request(self, layout: CacheLayout, memory: WorkerMemory) -> PlanRequest:
        """The planner's input; a budget that cannot be made is refused with values that would work."""
        try:
            return self.plan_request(layout, self.budget(memory))
        except KVCacheMemoryTooLargeError as exc:
            free = memory.free_after_load
            limit = MemoryBudget(budget_bytes=free, total_bytes=memory.total_bytes,
                                 free_before_load_bytes=memory.free_before_load, free_after_load_bytes=free,
                                 mem_fraction_static=None, kv_cache_memory_bytes=free,
                                 reported_total_bytes=memory.reported_total_bytes)
            raise exc.with_suggestions(suggest_kv_cache_memory(
                self.plan_request(layout, limit), free, kv_cache_memory=self.settings.kv_cache_memory,
                host_total_bytes=memory.total_bytes if self.device_type == "cpu" else None,
                host_memory=host_memory_bytes())) from None
        except WeightsLeaveNoRoomError as exc:
            empty = MemoryBudget(budget_bytes=0, total_bytes=memory.total_bytes,
                                 free_before_load_bytes=memory.free_before_load,
                                 free_after_load_bytes=memory.free_after_load,
                                 mem_fraction_static=self.mem_fraction_static(memory.device_capacity_bytes),
                                 kv_cache_memory_bytes=None, reported_total_bytes=memory.reported_total_bytes)
            raise exc.with_suggestions(self._suggestions(
                layout, self.plan_request(layout, empty), self.budget_for(memory), memory)) from None

    def budget_for(self, memory: WorkerMemory) -> Callable[[float], int]:
        """The budget a given mem_fraction_static would leave with this memory (0 where the weights leave none)."""
        reserved = self.multimodal().reserve_bytes

        def budget_for(fraction: float) -> int:
            try:
                return compute_budget(total_bytes=memory.total_bytes, free_before_load=memory.free_before_load,
                                      free_after_load=memory.free_after_load, mem_fraction_static=fraction,
                                      kv_cache_memory=None, reserved_bytes=reserved,
                                      reported_total_bytes=memory.reported_total_bytes).budget_bytes
            except DoesNotFitError:
                return 0
        return budget_for

    def _suggestions(self, layout: CacheLayout, request: PlanRequest, budget_for: Callable[[float], int] | None,
                     memory: WorkerMemory) -> tuple[str, ...]:
        fp8 = None
        if self.kv_cache_dtype.bits > 8:
            fp8_dtype = KV_CACHE_DTYPES["fp8_e4m3"]
            try:
                fp8_draft = self.draft_layout.with_kv_dtype(fp8_dtype) if self.draft_layout else None
                fp8 = self.plan_request(self.layout(fp8_dtype), request.budget, fp8_draft)
            except ConfigError:  # no fp8 layout for this model (a DSA rank fp8's tiles do not divide): not a fix
                fp8 = None
        on_cpu = self.device_type == "cpu"
        limit = request.budget.free_after_load_bytes if self.settings.kv_cache_memory is not None else None
        by_default = replace(self, settings=self.settings.replace(mem_fraction_static=None))
        kept_free = KeptFree(free_before_load=request.budget.free_before_load_bytes,
                             default_fraction=by_default.mem_fraction_static(request.budget.device_capacity_bytes),
                             cuda_graphs=not on_cpu)
        fixes = suggest_fixes(request, budget_for_fraction=budget_for, kv_cache_memory_limit=limit, fp8_request=fp8,
                              fraction_for_limit=self.mem_fraction_static if on_cpu else None,
                              host_memory=host_memory_bytes() if on_cpu else None, kept_free=kept_free)
        first = (*reserve_knob_fixes(self, memory), *filter(None, (self._page_size_fix(request),)))
        return (*first, *(f for f in fixes if f != MORE_DEVICES)) if first else fixes

    def _page_size_fix(self, request: PlanRequest) -> str | None:
        """The largest power of two below --page-size that plans with everything else unchanged (by bisection over
        the exponents: at most log2(page) plans), where the page is the user's to change; else None."""
        page = self.settings.page_size
        if page == 1 or forced_page_size(self.model_config) is not None:
            return None
        top = (page - 1).bit_length() - 1  # 2**top is the largest power of two below page

        def fits_from_top(k: int) -> bool:  # counts exponents down from the top: "false then true"
            smaller = replace(self, settings=self.settings.replace(page_size=1 << (top + 1 - k)))
            try:  # a page the engine refuses at start-up (one a given --chunked-prefill-size is no multiple of)
                return fits(smaller.plan_request(smaller.layout(), request.budget))
            except ConfigError:  # is no fix; the size returned is always one that planned
                return False

        k = smallest_passing(1, top + 1, fits_from_top)
        return None if k is None else f"--page-size {1 << (top + 1 - k)} (the largest power of two that fits)"
